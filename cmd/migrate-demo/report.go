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

// phaseResult is one finished phase: the warm-up or a step of the ramp.
type phaseResult struct {
	index, count int
	// name names a phase of the rolling deploy ("overlap"), about says
	// what it does; both empty in the other legs.
	name, about string
	// warmUp marks the phase before the deploy: the old store alone,
	// through a plain throttler and the hand-written limiter.
	warmUp bool
	// target is the percentage on the new backend the flag source gave at
	// the phase's end; seen lists every percentage it gave during the
	// phase, in order (more than one only when Unleash changed mid-phase).
	target int
	seen   []int
	// source is "static" or "unleash".
	source string
	// start is when the phase began, from the load's start (the
	// timeline's origin); duration how long it lasted.
	start    time.Duration
	duration time.Duration
	totals   phaseTotals
	// p50 and p99 are the median and 99th percentile of the time
	// clients waited for a response in the phase.
	p50, p99 time.Duration
	// stalls counts the SIGSTOP bursts of the stalled Redis group's
	// phase; stalled is their total length.
	stalls  int
	stalled time.Duration
	// stats is the rollout's counters over the phase; legacy the counters
	// of the rollout that carries the hand-written limiter's windows into
	// the old store (zero without legacy clients).
	stats  rollout.Stats
	legacy rollout.Stats
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
// shortfalls (the other store could not take all the units, when it
// replays instead of taking states) and shadow mismatches.
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
		MirrorDiverged:       after.MirrorDiverged - before.MirrorDiverged,
		SeedChecks:           after.SeedChecks - before.SeedChecks,
		Seeded:               after.Seeded - before.Seeded,
		SeedUnsupported:      after.SeedUnsupported - before.SeedUnsupported,
	}
}

// reportNames are the names the tables give the two sides.
type reportNames struct {
	sides [2]string
	mode  rollout.Mode
	// seeding says whether split mode seeds; legacy whether some clients
	// started on the hand-written limiter.
	seeding, legacy bool
	// plain, when set, replaces the rollout's counters under each table:
	// a leg without a rollout.
	plain string
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
	t.row("backend", "ids", "share", "target", "allowed", "denied", "moved in", "checked", "reset changes",
		"double grants", "contradicting", "429+quota", "degraded", "errors")
	targets := [2]float64{100 - float64(p.target), float64(p.target)}
	for side := range 2 {
		s := p.totals.sides[side]
		t.row(rollout.Side(side).String()+" "+names.sides[side], strconv.Itoa(p.totals.ids[side]),
			share(p.totals.ids[side], p.totals.active), fmt.Sprintf("%.1f%%", targets[side]),
			fmtInt(s.allowed), fmtInt(s.denied), fmtInt(s.moved), fmtInt(s.checked), fmtInt(s.resetChanges),
			fmtInt(s.doubleGrants), fmtInt(s.contradictions), fmtInt(s.quotaClaims), fmtInt(s.degraded), "")
		// The stores of the side: the shards of the new one, the legacy
		// limiter beside the old one.
		var stores []string
		for _, store := range sortedKeys(p.totals.stores) {
			if p.totals.storeSides[store] == rollout.Side(side) {
				stores = append(stores, store)
			}
		}
		if len(stores) > 1 || len(stores) == 1 && strings.Contains(stores[0], "/") {
			for _, store := range stores {
				n := p.totals.stores[store]
				t.row("  "+store, strconv.Itoa(n), share(n, p.totals.active))
			}
		}
	}
	t.row("all", strconv.Itoa(p.totals.active), share(p.totals.active, p.totals.active), "",
		fmtInt(all.allowed), fmtInt(all.denied), fmtInt(all.moved), fmtInt(all.checked), fmtInt(all.resetChanges),
		fmtInt(all.doubleGrants), fmtInt(all.contradictions), fmtInt(all.quotaClaims), fmtInt(all.degraded),
		fmtInt(p.totals.errors))
	t.write(w, "  ")
	fmt.Fprintf(w, "  latency p50 %s, p99 %s\n", fmtMillis(p.p50), fmtMillis(p.p99))
	if p.warmUp {
		line := "  no rollout yet: a plain throttler over the old store"
		if names.legacy {
			line += ", and the hand-written limiter for the legacy clients"
		}
		fmt.Fprintln(w, line)
		return
	}
	if names.plain != "" {
		fmt.Fprintln(w, "  "+names.plain)
		return
	}
	fmt.Fprintf(w, "  rollout %s: %s\n", names.mode, describeStats(p.stats, names))
	if lg := p.legacy; names.legacy && lg.SeedChecks+lg.SecondaryErrors+lg.SeedUnsupported > 0 {
		fmt.Fprintf(w, "  legacy counters: %s identifiers looked up, %s windows carried into the old store · %s errors\n",
			fmtUint(lg.SeedChecks), fmtUint(lg.Seeded), fmtUint(lg.SecondaryErrors+lg.SeedUnsupported))
	}
}

// describeTarget says what the flag source asked for during the phase.
func describeTarget(p phaseResult) string {
	if p.about != "" {
		return p.about
	}
	if p.warmUp {
		return "warm-up on the old store alone, before the deploy"
	}
	if p.source == "stalled" {
		return "the Redis groups alone, one group's primary stopped in bursts"
	}
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
func describeStats(s rollout.Stats, names reportNames) string {
	switch names.mode {
	case rollout.MirrorMode:
		line := fmt.Sprintf("%s decisions written to the other store, %s finding it apart (0 once the stores have converged) · "+
			"%s secondary errors", fmtUint(s.Mirrored), fmtUint(s.MirrorDiverged), fmtUint(s.SecondaryErrors))
		if s.MirrorShortfalls > 0 {
			line += fmt.Sprintf(" · %s shortfalls (%s units) replaying on a store that cannot take states",
				fmtUint(s.MirrorShortfalls), fmtUint(s.MirrorShortfallUnits))
		}
		return line
	case rollout.ShadowMode:
		return fmt.Sprintf("%s decisions compared · %s mismatches (allowed/denied %s, denied/allowed %s, remaining %s, reset %s) · %s secondary errors",
			fmtUint(s.ShadowCompared), fmtUint(s.ShadowMismatches), fmtUint(s.AllowedDenied), fmtUint(s.DeniedAllowed),
			fmtUint(s.RemainingDiffers), fmtUint(s.ResetDiffers), fmtUint(s.SecondaryErrors))
	}
	if !names.seeding {
		return "seeding off: a moved identifier starts afresh on its new store"
	}
	return fmt.Sprintf("%s identifiers looked up on the other store, %s seeded from it · %s unsupported · %s read errors",
		fmtUint(s.SeedChecks), fmtUint(s.Seeded), fmtUint(s.SeedUnsupported), fmtUint(s.SecondaryErrors))
}

// writeSummary prints one row per phase.
func writeSummary(w io.Writer, mode rollout.Mode, results []phaseResult) {
	fmt.Fprintf(w, "\nsummary, %s mode\n", mode)
	var t table
	t.row("phase", "target", "on new", "allowed", "denied", "moved", "checked", "reset changes", "double grants",
		"contradicting", "429+quota", "mismatches", "degraded", "errors", "p50", "p99")
	for _, p := range results {
		all := p.totals.all()
		target := fmt.Sprintf("%d%%", p.target)
		if p.warmUp {
			target = "warm-up"
		}
		t.row(fmt.Sprintf("%d/%d", p.index+1, p.count), target, fmt.Sprintf("%.1f%%", p.newShare()),
			fmtInt(all.allowed), fmtInt(all.denied), fmtInt(all.moved), fmtInt(all.checked), fmtInt(all.resetChanges),
			fmtInt(all.doubleGrants), fmtInt(all.contradictions), fmtInt(all.quotaClaims), fmtUint(p.mismatches()),
			fmtInt(all.degraded), fmtInt(p.totals.errors), fmtMillis(p.p50), fmtMillis(p.p99))
	}
	t.write(w, "  ")
}

// Verdict is the outcome of a run: every mode's, and overall.
type Verdict struct {
	// Pass reports that every invariant held in every mode.
	Pass bool
	// Failures names each broken invariant, with its mode and the phases
	// it broke in.
	Failures []string
	// Line is the VERDICT line.
	Line string
	// Modes holds each mode's verdict, in the order run.
	Modes []ModeVerdict
}

// ModeVerdict is the outcome of one leg of the run: a mode, the rolling
// deploy or the stalled Redis group.
type ModeVerdict struct {
	// Mode is the rollout mode run; zero for the other legs.
	Mode rollout.Mode
	// Leg names the leg, as "mirror mode" or "stalled Redis group".
	Leg string
	// Pass reports that every invariant held.
	Pass bool
	// Failures names each broken invariant with the phases it broke in.
	Failures []string
	// Line is the mode's verdict line, "mirror mode: PASS (...)".
	Line string
	// requests, moves and checked are the run's figures, for the overall
	// line.
	requests, moves, checked int64
}

// name returns the leg's name.
func (v ModeVerdict) name() string {
	if v.Leg != "" {
		return v.Leg
	}
	return v.Mode.String() + " mode"
}

// modeRun is what judgeMode needs beyond the phases: the run's shape.
type modeRun struct {
	mode rollout.Mode
	// clients, abusive and legacy count the clients of each kind.
	clients, abusive, legacy int
	// planned is the number of phases, warm-up included; interrupted says
	// why the run stopped early (empty when it did not).
	planned     int
	interrupted string
}

// breaches collects the invariants a leg broke, in the order first broken,
// with what broke each.
type breaches struct {
	order   []string
	details map[string][]string
}

// fail records that detail broke invariant.
func (b *breaches) fail(invariant, detail string) {
	if b.details == nil {
		b.details = map[string][]string{}
	}
	if _, ok := b.details[invariant]; !ok {
		b.order = append(b.order, invariant)
	}
	b.details[invariant] = append(b.details[invariant], detail)
}

// failures says each broken invariant once, with its details:
// "invariant (detail, detail)".
func (b *breaches) failures() []string {
	var out []string
	for _, inv := range b.order {
		out = append(out, inv+" ("+strings.Join(b.details[inv], ", ")+")")
	}
	return out
}

// judgeMode checks every invariant over one mode's phases.
func judgeMode(results []phaseResult, cfg Config, run modeRun) ModeVerdict {
	var broken breaches
	fail := broken.fail
	var total sideCounts
	var carried uint64
	for _, p := range results {
		all := p.totals.all()
		total.add(all)
		carried += p.legacy.Seeded
		ph := fmt.Sprintf("phase %d", p.index+1)
		if all.resetChanges > 0 {
			fail("no ResetAt change", fmt.Sprintf("%s: %d, with %d moves", ph, all.resetChanges, all.moved))
		}
		if all.doubleGrants > 0 {
			fail("no double grant", fmt.Sprintf("%s: %d", ph, all.doubleGrants))
		}
		if all.contradictions > 0 {
			fail("no result contradicting the store", fmt.Sprintf("%s: %d", ph, all.contradictions))
		}
		if all.quotaClaims > 0 {
			fail("no denial claiming quota", fmt.Sprintf("%s: %d", ph, all.quotaClaims))
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
		st := p.stats
		switch {
		case run.mode == rollout.MirrorMode && (st.MirrorShortfalls > 0 || st.SecondaryErrors > 0):
			// A shortfall or a failed write on the other store is a window
			// that would restart on the next move, checked by a client or
			// not.
			fail("mirror kept both stores alike", fmt.Sprintf("%s: %d shortfalls, %d secondary errors",
				ph, st.MirrorShortfalls, st.SecondaryErrors))
		case run.mode == rollout.SplitMode && cfg.Seeding && (st.SeedUnsupported > 0 || st.SecondaryErrors > 0):
			fail("split mode seeded every move", fmt.Sprintf("%s: %d lookups the serving store could not take, %d failed reads",
				ph, st.SeedUnsupported, st.SecondaryErrors))
		}
		// Mirroring begins at the deploy, with the new store empty: the
		// first mirrored write of each identifier finds it apart, and
		// after that none should (item 2 of issue 20: the stores converge
		// whenever mirroring began). A client sends one request at a
		// time, so a phase may see at most one such write per identifier
		// not yet mirrored when it began (on a busy machine some clients
		// make no request in the rollout's first phase).
		if run.mode == rollout.MirrorMode && !p.warmUp && p.index > 1 && st.MirrorDiverged > uint64(p.totals.unmirrored) {
			fail("mirror converged after each identifier's first write", fmt.Sprintf("%s: %d writes found the other store apart, %d identifiers not mirrored before",
				ph, st.MirrorDiverged, p.totals.unmirrored))
		}
		if lg := p.legacy; lg.SeedUnsupported > 0 || lg.SecondaryErrors > 0 {
			fail("legacy counters carried over", fmt.Sprintf("%s: %d the old store could not take, %d failed reads",
				ph, lg.SeedUnsupported, lg.SecondaryErrors))
		}
	}
	if total.moved > 0 && total.checked == 0 {
		fail("moves checked", fmt.Sprintf("%d moves, none within an open window", total.moved))
	}
	if run.legacy > 0 && len(results) > 1 && carried == 0 {
		fail("legacy counters carried over", fmt.Sprintf("%d clients started on the hand-written limiter, no window was carried", run.legacy))
	}
	if run.interrupted != "" {
		fail("complete run", fmt.Sprintf("%s after %d of %d phases", run.interrupted, len(results), run.planned))
	} else if len(results) < run.planned {
		fail("complete run", fmt.Sprintf("%d of %d phases", len(results), run.planned))
	}
	v := ModeVerdict{Mode: run.mode, Leg: run.mode.String() + " mode", requests: total.requests, moves: total.moved,
		checked: total.checked}
	v.Failures = broken.failures()
	if len(v.Failures) > 0 {
		v.Line = fmt.Sprintf("%s mode: FAIL: %s", run.mode, strings.Join(v.Failures, "; "))
		return v
	}
	targets := []string{"warm-up"}
	for _, p := range results {
		if !p.warmUp {
			targets = append(targets, strconv.Itoa(p.target)+"%")
		}
	}
	legacy := ""
	if run.legacy > 0 {
		legacy = fmt.Sprintf(", %d on the hand-written limiter first (%s legacy windows carried over)", run.legacy, fmtUint(carried))
	}
	v.Pass = true
	v.Line = fmt.Sprintf("%s mode: PASS (%d phases, %s: %s responses from %d clients, %d abusive%s; "+
		"0 ResetAt changes, 0 double grants and 0 results contradicting the store over %s moves, %s checked in an open window; "+
		"0 denials claiming quota; "+
		"share on new within %g points of target; allowed and denied in every phase; 0 degraded, 0 failed%s)",
		run.mode, len(results), strings.Join(targets, " → "), fmtInt(total.requests), run.clients, run.abusive, legacy,
		fmtInt(total.moved), fmtInt(total.checked), cfg.Tolerance, modeClause(run.mode, cfg.Seeding))
	return v
}

// modeClause is the verdict's words on what the mode adds.
func modeClause(m rollout.Mode, seeding bool) string {
	switch {
	case m == rollout.MirrorMode:
		return "; 0 mirror shortfalls or secondary errors, the stores alike from the rollout's second phase on"
	case m == rollout.SplitMode && seeding:
		return "; every lookup seeded, 0 read errors"
	}
	return ""
}

// judgeRun joins the verdicts of the modes run; planned is the number of
// modes the run was to go through.
func judgeRun(legs []ModeVerdict, planned int) Verdict {
	v := Verdict{Modes: legs, Pass: len(legs) == planned}
	var names []string
	var requests, moves, checked int64
	for _, m := range legs {
		names = append(names, m.name())
		requests, moves, checked = requests+m.requests, moves+m.moves, checked+m.checked
		if !m.Pass {
			v.Pass = false
			for _, f := range m.Failures {
				v.Failures = append(v.Failures, m.name()+": "+f)
			}
		}
	}
	if len(legs) < planned {
		v.Failures = append(v.Failures, fmt.Sprintf("complete run (%d of %d legs)", len(legs), planned))
	}
	if !v.Pass {
		v.Line = "VERDICT: FAIL: " + strings.Join(v.Failures, "; ")
		return v
	}
	v.Line = fmt.Sprintf("VERDICT: PASS (%s: 0 ResetAt changes, 0 double grants and 0 results contradicting the store, "+
		"over %s moves (%s checked in an open window) and %s responses)",
		joinNames(names), fmtInt(moves), fmtInt(checked), fmtInt(requests))
	return v
}

// joinNames writes "a", "a and b", "a, b and c".
func joinNames(names []string) string {
	switch len(names) {
	case 0:
		return "nothing"
	case 1:
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

// progressLine is the one-line state of the phase under way.
func progressLine(index, count, target int, elapsed time.Duration, t phaseTotals, rate float64) string {
	all := t.all()
	return fmt.Sprintf("  [%d/%d %3d%%] %5.1fs %5.0f req/s · allowed %s · denied %s · ids on new %d/%d · "+
		"moved %d · reset changes %d · double grants %d · contradicting %d · 429+quota %d · degraded %d · errors %d",
		index+1, count, target, elapsed.Seconds(), rate, fmtInt(all.allowed), fmtInt(all.denied),
		t.ids[rollout.SideNew], t.active, all.moved, all.resetChanges, all.doubleGrants, all.contradictions,
		all.quotaClaims, all.degraded, t.errors)
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

// fmtMillis writes d in milliseconds: "1.8 ms", "-" for zero.
func fmtMillis(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000)
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
