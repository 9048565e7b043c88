package main

import (
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/throttlekit/throttlekit/rollout"
)

// phaseResult is one finished phase of the ramp.
type phaseResult struct {
	index, count int
	// target is the percentage on the new backend the flag source gave at
	// the phase's end; seen lists every percentage it gave during the
	// phase, in order (more than one only when Unleash changed mid-phase).
	target int
	seen   []int
	// source is "static" or "unleash".
	source   string
	duration time.Duration
	totals   phaseTotals
	// stats is the rollout's counters over the phase.
	stats rollout.Stats
	// interrupted marks a phase a signal cut short.
	interrupted bool
}

// newShare returns the measured percentage of identifiers on the new side.
func (p phaseResult) newShare() float64 {
	if p.totals.active == 0 {
		return 0
	}
	return 100 * float64(p.totals.ids[rollout.SideNew]) / float64(p.totals.active)
}

// mismatches are the rollout's own comparisons that failed: mirror
// shortfalls (the other store could not take all the units) and shadow
// mismatches.
func (p phaseResult) mismatches() uint64 {
	return p.stats.MirrorShortfalls + p.stats.ShadowMismatches
}

// statsDelta returns the counters accumulated between two snapshots.
func statsDelta(after, before rollout.Stats) rollout.Stats {
	return rollout.Stats{
		DefaultRouted:        after.DefaultRouted - before.DefaultRouted,
		Mirrored:             after.Mirrored - before.Mirrored,
		MirrorShortfalls:     after.MirrorShortfalls - before.MirrorShortfalls,
		MirrorShortfallUnits: after.MirrorShortfallUnits - before.MirrorShortfallUnits,
		SecondaryErrors:      after.SecondaryErrors - before.SecondaryErrors,
		ShadowCompared:       after.ShadowCompared - before.ShadowCompared,
		ShadowMismatches:     after.ShadowMismatches - before.ShadowMismatches,
		AllowedDenied:        after.AllowedDenied - before.AllowedDenied,
		DeniedAllowed:        after.DeniedAllowed - before.DeniedAllowed,
		RemainingDiffers:     after.RemainingDiffers - before.RemainingDiffers,
		ResetDiffers:         after.ResetDiffers - before.ResetDiffers,
	}
}

// reportNames are the names the tables give the two sides.
type reportNames struct {
	sides [2]string
	mode  rollout.Mode
}

// writePhase prints one phase's table.
func writePhase(w io.Writer, p phaseResult, names reportNames) {
	all := p.totals.all()
	secs := p.duration.Seconds()
	cut := ""
	if p.interrupted {
		cut = " (interrupted)"
	}
	fmt.Fprintf(w, "\nphase %d/%d%s: %s · %.1f s · %s responses (%s/s)\n", p.index+1, p.count, cut,
		describeTarget(p), secs, fmtInt(all.requests), fmtInt(int64(perSecond(all.requests, p.duration))))

	var t table
	t.row("backend", "ids", "share", "target", "allowed", "denied", "moved in", "checked", "restarts",
		"wobble", "429+quota", "degraded", "errors")
	targets := [2]float64{100 - float64(p.target), float64(p.target)}
	for side := range 2 {
		s := p.totals.sides[side]
		t.row(rollout.Side(side).String()+" "+names.sides[side], strconv.Itoa(p.totals.ids[side]),
			share(p.totals.ids[side], p.totals.active), fmt.Sprintf("%.1f%%", targets[side]),
			fmtInt(s.allowed), fmtInt(s.denied), fmtInt(s.moved), fmtInt(s.checked), fmtInt(s.restarts),
			fmtInt(s.wobble), fmtInt(s.quotaClaims), fmtInt(s.degraded), "")
		if side == int(rollout.SideNew) {
			for _, store := range sortedKeys(p.totals.stores) {
				if strings.Contains(store, "/") {
					n := p.totals.stores[store]
					t.row("  "+store, strconv.Itoa(n), share(n, p.totals.active))
				}
			}
		}
	}
	t.row("all", strconv.Itoa(p.totals.active), share(p.totals.active, p.totals.active), "",
		fmtInt(all.allowed), fmtInt(all.denied), fmtInt(all.moved), fmtInt(all.checked), fmtInt(all.restarts),
		fmtInt(all.wobble), fmtInt(all.quotaClaims), fmtInt(all.degraded), fmtInt(p.totals.errors))
	t.write(w, "  ")
	fmt.Fprintf(w, "  rollout %s: %s\n", names.mode, describeStats(p.stats, names.mode))
}

// describeTarget says what the flag source asked for during the phase.
func describeTarget(p phaseResult) string {
	s := fmt.Sprintf("%d%% on new (%s)", p.target, p.source)
	if p.source == "unleash" {
		s = fmt.Sprintf("Unleash says %d%% on new", p.target)
	}
	if len(p.seen) > 1 {
		parts := make([]string, len(p.seen))
		for i, v := range p.seen {
			parts[i] = strconv.Itoa(v) + "%"
		}
		s += ", changed during the phase: " + strings.Join(parts, " → ")
	}
	return s
}

// describeStats prints the rollout counters the mode produces.
func describeStats(s rollout.Stats, mode rollout.Mode) string {
	switch mode {
	case rollout.MirrorMode:
		return fmt.Sprintf("%s decisions mirrored to the other store · %s shortfalls (%s units) · %s secondary errors",
			fmtUint(s.Mirrored), fmtUint(s.MirrorShortfalls), fmtUint(s.MirrorShortfallUnits), fmtUint(s.SecondaryErrors))
	case rollout.ShadowMode:
		return fmt.Sprintf("%s decisions compared · %s mismatches (allowed/denied %s, denied/allowed %s, remaining %s, reset %s) · %s secondary errors",
			fmtUint(s.ShadowCompared), fmtUint(s.ShadowMismatches), fmtUint(s.AllowedDenied), fmtUint(s.DeniedAllowed),
			fmtUint(s.RemainingDiffers), fmtUint(s.ResetDiffers), fmtUint(s.SecondaryErrors))
	}
	return "no comparisons in split mode (each identifier's requests go to one store only)"
}

// writeSummary prints one row per phase.
func writeSummary(w io.Writer, results []phaseResult) {
	fmt.Fprintf(w, "\nsummary\n")
	var t table
	t.row("phase", "target", "on new", "allowed", "denied", "mismatches", "moved", "checked", "restarts",
		"wobble", "429+quota", "degraded", "errors")
	for _, p := range results {
		all := p.totals.all()
		t.row(fmt.Sprintf("%d/%d", p.index+1, p.count), fmt.Sprintf("%d%%", p.target),
			fmt.Sprintf("%.1f%%", p.newShare()), fmtInt(all.allowed), fmtInt(all.denied), fmtUint(p.mismatches()),
			fmtInt(all.moved), fmtInt(all.checked), fmtInt(all.restarts), fmtInt(all.wobble), fmtInt(all.quotaClaims),
			fmtInt(all.degraded), fmtInt(p.totals.errors))
	}
	t.write(w, "  ")
}

// Verdict is the outcome of a run.
type Verdict struct {
	// Pass reports that every invariant held.
	Pass bool
	// Failures names each broken invariant with the phases it broke in.
	Failures []string
	// Line is the VERDICT line.
	Line string
}

// judgeRun checks every invariant over the phases run; planned is the
// number of phases the ramp has, interrupted says why the run stopped
// early (empty when it did not).
func judgeRun(results []phaseResult, cfg Config, clients, abusive, planned int, interrupted string) Verdict {
	var failures []string
	broken := map[string][]string{}
	var order []string
	fail := func(invariant, detail string) {
		if _, ok := broken[invariant]; !ok {
			order = append(order, invariant)
		}
		broken[invariant] = append(broken[invariant], detail)
	}
	var total sideCounts
	var errs int64
	for _, p := range results {
		all := p.totals.all()
		total.add(all)
		errs += p.totals.errors
		ph := fmt.Sprintf("phase %d", p.index+1)
		if all.wobble > 0 {
			fail("X-RateLimit-Reset wobble", fmt.Sprintf("%s: %d", ph, all.wobble))
		}
		if all.quotaClaims > 0 {
			fail("denials claiming quota", fmt.Sprintf("%s: %d", ph, all.quotaClaims))
		}
		if all.restarts > 0 {
			fail("windows restarted on move", fmt.Sprintf("%s: %d of %d moves", ph, all.restarts, all.moved))
		}
		if got := p.newShare(); p.totals.active == 0 || math.Abs(got-float64(p.target)) > cfg.Tolerance {
			fail("share on new backend", fmt.Sprintf("%s: %.1f%%, target %d%% ± %g", ph, got, p.target, cfg.Tolerance))
		}
		if all.allowed == 0 || all.denied == 0 {
			fail("allowed and denied in every phase", fmt.Sprintf("%s: %d allowed, %d denied", ph, all.allowed, all.denied))
		}
		if all.degraded > 0 {
			fail("no degraded responses", fmt.Sprintf("%s: %d", ph, all.degraded))
		}
		if p.totals.errors > 0 {
			fail("no failed requests", fmt.Sprintf("%s: %d", ph, p.totals.errors))
		}
		// Mirror mode keeps both stores counting; a shortfall or a failed
		// write on the other store is a window that would restart on the
		// next move, whether or not a client happened to check it.
		if cfg.Mode == rollout.MirrorMode && (p.stats.MirrorShortfalls > 0 || p.stats.SecondaryErrors > 0) {
			fail("mirror kept both stores counting", fmt.Sprintf("%s: %d shortfalls, %d secondary errors",
				ph, p.stats.MirrorShortfalls, p.stats.SecondaryErrors))
		}
	}
	if total.moved > 0 && total.checked == 0 {
		fail("restart check exercised", fmt.Sprintf("%d moves, none within an open window", total.moved))
	}
	if interrupted != "" {
		fail("complete run", fmt.Sprintf("%s after %d of %d phases", interrupted, len(results), planned))
	} else if len(results) < planned {
		fail("complete run", fmt.Sprintf("%d of %d phases", len(results), planned))
	}
	for _, inv := range order {
		failures = append(failures, inv+" ("+strings.Join(broken[inv], ", ")+")")
	}
	if len(failures) > 0 {
		return Verdict{Failures: failures, Line: "VERDICT: FAIL: " + strings.Join(failures, "; ")}
	}
	targets := make([]string, len(results))
	for i, p := range results {
		targets[i] = strconv.Itoa(p.target) + "%"
	}
	line := fmt.Sprintf("VERDICT: PASS (%d phases, %s responses from %d clients, %d abusive: "+
		"0 Reset wobble, 0 denials claiming quota, 0 restarts on %s moves (%s checked in an open window), "+
		"share on new within %g points of %s, allowed and denied in every phase, 0 degraded, 0 failed%s)",
		len(results), fmtInt(total.requests), clients, abusive, fmtInt(total.moved), fmtInt(total.checked),
		cfg.Tolerance, strings.Join(targets, " → "), mirrorClause(cfg.Mode))
	return Verdict{Pass: true, Line: line}
}

// mirrorClause is the verdict's words on mirroring, in mirror mode.
func mirrorClause(m rollout.Mode) string {
	if m == rollout.MirrorMode {
		return ", 0 mirror shortfalls or secondary errors"
	}
	return ""
}

// progressLine is the one-line state of the phase under way.
func progressLine(index, count, target int, elapsed time.Duration, t phaseTotals, rate float64) string {
	all := t.all()
	return fmt.Sprintf("  [%d/%d %3d%%] %5.1fs %5.0f req/s · allowed %s · denied %s · ids on new %d/%d · "+
		"moved %d · restarts %d · wobble %d · 429+quota %d · degraded %d · errors %d",
		index+1, count, target, elapsed.Seconds(), rate, fmtInt(all.allowed), fmtInt(all.denied),
		t.ids[rollout.SideNew], t.active, all.moved, all.restarts, all.wobble, all.quotaClaims, all.degraded, t.errors)
}

// table prints rows with aligned columns: the first left-aligned, the
// others right-aligned.
type table struct{ rows [][]string }

func (t *table) row(cells ...string) { t.rows = append(t.rows, cells) }

func (t *table) write(w io.Writer, indent string) {
	var widths []int
	for _, r := range t.rows {
		for i, c := range r {
			if i >= len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], len([]rune(c)))
		}
	}
	for _, r := range t.rows {
		var b strings.Builder
		b.WriteString(indent)
		for i, c := range r {
			pad := strings.Repeat(" ", widths[i]-len([]rune(c)))
			if i == 0 {
				b.WriteString(c + pad)
				continue
			}
			b.WriteString("  " + pad + c)
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}

// fmtInt writes n with thousands separators: 12,345.
func fmtInt(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if neg {
		s = "-" + s
	}
	return s
}

func fmtUint(n uint64) string {
	if n > math.MaxInt64 {
		return strconv.FormatUint(n, 10)
	}
	return fmtInt(int64(n))
}

func share(part, whole int) string {
	if whole == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(part)/float64(whole))
}

func perSecond(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

func sortedKeys(m map[string]int) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
