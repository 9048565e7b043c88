package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// runRecord is everything a run shows: the summary on screen, and the HTML
// report with its charts and the full log.
type runRecord struct {
	cfg     Config
	started time.Time
	took    time.Duration
	// journey names the stores ("memcached to sharded Redis"), policy the
	// API's policy in ParsePolicy's notation.
	journey, policy string
	legs            []legRecord
	// notes says what did not run and why.
	notes   []string
	verdict Verdict
	// log is the full log: what -v prints.
	log bytes.Buffer
	// reportPath and logPath are where save writes.
	reportPath, logPath string
}

// legRecord is one leg of a run: a mode, the rolling deploy, or the
// stalled Redis group.
type legRecord struct {
	// key is a short name ("mirror", "split", "deploy", "stall"), name the leg's
	// name in the verdict.
	key, name string
	verdict   ModeVerdict
	phases    []phaseResult
	// timeline counts the leg's responses per second.
	timeline []timeBucket
	// sides names the old and the new side's stores.
	sides [2]string
	// evidence holds the first responses that broke an invariant.
	evidence []string
	// note says what the leg does, when the verdict does not.
	note string
}

// save writes the HTML report and the full log, creating their directory.
func (r *runRecord) save() error {
	if err := os.MkdirAll(filepath.Dir(r.reportPath), 0o755); err != nil {
		return err
	}
	page, err := renderReport(r)
	if err != nil {
		return err
	}
	return errors.Join(os.WriteFile(r.reportPath, page, 0o644), os.WriteFile(r.logPath, r.log.Bytes(), 0o644))
}

// summaryHeader is the header of the summary's table, on screen and in the
// report.
var summaryHeader = []string{"leg", "phase", "new (target)", "responses", "allowed", "denied", "moved",
	"reset changes", "double grants", "contradicting", "degraded", "errors", "p50", "p99"}

// summaryRows returns the summary's table, one row per phase of every leg,
// as the screen and the report both show it.
func summaryRows(r *runRecord) [][]string {
	var rows [][]string
	for _, leg := range r.legs {
		for _, p := range leg.phases {
			all := p.totals.all()
			rows = append(rows, []string{leg.key, phaseLabel(leg, p), shareCell(p), fmtInt(all.requests),
				fmtInt(all.allowed), fmtInt(all.denied), fmtInt(all.moved), fmtInt(all.resetChanges),
				fmtInt(all.doubleGrants), fmtInt(all.contradictions), fmtInt(all.degraded), fmtInt(p.totals.errors),
				fmtMillis(p.p50), fmtMillis(p.p99)})
		}
	}
	return rows
}

// phaseLabel names a phase: "1 warm-up", "3 10%", "1 14 stalls".
func phaseLabel(leg legRecord, p phaseResult) string {
	n := strconv.Itoa(p.index + 1)
	switch {
	case p.name != "":
		return n + " " + p.name
	case p.warmUp:
		return n + " warm-up"
	case leg.key == "stall":
		return fmt.Sprintf("%s %d stalls", n, p.stalls)
	}
	return fmt.Sprintf("%s %d%%", n, p.target)
}

// shareCell is the measured share of identifiers on the new side, and the
// target.
func shareCell(p phaseResult) string {
	target := strconv.Itoa(p.target) + "%"
	if p.warmUp {
		target = "0%"
	}
	return fmt.Sprintf("%.1f%% (%s)", p.newShare(), target)
}

// legLine is a leg's line in the summary: PASS with its figures, or FAIL
// with what broke.
func legLine(leg legRecord) string {
	v := leg.verdict
	if !v.Pass {
		return v.Line
	}
	var total sideCounts
	for _, p := range leg.phases {
		total.add(p.totals.all())
	}
	s := fmt.Sprintf("%s: PASS · %s responses, %s moves (%s checked in an open window), 0 ResetAt changes, "+
		"0 double grants, 0 contradicting", leg.name, fmtInt(total.requests), fmtInt(total.moved), fmtInt(total.checked))
	if leg.key == deployLegKey {
		return v.Line // the policy and the overlap, beside the figures
	}
	if leg.key == "stall" && len(leg.phases) == 1 {
		p := leg.phases[0]
		s = fmt.Sprintf("%s: PASS · %d stalls of %s, %s responses, %s degraded (marked), 0 contradicting, "+
			"0 ResetAt changes, 0 double grants", leg.name, p.stalls, stallBurst, fmtInt(total.requests),
			fmtInt(total.degraded))
	}
	return s
}

// maxScreenEvidence bounds the examples of broken invariants the summary
// shows; the report has them all.
const maxScreenEvidence = 3

// writeScreenSummary prints the run's end: the verdict first, a line per
// leg, one row per phase, and where the report and the log are. saveErr
// is the report's failure to be written, if any.
func writeScreenSummary(w io.Writer, r *runRecord, saveErr error) {
	fmt.Fprintln(w)
	fmt.Fprintln(w, r.verdict.Line)
	for _, leg := range r.legs {
		fmt.Fprintln(w, "  "+legLine(leg))
	}
	for _, n := range r.notes {
		fmt.Fprintln(w, "  "+n)
	}
	// One example of each broken invariant, the rarest kinds first.
	shown := 0
	for _, kind := range []string{contradictingKind, "ResetAt change", "double grant", "denial claiming quota"} {
		if shown == maxScreenEvidence {
			break
		}
	legs:
		for _, leg := range r.legs {
			for _, e := range leg.evidence {
				if _, msg, ok := strings.Cut(e, "× "); ok && strings.HasPrefix(msg, kind+": ") {
					if shown == 0 {
						fmt.Fprintln(w, "  first evidence (more in the report):")
					}
					fmt.Fprintf(w, "    %s: %s\n", leg.key, e)
					shown++
					break legs
				}
			}
		}
	}
	fmt.Fprintln(w)
	var t table
	t.row(summaryHeader...)
	for _, row := range summaryRows(r) {
		t.row(row...)
	}
	t.write(w, "  ")
	fmt.Fprintln(w)
	fmt.Fprintf(w, "run time %.1f s · policy %q · %s\n", r.took.Seconds(), r.policy, r.journey)
	switch {
	case r.reportPath == "":
	case saveErr != nil:
		fmt.Fprintf(w, "report: not written: %v\n", saveErr)
	default:
		fmt.Fprintf(w, "report: %s (open it in a browser); full log: %s\n", r.reportPath, r.logPath)
	}
}
