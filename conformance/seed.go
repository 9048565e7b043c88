package conformance

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// SPEC "Seeding state from another store": driver.Seeder takes states that
// another store decided and merges them into its own exactly as
// driver.Merge does (what counts nothing at now is ignored, what the store
// does not hold is taken; when both count, a fixed window keeps the End
// the store holds with the larger count, GCRA and sliding windows the
// newer state), then decides the
// request's cost on the result, all in one atomic step, reporting the
// states it held before in Outcome.Prior. Every Seed subtest skips when the
// backend does not implement driver.Seeder, or when it is a decorator that
// answers errors.ErrUnsupported because the backend it wraps does not.
//
// The subtests call Seed on the harness's backend directly, with the very
// driver.Policy the throttler sends (compile), and check what a seed did
// twice: the Outcome against hand-worked states, and the figures the
// throttler reports afterwards against hand-worked timelines.

// alignedHourEnd is the end of the aligned hour holding T0 (04:00:00), and
// of the sliding hour window holding it.
const alignedHourEnd = 3354322 * ms

// fixedAt is a fixed-window state of used units whose window ends at T0 +
// end.
func fixedAt(used int64, end time.Duration) driver.State {
	return driver.State{Used: used, End: T0.Add(end).UnixMilli()}
}

// tatAt is a GCRA state whose theoretical arrival time is T0 + at.
func tatAt(at time.Duration) driver.State {
	return driver.State{End: T0.Add(at).UnixMicro()}
}

// slidingAt is a sliding-window state: used units in the window ending at
// T0 + end, prev in the one before.
func slidingAt(used int64, end time.Duration, prev int64) driver.State {
	return driver.State{Used: used, End: T0.Add(end).UnixMilli(), Prev: prev}
}

// none is the state of a limit the store holds nothing for.
var none = driver.State{}

// requireSeeder skips the subtest when the backend cannot take states, as
// SPEC makes seeding optional. A decorator may implement driver.Seeder and
// still answer errors.ErrUnsupported for the backend it wraps: a probe that
// changes nothing (a seed of states that count nothing, cost 0) tells.
func (e *env) requireSeeder() {
	e.t.Helper()
	s, ok := e.main.backend.(driver.Seeder)
	if !ok {
		e.t.Skip("backend does not implement driver.Seeder")
	}
	p := compile(e.t, mustPolicy(e.t, "seed-probe", throttler.PerMinute(1).Named("probe")))
	_, err := s.Seed(e.ctx, driver.Request{Policy: p, Identifier: "probe", Now: e.main.clock.Now()}, []driver.State{none})
	if errors.Is(err, errors.ErrUnsupported) {
		e.t.Skipf("backend declares seeding unsupported: %v", err)
	}
	if err != nil {
		e.t.Fatalf("Seed of a state that counts nothing: %v", err)
	}
}

// seeded is what one Seed call must do: its verdict, and the states held
// before and after it, compared as they count at the call's now
// (driver.InForce), since two stores may write equivalent states apart.
type seeded struct {
	allowed      bool
	prior, after []driver.State
}

// seed calls the backend's Seed for id under p at the instance's clock
// reading and checks the outcome against want and against driver.Seed
// applied to the prior states the backend reported.
func (in *instance) seed(t *testing.T, label string, p *throttler.Policy, id string, cost int64,
	given []driver.State, want seeded) driver.Outcome {
	t.Helper()
	dp := compile(t, p)
	now := in.clock.Now()
	req := driver.Request{Policy: dp, Identifier: id, Cost: cost, Now: now}
	out, err := in.backend.(driver.Seeder).Seed(in.env.ctx, req, append([]driver.State(nil), given...))
	if err != nil {
		t.Fatalf("%s: Seed(%q, %s, cost %d): unexpected error: %v", label, p.Name(), printable(id), cost, err)
	}
	if why := seedOutcomeProblem(dp, now, cost, given, out); why != "" {
		t.Fatalf("%s: %s", label, why)
	}
	var diffs []string
	if out.Allowed != want.allowed {
		diffs = append(diffs, fmt.Sprintf("Allowed = %v, want %v", out.Allowed, want.allowed))
	}
	diffs = append(diffs, diffStates("Prior", dp, now, out.Prior, want.prior)...)
	diffs = append(diffs, diffStates("States", dp, now, out.States, want.after)...)
	if len(diffs) > 0 {
		t.Errorf("%s: Seed(cost %d, given %s): %s", label, cost, describeStates(dp, given), strings.Join(diffs, "; "))
	}
	return out
}

// seedOutcomeProblem explains how out is not what one atomic Seed step
// answers, or returns "": one prior state and one state after per limit,
// and a verdict and states after that driver.Seed gives from the prior
// states. It is safe to call from any goroutine.
func seedOutcomeProblem(p *driver.Policy, now time.Time, cost int64, given []driver.State, out driver.Outcome) string {
	n := len(p.Limits)
	if len(out.States) != n || len(out.Prior) != n {
		return fmt.Sprintf("Seed returned %d states and %d prior states for %d limits", len(out.States), len(out.Prior), n)
	}
	want := append([]driver.State(nil), out.Prior...)
	allowed := driver.Seed(p, now, cost, want, given)
	d := diffStates("States", p, now, out.States, want)
	if out.Allowed != allowed {
		d = append(d, fmt.Sprintf("Allowed = %v", out.Allowed))
	}
	if len(d) > 0 {
		return fmt.Sprintf("Seed(cost %d, given %s) from Prior %s is not driver.Seed's step (Allowed %v, States %s): %s",
			cost, describeStates(p, given), describeStates(p, out.Prior), allowed, describeStates(p, want), strings.Join(d, "; "))
	}
	return ""
}

// diffStates lists the limits whose states differ as they count at now.
func diffStates(what string, p *driver.Policy, now time.Time, got, want []driver.State) []string {
	if len(got) != len(want) {
		return []string{fmt.Sprintf("%s holds %d states, want %d", what, len(got), len(want))}
	}
	var d []string
	for i := range want {
		l := &p.Limits[i]
		g, w := driver.InForce(l, got[i], now), driver.InForce(l, want[i], now)
		if g != w {
			d = append(d, fmt.Sprintf("%s[%s] = %s, want %s", what, l.Name, describeState(l, g), describeState(l, w)))
		}
	}
	return d
}

// describeState writes a state with its times as offsets from T0.
func describeState(l *driver.Limit, s driver.State) string {
	switch {
	case s == none:
		return "{nothing}"
	case l.Algorithm == driver.GCRA:
		return fmt.Sprintf("{TAT %s}", sinceT0(time.UnixMicro(s.End)))
	case l.Algorithm == driver.SlidingWindow:
		return fmt.Sprintf("{Used %d End %s Prev %d}", s.Used, sinceT0(time.UnixMilli(s.End)), s.Prev)
	}
	return fmt.Sprintf("{Used %d End %s}", s.Used, sinceT0(time.UnixMilli(s.End)))
}

// sinceT0 writes a moment as T0 plus or minus an offset.
func sinceT0(at time.Time) string {
	d := at.Sub(T0)
	if d < 0 {
		return "T0-" + (-d).String()
	}
	return "T0+" + d.String()
}

func describeStates(p *driver.Policy, states []driver.State) string {
	if len(states) != len(p.Limits) {
		return fmt.Sprintf("%d states", len(states))
	}
	parts := make([]string, len(states))
	for i := range states {
		parts[i] = describeState(&p.Limits[i], states[i])
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// testSeedEveryAlgorithm: a store holding nothing takes the given state of
// each algorithm as it is: the throttler's next decision continues the
// given window, with its ResetAt and its units, and Outcome.Prior reports
// what the store held (nothing, then the state the decision left).
func testSeedEveryAlgorithm(t *testing.T, e *env) {
	e.requireSeeder()
	e1 := slidingE1
	// Seeds at T0+10s; GCRA 10/min has T = 6s, B = 10.
	for _, c := range []struct {
		limit       throttler.Limit
		given, then driver.State
		next        step
	}{
		// Four units spent in a window the other store opened at T0-20s.
		{throttler.PerMinute(10), fixedAt(4, 40*sec), fixedAt(5, 40*sec),
			step{10 * sec, allowN, 1, true, 5, 5, 40 * sec, 0}},
		{throttler.PerMinute(10).Using(throttler.AlignedWindow), fixedAt(4, e1), fixedAt(5, e1),
			step{10 * sec, allowN, 1, true, 5, 5, e1, 0}},
		// TAT 24s ahead: four units; one more makes it T0+40s and leaves
		// floor((10s - (40s - 60s)) / 6s) = 5.
		{throttler.PerMinute(10).Using(throttler.GCRA), tatAt(34 * sec), tatAt(40 * sec),
			step{10 * sec, allowN, 1, true, 5, 5, 40 * sec, 0}},
		// cur 4, prev 3 weighing 44.322/60 of a window: 5 + ceil(2.2161)
		// used after one more unit.
		{throttler.PerMinute(10).Using(throttler.SlidingWindow), slidingAt(4, e1, 3), slidingAt(5, e1, 3),
			step{10 * sec, allowN, 1, true, 2, 8, e1 + minute, 0}},
	} {
		p := mustPolicy(t, "seed-"+c.limit.Algorithm.String(), c.limit)
		label := c.limit.String()
		e.at(10 * sec)
		e.main.seed(t, label+" into an empty store", p, "moved", 0, []driver.State{c.given},
			seeded{true, []driver.State{none}, []driver.State{c.given}})
		e.main.timeline(t, p, "moved", []step{c.next})
		e.main.seed(t, label+" again", p, "moved", 0, []driver.State{c.given},
			seeded{true, []driver.State{c.then}, []driver.State{c.then}})
	}

	// The four together in one policy, in order.
	p := mustPolicy(t, "seed-every",
		throttler.PerMinute(10).Named("fixed"),
		throttler.PerMinute(10).Using(throttler.AlignedWindow).Named("aligned"),
		throttler.PerMinute(10).Using(throttler.GCRA).Named("gcra"),
		throttler.PerMinute(10).Using(throttler.SlidingWindow).Named("sliding"))
	given := []driver.State{fixedAt(4, 40*sec), fixedAt(7, e1), tatAt(22 * sec), slidingAt(2, e1, 6)}
	e.at(10 * sec)
	e.main.seed(t, "four limits", p, "moved", 0, given, seeded{true, make([]driver.State, 4), given})
	r := e.main.allow(t, "four limits, then one unit", p, "moved", 1)
	checkLimit(t, "four limits", r, "fixed", true, 5, 5, 40*sec, 0)
	checkLimit(t, "four limits", r, "aligned", true, 2, 8, e1, 0)
	// TAT T0+28s after the unit: floor((10s + 32s) / 6s) = 7 left.
	checkLimit(t, "four limits", r, "gcra", true, 7, 3, 28*sec, 0)
	// cur 3, prev 6 weighing 44.322/60: 3 + ceil(4.4322) = 8 used.
	checkLimit(t, "four limits", r, "sliding", true, 2, 8, e1+minute, 0)
}

// testSeedKeepsNewer: when the store and the given state both count, the
// newer wins: within one fixed window the larger Used (either side); GCRA
// the later TAT; a sliding window the later End, and within one End the
// larger of each count, after reading both as they count at now. A fixed
// window with another End is SeedKeepsHeldWindow's.
func testSeedKeepsNewer(t *testing.T, e *env) {
	e.requireSeeder()
	e1, e2 := slidingE1, slidingE1+minute
	one := func(s driver.State) []driver.State { return []driver.State{s} }

	fixed := mustPolicy(t, "newer-fixed", throttler.PerMinute(10).Named("10/min"))
	e.main.timeline(t, fixed, "same-window", []step{{0, allowN, 6, true, 4, 6, minute, 0}})
	e.at(10 * sec)
	e.main.seed(t, "fixed, smaller Used", fixed, "same-window", 0, one(fixedAt(4, minute)),
		seeded{true, one(fixedAt(6, minute)), one(fixedAt(6, minute))})
	e.main.timeline(t, fixed, "same-window", []step{{10 * sec, allowN, 1, true, 3, 7, minute, 0}})
	e.main.seed(t, "fixed, larger Used", fixed, "same-window", 0, one(fixedAt(9, minute)),
		seeded{true, one(fixedAt(7, minute)), one(fixedAt(9, minute))})
	e.main.timeline(t, fixed, "same-window", []step{
		{10 * sec, allowN, 1, true, 0, 10, minute, 0},
		{10 * sec, allowN, 1, false, 0, 10, minute, 50 * sec},
	})

	aligned := mustPolicy(t, "newer-aligned", throttler.PerMinute(10).Using(throttler.AlignedWindow).Named("10/min aligned"))
	e.main.timeline(t, aligned, "same-window", []step{{0, allowN, 6, true, 4, 6, e1, 0}})
	e.at(10 * sec)
	e.main.seed(t, "aligned, smaller Used", aligned, "same-window", 0, one(fixedAt(4, e1)),
		seeded{true, one(fixedAt(6, e1)), one(fixedAt(6, e1))})
	e.main.timeline(t, aligned, "same-window", []step{{10 * sec, allowN, 1, true, 3, 7, e1, 0}})

	// GCRA 10/min: T = 6s, B = 10. Five units at T0 leave TAT T0+30s.
	gcra := mustPolicy(t, "newer-gcra", throttler.PerMinute(10).Using(throttler.GCRA).Named("10/min gcra"))
	e.main.timeline(t, gcra, "tat", []step{{0, allowN, 5, true, 5, 5, 30 * sec, 0}})
	e.at(10 * sec)
	e.main.seed(t, "gcra, earlier TAT", gcra, "tat", 0, one(tatAt(20*sec)),
		seeded{true, one(tatAt(30 * sec)), one(tatAt(30 * sec))})
	// T0+36s after one more unit: floor((10s + 24s) / 6s) = 5 left.
	e.main.timeline(t, gcra, "tat", []step{{10 * sec, allowN, 1, true, 5, 5, 36 * sec, 0}})
	e.main.seed(t, "gcra, later TAT", gcra, "tat", 0, one(tatAt(50*sec)),
		seeded{true, one(tatAt(36 * sec)), one(tatAt(50 * sec))})
	e.main.timeline(t, gcra, "tat", []step{{10 * sec, peek, 0, true, 3, 7, 50 * sec, 0}})

	// Sliding 10/min. A store whose clock runs 10 s ahead wrote the next
	// window (E2) at T0+50s; a given state of the current window (E1) is
	// older and changes nothing, one of E2 merges count by count.
	sliding := mustPolicy(t, "newer-sliding", throttler.PerMinute(10).Using(throttler.SlidingWindow).Named("10/min sliding"))
	ahead := e.newInstance(10 * sec)
	ahead.timeline(t, sliding, "ahead", []step{{50 * sec, allowN, 3, true, 7, 3, e2 + minute, 0}})
	e.at(50 * sec)
	e.main.seed(t, "sliding, earlier End", sliding, "ahead", 0, one(slidingAt(5, e1, 2)),
		seeded{true, one(slidingAt(3, e2, 0)), one(slidingAt(3, e2, 0))})
	e.main.timeline(t, sliding, "ahead", []step{{50 * sec, peek, 0, true, 7, 3, e2 + minute, 0}})
	e.main.seed(t, "sliding, same End", sliding, "ahead", 0, one(slidingAt(6, e2, 1)),
		seeded{true, one(slidingAt(3, e2, 0)), one(slidingAt(6, e2, 1))})
	// E2 lies beyond the window holding now: prev weighs in full.
	e.main.timeline(t, sliding, "ahead", []step{{50 * sec, peek, 0, true, 3, 7, e2 + minute, 0}})

	// Within the window holding now: a given state of the previous window
	// (End E1 - W) counts as prev and merges with the held prev; a later
	// End, written by a clock ahead, is taken.
	e.at(10 * sec)
	e.main.seed(t, "sliding, into an empty store", sliding, "counts", 0, one(slidingAt(4, e1, 1)),
		seeded{true, one(none), one(slidingAt(4, e1, 1))})
	e.main.seed(t, "sliding, the previous window", sliding, "counts", 0, one(slidingAt(3, e1-minute, 0)),
		seeded{true, one(slidingAt(4, e1, 1)), one(slidingAt(4, e1, 3))})
	// 4 + ceil(3 × 44.322/60) = 7 used.
	e.main.timeline(t, sliding, "counts", []step{{10 * sec, peek, 0, true, 3, 7, e1 + minute, 0}})
	e.main.seed(t, "sliding, a later End", sliding, "counts", 0, one(slidingAt(2, e2, 4)),
		seeded{true, one(slidingAt(4, e1, 3)), one(slidingAt(2, e2, 4))})
	e.main.timeline(t, sliding, "counts", []step{{10 * sec, peek, 0, true, 4, 6, e2 + minute, 0}})
}

// testSeedKeepsHeldWindow: a fixed window (anchored or aligned) the store
// holds open stays where it is whatever End a given window has, earlier or
// later: the store keeps its End, so the ResetAt its clients were shown,
// and takes the larger of the two counts, so that no unit either store
// counted is granted again. A given window of the same End further on
// raises the count as before, and once the held window has closed the
// given one is taken as it is.
func testSeedKeepsHeldWindow(t *testing.T, e *env) {
	e.requireSeeder()
	e1 := slidingE1
	one := func(s driver.State) []driver.State { return []driver.State{s} }

	fixed := mustPolicy(t, "held-fixed", throttler.PerMinute(10).Named("10/min"))
	e.main.timeline(t, fixed, "held", []step{{0, allowN, 6, true, 4, 6, minute, 0}})
	e.at(10 * sec)
	e.main.seed(t, "fixed, an earlier End with fewer units", fixed, "held", 0, one(fixedAt(2, 30*sec)),
		seeded{true, one(fixedAt(6, minute)), one(fixedAt(6, minute))})
	e.main.seed(t, "fixed, a later End with more units", fixed, "held", 0, one(fixedAt(8, 90*sec)),
		seeded{true, one(fixedAt(6, minute)), one(fixedAt(8, minute))})
	// The held window further on, as its other writers counted it.
	e.main.seed(t, "fixed, the held window further on", fixed, "held", 0, one(fixedAt(9, minute)),
		seeded{true, one(fixedAt(8, minute)), one(fixedAt(9, minute))})
	e.main.timeline(t, fixed, "held", []step{
		{10 * sec, allowN, 1, true, 0, 10, minute, 0},
		{20 * sec, allowN, 1, false, 0, 10, minute, 40 * sec},
	})
	// Closed at T0+60s: the given window is taken as it is.
	e.at(minute)
	e.main.seed(t, "fixed, the held window closed", fixed, "held", 0, one(fixedAt(3, 90*sec)),
		seeded{true, one(none), one(fixedAt(3, 90*sec))})
	e.main.timeline(t, fixed, "held", []step{{minute, allowN, 1, true, 6, 4, 90 * sec, 0}})

	// With a cost: the merge keeps the held End, then the cost is decided
	// in it; a denial keeps the merge.
	e.main.timeline(t, fixed, "cost", []step{{0, allowN, 2, true, 8, 2, minute, 0}})
	e.at(10 * sec)
	e.main.seed(t, "fixed, cost 3, an earlier End", fixed, "cost", 3, one(fixedAt(5, 30*sec)),
		seeded{true, one(fixedAt(2, minute)), one(fixedAt(8, minute))})
	e.main.seed(t, "fixed, cost 3, a later End", fixed, "cost", 3, one(fixedAt(9, 100*sec)),
		seeded{false, one(fixedAt(8, minute)), one(fixedAt(9, minute))})
	e.main.timeline(t, fixed, "cost", []step{{10 * sec, peek, 0, true, 1, 9, minute, 0}})

	// Aligned: the window holding now stays when the next one is given (a
	// store whose clock runs ahead opened it) ...
	aligned := mustPolicy(t, "held-aligned", throttler.PerMinute(10).Using(throttler.AlignedWindow).Named("10/min aligned"))
	e.main.timeline(t, aligned, "held", []step{{10 * sec, allowN, 3, true, 7, 3, e1, 0}})
	e.main.seed(t, "aligned, the next window", aligned, "held", 0, one(fixedAt(7, e1+minute)),
		seeded{true, one(fixedAt(3, e1)), one(fixedAt(7, e1))})
	e.main.timeline(t, aligned, "held", []step{{10 * sec, allowN, 1, true, 2, 8, e1, 0}})
	// ... and the next window, opened by a clock 50 s ahead, stays when the
	// window holding this clock's now is given.
	ahead := e.newInstance(50 * sec)
	ahead.timeline(t, aligned, "ahead", []step{{10 * sec, allowN, 2, true, 8, 2, e1 + minute, 0}})
	e.at(10 * sec)
	e.main.seed(t, "aligned, the window before the held one", aligned, "ahead", 0, one(fixedAt(5, e1)),
		seeded{true, one(fixedAt(2, e1+minute)), one(fixedAt(5, e1+minute))})
	e.main.timeline(t, aligned, "ahead", []step{{10 * sec, peek, 0, true, 5, 5, e1 + minute, 0}})
}

// testSeedClosedWindowIgnored: a given state that counts nothing at now (a
// fixed window that closed at now, a GCRA TAT at or before now, a sliding
// state older than the previous window or holding no count) changes
// nothing, whether the store holds a state or not.
func testSeedClosedWindowIgnored(t *testing.T, e *env) {
	e.requireSeeder()
	e1 := slidingE1
	one := func(s driver.State) []driver.State { return []driver.State{s} }
	unchanged := func(s driver.State) seeded { return seeded{true, one(s), one(s)} }

	fixed := mustPolicy(t, "closed-fixed", throttler.PerMinute(10).Named("10/min"))
	e.main.timeline(t, fixed, "held", []step{{0, allowN, 2, true, 8, 2, minute, 0}})
	e.at(10 * sec)
	e.main.seed(t, "fixed, closed at now", fixed, "held", 0, one(fixedAt(9, 10*sec)), unchanged(fixedAt(2, minute)))
	e.main.seed(t, "fixed, closed before now", fixed, "held", 0, one(fixedAt(9, 5*sec)), unchanged(fixedAt(2, minute)))
	e.main.timeline(t, fixed, "held", []step{{10 * sec, peek, 0, true, 8, 2, minute, 0}})
	e.main.seed(t, "fixed, closed, empty store", fixed, "empty", 0, one(fixedAt(9, 10*sec)), unchanged(none))
	e.main.timeline(t, fixed, "empty", []step{{10 * sec, allowN, 1, true, 9, 1, 70 * sec, 0}})

	// The aligned window ending at E1 closes at E1.
	aligned := mustPolicy(t, "closed-aligned", throttler.PerMinute(10).Using(throttler.AlignedWindow).Named("10/min aligned"))
	e.main.timeline(t, aligned, "held", []step{{e1, allowN, 2, true, 8, 2, e1 + minute, 0}})
	e.main.seed(t, "aligned, closed at now", aligned, "held", 0, one(fixedAt(9, e1)), unchanged(fixedAt(2, e1+minute)))
	e.main.timeline(t, aligned, "held", []step{{e1, peek, 0, true, 8, 2, e1 + minute, 0}})
	e.main.seed(t, "aligned, closed, empty store", aligned, "empty", 0, one(fixedAt(9, e1)), unchanged(none))
	e.main.timeline(t, aligned, "empty", []step{{e1, peek, 0, true, 10, 0, e1 + minute, 0}})

	// GCRA 10/min: T = 6s. Two units at T0 leave TAT T0+12s.
	gcra := mustPolicy(t, "closed-gcra", throttler.PerMinute(10).Using(throttler.GCRA).Named("10/min gcra"))
	e.main.timeline(t, gcra, "held", []step{{0, allowN, 2, true, 8, 2, 12 * sec, 0}})
	e.at(10 * sec)
	e.main.seed(t, "gcra, TAT at now", gcra, "held", 0, one(tatAt(10*sec)), unchanged(tatAt(12*sec)))
	e.main.seed(t, "gcra, TAT before now", gcra, "held", 0, one(tatAt(sec)), unchanged(tatAt(12*sec)))
	// floor((10s + 48s) / 6s) = 9 left.
	e.main.timeline(t, gcra, "held", []step{{10 * sec, peek, 0, true, 9, 1, 12 * sec, 0}})
	e.main.seed(t, "gcra, TAT at now, empty store", gcra, "empty", 0, one(tatAt(10*sec)), unchanged(none))
	e.main.timeline(t, gcra, "empty", []step{{10 * sec, peek, 0, true, 10, 0, 10 * sec, 0}})

	sliding := mustPolicy(t, "closed-sliding", throttler.PerMinute(10).Using(throttler.SlidingWindow).Named("10/min sliding"))
	e.main.timeline(t, sliding, "held", []step{{0, allowN, 2, true, 8, 2, e1 + minute, 0}})
	e.at(10 * sec)
	e.main.seed(t, "sliding, older than the previous window", sliding, "held", 0, one(slidingAt(9, e1-2*minute, 9)),
		unchanged(slidingAt(2, e1, 0)))
	e.main.seed(t, "sliding, the previous window holding 0", sliding, "held", 0, one(slidingAt(0, e1-minute, 9)),
		unchanged(slidingAt(2, e1, 0)))
	e.main.timeline(t, sliding, "held", []step{{10 * sec, peek, 0, true, 8, 2, e1 + minute, 0}})
	e.main.seed(t, "sliding, older, empty store", sliding, "empty", 0, one(slidingAt(9, e1-2*minute, 9)), unchanged(none))
	e.main.timeline(t, sliding, "empty", []step{{10 * sec, peek, 0, true, 10, 0, 10 * sec, 0}})
}

// testSeedThenDecide: a seed of cost n merges, then decides n on the
// merged states in the same step, all limits or none; a denial keeps the
// merge and consumes nothing.
func testSeedThenDecide(t *testing.T, e *env) {
	e.requireSeeder()
	e1 := slidingE1
	one := func(s driver.State) []driver.State { return []driver.State{s} }

	fixed := mustPolicy(t, "then-fixed", throttler.PerMinute(10).Named("10/min"))
	e.at(10 * sec)
	e.main.seed(t, "fixed, 8 given + 2", fixed, "fits", 2, one(fixedAt(8, 40*sec)),
		seeded{true, one(none), one(fixedAt(10, 40*sec))})
	e.main.seed(t, "fixed, 8 given + 1", fixed, "fits", 1, one(fixedAt(8, 40*sec)),
		seeded{false, one(fixedAt(10, 40*sec)), one(fixedAt(10, 40*sec))})
	e.main.timeline(t, fixed, "fits", []step{{10 * sec, peek, 0, true, 0, 10, 40 * sec, 0}})
	// Against the empty store alone two units would fit, in a window of
	// its own.
	e.main.seed(t, "fixed, 9 given + 2", fixed, "denied", 2, one(fixedAt(9, 40*sec)),
		seeded{false, one(none), one(fixedAt(9, 40*sec))})
	e.main.timeline(t, fixed, "denied", []step{{10 * sec, allowN, 1, true, 0, 10, 40 * sec, 0}})

	// GCRA 10/min: T = 6s, B = 10. The given TAT T0+40s is later than the
	// held T0+30s; three more units make it T0+58s, which 58s - 60s <= 10s
	// allows; three more would not.
	gcra := mustPolicy(t, "then-gcra", throttler.PerMinute(10).Using(throttler.GCRA).Named("10/min gcra"))
	e.main.timeline(t, gcra, "tat", []step{{0, allowN, 5, true, 5, 5, 30 * sec, 0}})
	e.at(10 * sec)
	e.main.seed(t, "gcra, + 3", gcra, "tat", 3, one(tatAt(40*sec)),
		seeded{true, one(tatAt(30 * sec)), one(tatAt(58 * sec))})
	e.main.seed(t, "gcra, + 3 again", gcra, "tat", 3, one(tatAt(40*sec)),
		seeded{false, one(tatAt(58 * sec)), one(tatAt(58 * sec))})
	e.main.timeline(t, gcra, "tat", []step{{10 * sec, peek, 0, true, 2, 8, 58 * sec, 0}})

	// Sliding 10/min at T0+10s: (4+2)×W + 3×44.322s <= 10×W, then
	// (6+2)×W + 3×44.322s > 10×W.
	sliding := mustPolicy(t, "then-sliding", throttler.PerMinute(10).Using(throttler.SlidingWindow).Named("10/min sliding"))
	e.main.seed(t, "sliding, + 2", sliding, "counts", 2, one(slidingAt(4, e1, 3)),
		seeded{true, one(none), one(slidingAt(6, e1, 3))})
	e.main.seed(t, "sliding, + 2 again", sliding, "counts", 2, one(slidingAt(4, e1, 3)),
		seeded{false, one(slidingAt(6, e1, 3)), one(slidingAt(6, e1, 3))})
	e.main.timeline(t, sliding, "counts", []step{{10 * sec, peek, 0, true, 1, 9, e1 + minute, 0}})

	// All or nothing across a policy's limits.
	p := mustPolicy(t, "then-policy",
		throttler.PerMinute(10).Named("minute"),
		throttler.PerHour(100).Using(throttler.AlignedWindow).Named("hour"))
	given := []driver.State{fixedAt(8, 40*sec), fixedAt(50, alignedHourEnd)}
	e.main.seed(t, "policy, + 3", p, "both", 3, given, seeded{false, make([]driver.State, 2), given})
	e.main.seed(t, "policy, + 2", p, "both", 2, given,
		seeded{true, given, []driver.State{fixedAt(10, 40*sec), fixedAt(52, alignedHourEnd)}})
	r := e.main.peek(t, "policy, after", p, "both")
	checkLimit(t, "policy, after", r, "minute", true, 0, 10, 40*sec, 0)
	checkLimit(t, "policy, after", r, "hour", true, 48, 52, alignedHourEnd, 0)
}

// Bounds of the concurrent seeding subtest.
const (
	seedGoroutines = 16
	seedsEach      = 50
)

// testSeedConcurrentWriters: seeds racing each other for one identifier
// leave exactly the newest of every given state, count by count; seeds
// racing decisions never make Used drop nor pass Max, and every step is
// driver.Seed's on the states it reports as prior.
func testSeedConcurrentWriters(t *testing.T, e *env) {
	e.requireSeeder()
	// GCRA 4000/h: T = 0.9s.
	p := mustPolicy(t, "seed-concurrent",
		throttler.PerHour(4000).Named("fixed"),
		throttler.PerHour(4000).Using(throttler.AlignedWindow).Named("aligned"),
		throttler.PerHour(4000).Using(throttler.GCRA).Named("gcra"),
		throttler.PerHour(4000).Using(throttler.SlidingWindow).Named("sliding"))
	// Seed k of 1..800 gives k units (800 - k + 1 for aligned and for
	// sliding's previous window), so that the newest of each count comes
	// from a different writer: the last one for fixed and GCRA, the first
	// one for aligned.
	const top = seedGoroutines * seedsEach
	givenFor := func(k int64) []driver.State {
		return []driver.State{
			fixedAt(k, 30*minute),
			fixedAt(top+1-k, alignedHourEnd),
			tatAt(10*sec + time.Duration(k)*900*ms),
			slidingAt(k, alignedHourEnd, top+1-k),
		}
	}
	e.at(10 * sec)
	dp := compile(t, p)
	s := e.main.backend.(driver.Seeder)
	now := e.main.clock.Now()
	problems := &problemLog{}
	deadline := time.Now().Add(burstTimeBound)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range seedGoroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := 0; i < seedsEach && time.Now().Before(deadline) && e.ctx.Err() == nil; i++ {
				given := givenFor(int64(i*seedGoroutines + g + 1))
				out, err := s.Seed(e.ctx, driver.Request{Policy: dp, Identifier: "hot", Now: now}, append([]driver.State(nil), given...))
				switch {
				case err != nil:
					problems.add("Seed: %v", err)
				default:
					if why := seedOutcomeProblem(dp, now, 0, given, out); why != "" {
						problems.add("%s", why)
					}
					problems.count()
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	problems.check(t, "seeds racing seeds", top)
	want := []driver.State{fixedAt(top, 30*minute), fixedAt(top, alignedHourEnd), tatAt(10*sec + top*900*ms),
		slidingAt(top, alignedHourEnd, top)}
	e.main.seed(t, "after the race", p, "hot", 0, make([]driver.State, 4), seeded{true, want, want})
	r := e.main.peek(t, "after the race", p, "hot")
	checkLimit(t, "after the race", r, "fixed", true, 3200, 800, 30*minute, 0)
	checkLimit(t, "after the race", r, "aligned", true, 3200, 800, alignedHourEnd, 0)
	// TAT T0+730s: floor((10s - 730s + 3600s) / 0.9s) = 3200 left.
	checkLimit(t, "after the race", r, "gcra", true, 3200, 800, 730*sec, 0)
	// 800 + ceil(800 × 3344.322/3600) = 800 + 744 used.
	checkLimit(t, "after the race", r, "sliding", true, 2456, 1544, alignedHourEnd+hour, 0)

	racingSeedsAndDecisions(t, e)
}

// racingSeedsAndDecisions: half the goroutines seed states of one fixed
// window holding 1 to 90 units, half decide one unit at a time, 100 at
// most. Whatever the interleaving, no one sees Used drop or pass Max; some
// decision must be denied (400 of them race for at most 99 units), so the
// window ends full, and the decisions allowed number at least 100 - 90.
func racingSeedsAndDecisions(t *testing.T, e *env) {
	t.Helper()
	p := mustPolicy(t, "seed-racing", throttler.PerHour(100).Named("racing"))
	dp := compile(t, p)
	s := e.main.backend.(driver.Seeder)
	e.at(10 * sec)
	now := e.main.clock.Now()
	end := fixedAt(0, 30*minute).End
	// Open the window first, so that every call meets the seeded window: a
	// window a decision opened first would keep its own End.
	e.main.seed(t, "opening", p, "racing", 0, []driver.State{fixedAt(1, 30*minute)},
		seeded{true, []driver.State{none}, []driver.State{fixedAt(1, 30*minute)}})

	problems := &problemLog{}
	deadline := time.Now().Add(burstTimeBound)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		allowed int
	)
	start := make(chan struct{})
	const half = seedGoroutines / 2
	for g := range seedGoroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			last := int64(0)
			observe := func(what string, used, windowEnd int64) {
				if used < last || used > 100 || windowEnd != end {
					problems.add("%s: Used %d (before: %d, Max 100), window end %s (want T0+30m0s)",
						what, used, last, sinceT0(time.UnixMilli(windowEnd)))
				}
				last = max(last, used)
			}
			for i := 0; i < seedsEach && time.Now().Before(deadline) && e.ctx.Err() == nil; i++ {
				if g < half {
					given := []driver.State{fixedAt(int64(1+(i*half+g)%90), 30*minute)}
					out, err := s.Seed(e.ctx, driver.Request{Policy: dp, Identifier: "racing", Now: now}, append([]driver.State(nil), given...))
					if err != nil {
						problems.add("Seed: %v", err)
						continue
					}
					if why := seedOutcomeProblem(dp, now, 0, given, out); why != "" {
						problems.add("%s", why)
						continue
					}
					st := driver.InForce(&dp.Limits[0], out.States[0], now)
					observe("Seed", st.Used, st.End)
					problems.count()
					continue
				}
				r, err := e.main.thr.AllowN(e.ctx, p, "racing", 1)
				switch {
				case err != nil:
					problems.add("AllowN: %v", err)
				case r.Degraded:
					problems.add("degraded result: %v", r.Err)
				case r.Remaining != r.Limit-r.Used:
					problems.add("Remaining %d, Used %d, Limit %d", r.Remaining, r.Used, r.Limit)
				default:
					observe(fmt.Sprintf("AllowN (allowed %v)", r.Allowed), r.Used, r.ResetAt.UnixMilli())
					if r.Allowed {
						mu.Lock()
						allowed++
						mu.Unlock()
					}
					problems.count()
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	problems.check(t, "seeds racing decisions", seedGoroutines*seedsEach)
	if allowed < 10 || allowed > 99 {
		t.Errorf("seeds racing decisions: %d decisions allowed, want 10 to 99 (the window holds 1 to 90 given units and 100 at most)", allowed)
	}
	e.main.timeline(t, p, "racing", []step{{10 * sec, peek, 0, true, 0, 100, 30 * minute, 0}})
}

// problemLog collects what goroutines of a concurrent subtest found wrong,
// and how many of their calls went through.
type problemLog struct {
	mu    sync.Mutex
	first []string
	n     int // problems
	calls int // calls that went through
}

func (l *problemLog) add(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n++
	if len(l.first) < 5 {
		l.first = append(l.first, fmt.Sprintf(format, args...))
	}
}

func (l *problemLog) count() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls++
}

// check fails the subtest on any problem, and when fewer than want calls
// went through within burstTimeBound.
func (l *problemLog) check(t *testing.T, label string, want int) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n > 0 {
		t.Fatalf("%s: %d problems; the first: %s", label, l.n, strings.Join(l.first, " | "))
	}
	if l.calls < want {
		t.Fatalf("%s: only %d of %d concurrent calls ran within %v: the backend is too slow to check", label, l.calls, want, burstTimeBound)
	}
}

// testSeedInvalidState: states that do not match the policy (too few, too
// many) or hold a negative field are invalid input: an error matching
// driver.ErrInvalidState, never a panic, and nothing changes.
func testSeedInvalidState(t *testing.T, e *env) {
	e.requireSeeder()
	p := mustPolicy(t, "seed-invalid",
		throttler.PerMinute(10).Named("fixed"),
		throttler.PerMinute(10).Using(throttler.SlidingWindow).Named("sliding"))
	e.at(0)
	e.main.allow(t, "t0", p, "held", 1)
	e.at(10 * sec)
	dp := compile(t, p)
	s := e.main.backend.(driver.Seeder)
	fine := []driver.State{fixedAt(5, 40*sec), slidingAt(5, slidingE1, 5)}
	for i, c := range []struct {
		what  string
		given []driver.State
	}{
		{"no states", nil},
		{"one state for two limits", fine[:1]},
		{"three states for two limits", append(append([]driver.State(nil), fine...), fine[0])},
		{"a negative Used", []driver.State{{Used: -1, End: fine[0].End}, fine[1]}},
		{"a negative End", []driver.State{{Used: 5, End: -1}, fine[1]}},
		{"a negative Prev", []driver.State{fine[0], {Used: 5, End: fine[1].End, Prev: -1}}},
	} {
		for _, cost := range []int64{0, 1} {
			req := driver.Request{Policy: dp, Identifier: "held", Cost: cost, Now: e.main.clock.Now()}
			err := callNoPanic(func() error { _, err := s.Seed(e.ctx, req, c.given); return err })
			if !errors.Is(err, driver.ErrInvalidState) {
				t.Errorf("case %d, %s, cost %d: err = %v, want driver.ErrInvalidState", i, c.what, cost, err)
			}
		}
	}
	r := e.main.peek(t, "after", p, "held")
	checkLimit(t, "after", r, "fixed", true, 9, 1, minute, 0)
	checkLimit(t, "after", r, "sliding", true, 9, 1, slidingE1+minute, 0)
}

// testRaisingMaxKeepsWindow: a limit's identity is its window, algorithm
// and burst (and its name when it has one), never its Max: spend 2 of
// "2/min", redefine the policy as "3/min" and the open window goes on with
// 1 left, the same ResetAt and the new Max; back at "2/min" it is the same
// window again. For every algorithm, unnamed and named (docs/SPEC.md,
// Policies redefined 1).
func testRaisingMaxKeepsWindow(t *testing.T, e *env) {
	e1 := slidingE1
	for _, c := range []struct {
		alg throttler.Algorithm
		// The figures at T0+20s: a peek under Max 3, a peek under Max 2,
		// one unit under Max 3, one unit under Max 2.
		raised, lowered, spent, denied step
	}{
		{throttler.FixedWindow,
			step{20 * sec, peek, 0, true, 1, 2, minute, 0}, step{20 * sec, peek, 0, true, 0, 2, minute, 0},
			step{20 * sec, allowN, 1, true, 0, 3, minute, 0}, step{20 * sec, allowN, 1, false, 0, 2, minute, 40 * sec}},
		{throttler.AlignedWindow,
			step{20 * sec, peek, 0, true, 1, 2, e1, 0}, step{20 * sec, peek, 0, true, 0, 2, e1, 0},
			step{20 * sec, allowN, 1, true, 0, 3, e1, 0}, step{20 * sec, allowN, 1, false, 0, 2, e1, e1 - 20*sec}},
		// TAT T0+60s. Max 3: T = 20s, floor((20s - 0s) / 20s) = 1 left;
		// Max 2: T = 30s, none yet. One unit under Max 3 makes it T0+80s,
		// and one more under Max 2 waits 80s + 30s - 60s - 20s.
		{throttler.GCRA,
			step{20 * sec, peek, 0, true, 1, 2, minute, 0}, step{20 * sec, peek, 0, true, 0, 2, minute, 0},
			step{20 * sec, allowN, 1, true, 0, 3, 80 * sec, 0}, step{20 * sec, allowN, 1, false, 0, 2, 80 * sec, 30 * sec}},
		// cur 2 (then 3) in the window ending E1. Under Max 2 with cur 3
		// one unit waits until E1 + W - floor(1 × W / 3) - now.
		{throttler.SlidingWindow,
			step{20 * sec, peek, 0, true, 1, 2, e1 + minute, 0}, step{20 * sec, peek, 0, true, 0, 2, e1 + minute, 0},
			step{20 * sec, allowN, 1, true, 0, 3, e1 + minute, 0}, step{20 * sec, allowN, 1, false, 0, 2, e1 + minute, e1 + 20*sec}},
	} {
		for _, name := range []string{"", "quota"} {
			two, three := throttler.PerMinute(2).Using(c.alg).Named(name), throttler.PerMinute(3).Using(c.alg).Named(name)
			policy := "raise-" + c.alg.String()
			if name != "" {
				policy += "-named"
			}
			p2, p3 := mustPolicy(t, policy, two), mustPolicy(t, policy, three)
			if name == "" {
				// As a user writes them: ParsePolicy(policy, "2/min gcra").
				p2, p3 = mustParse(t, policy, two.String()), mustParse(t, policy, three.String())
			}
			for _, s := range []struct {
				what string
				p    *throttler.Policy
				step step
			}{
				{"spend 2 of " + two.String(), p2, step{0, allowN, 2, true, 0, 2, c.raised.resetAt, 0}},
				{"peek, raised to " + three.String(), p3, c.raised},
				{"peek, lowered to " + two.String(), p2, c.lowered},
				{"one unit, raised to " + three.String(), p3, c.spent},
				{"one unit, lowered to " + two.String(), p2, c.denied},
			} {
				label := fmt.Sprintf("%s (name %q): T0+%v %s", c.alg, name, s.step.at, s.what)
				e.at(s.step.at)
				var r throttler.Result
				if s.step.op == peek {
					r = e.main.peek(t, label, s.p, "user:42")
				} else {
					r = e.main.allow(t, label, s.p, "user:42", s.step.cost)
				}
				checkTop(t, label, r, s.step.allowed, s.step.remaining, s.step.used, s.step.resetAt, s.step.retryAfter)
			}
		}
	}
}

// mustParse builds a policy from ParsePolicy's notation or fails the
// subtest.
func mustParse(t *testing.T, name, limits string) *throttler.Policy {
	t.Helper()
	p, err := throttler.ParsePolicy(name, limits)
	if err != nil {
		t.Fatalf("ParsePolicy(%q, %q): %v", name, limits, err)
	}
	checkNotation(t, p)
	return p
}
