package conformance

import (
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// testDenialConsumesNothingFixed: denied requests of any cost consume
// nothing (peers that count them make raising a limit useless until the
// window ends): the unit left after a denied cost-2 request is still there,
// and the next window starts empty.
func testDenialConsumesNothingFixed(t *testing.T, e *env) {
	p := mustPolicy(t, "denials", throttler.PerHour(5).Named("5/h"))
	e.main.timeline(t, p, "denied", []step{
		{0, allowN, 4, true, 1, 4, hour, 0},
		{sec, allowN, 2, false, 1, 4, hour, hour - sec},
		{2 * sec, allowN, 2, false, 1, 4, hour, hour - 2*sec},
		{3 * sec, allowN, 5, false, 1, 4, hour, hour - 3*sec},
		{4 * sec, peek, 0, true, 1, 4, hour, 0},
		{5 * sec, allowN, 1, true, 0, 5, hour, 0},
		{6 * sec, allowN, 1, false, 0, 5, hour, hour - 6*sec},
		{7 * sec, allowN, 1, false, 0, 5, hour, hour - 7*sec},
		{8 * sec, allowN, 3, false, 0, 5, hour, hour - 8*sec},
		{9 * sec, peek, 0, true, 0, 5, hour, 0},
		{hour, allowN, 5, true, 0, 5, 2 * hour, 0},
	})
}

// testDenialConsumesNothingGCRA: a denied request leaves TAT where it was,
// so the next unit arrives exactly T after the last allowed one.
func testDenialConsumesNothingGCRA(t *testing.T, e *env) {
	// 10/min burst 2: T = 6s, B = 2.
	p := mustPolicy(t, "gcra-denials", throttler.PerMinute(10).WithBurst(2).Named("10/min burst 2"))
	e.main.timeline(t, p, "denied", []step{
		{0, allowN, 2, true, 0, 2, 12 * sec, 0},
		{0, allowN, 1, false, 0, 2, 12 * sec, 6 * sec},
		{0, allowN, 1, false, 0, 2, 12 * sec, 6 * sec},
		{0, allowN, 1, false, 0, 2, 12 * sec, 6 * sec},
		{3 * sec, allowN, 2, false, 0, 2, 12 * sec, 9 * sec},
		{3 * sec, allowN, 1, false, 0, 2, 12 * sec, 3 * sec},
		{6 * sec, allowN, 1, true, 0, 2, 18 * sec, 0},
		{6 * sec, peek, 0, true, 0, 2, 18 * sec, 0},
		{12*sec - ms, allowN, 1, false, 0, 2, 18 * sec, ms},
		{12 * sec, allowN, 1, true, 0, 2, 24 * sec, 0},
		{30 * sec, peek, 0, true, 2, 0, 30 * sec, 0},
	})
}

// testResetAtStableWithinWindow: every result of one window carries the
// identical ResetAt, to the millisecond, whatever the operation, its
// verdict and the clock's sub-millisecond reading (GitHub's Fix 1).
func testResetAtStableWithinWindow(t *testing.T, e *env) {
	p := mustPolicy(t, "stable",
		throttler.PerMinute(5).Named("anchored"),
		throttler.PerHour(50).Using(throttler.AlignedWindow).Named("aligned"))
	_, refunds := e.main.backend.(driver.Refunder)
	offsets := []time.Duration{0, 1500 * ms, 7250 * ms, 13*sec + 400*us, 20 * sec, 29*sec + 999*ms + 999*us,
		31 * sec, 42 * sec, 50 * sec, 55*sec + 1*us, 59*sec + 999*ms}
	var results []throttler.Result
	for i, off := range offsets {
		at(off, e.main)
		label := step{at: off, op: allowN, cost: 1}.label(i)
		results = append(results, e.main.allow(t, label, p, "stable", 1))
		results = append(results, e.main.peek(t, label+" then Peek", p, "stable"))
		results = append(results, e.main.allow(t, label+" then cost 0", p, "stable", 0))
		results = append(results, e.main.allowNever(t, label+" then cost 6", p, "stable", 6))
		if refunds && i%3 == 1 {
			results = append(results, e.main.refund(t, label+" then Refund", p, "stable", 1))
		}
	}
	for i, r := range results {
		for _, lr := range r.Limits() {
			want := T0.Add(60 * sec)
			if lr.Name == "aligned" {
				want = T0.Add(3354322 * ms)
			}
			if !lr.ResetAt.Equal(want) {
				t.Errorf("result %d: limit %q ResetAt = T0%+v, want T0+%v for every result of the window",
					i, lr.Name, lr.ResetAt.Sub(T0), want.Sub(T0))
			}
		}
	}
}

// testResetAtStableAcrossInstances returns a subtest in which two throttler
// instances over two backends of one harness, their clocks skew apart,
// share one window: every result carries the ResetAt of whichever instance
// opened the window, and their units add up.
func testResetAtStableAcrossInstances(skew time.Duration) func(t *testing.T, e *env) {
	return func(t *testing.T, e *env) {
		p := mustPolicy(t, "skewed",
			throttler.PerMinute(4).Named("anchored"),
			throttler.PerHour(20).Using(throttler.AlignedWindow).Named("aligned"))
		a, b := e.main, e.newInstance(skew)
		type move struct {
			who     *instance
			at      time.Duration // primary clock's offset
			op      op
			allowed bool
			used    int64 // the anchored limit's Used after it
			resetAt time.Duration
		}
		// a opens the first window at T0; b, ahead by skew, is first to find
		// it closed and opens the second at T0+59.5s+skew.
		second := 59500*ms + skew + 60*sec
		moves := []move{
			{a, 0, allowN, true, 1, 60 * sec},
			{b, sec, allowN, true, 2, 60 * sec},
			{a, 2 * sec, allowN, true, 3, 60 * sec},
			{b, 3 * sec, peek, true, 3, 60 * sec},
			{b, 3 * sec, allowN, true, 4, 60 * sec},
			{a, 4 * sec, allowN, false, 4, 60 * sec},
			{b, 5 * sec, allowN, false, 4, 60 * sec},
			{a, 59 * sec, peek, true, 4, 60 * sec},
			{b, 59500 * ms, allowN, true, 1, second},
			{a, 59500 * ms, peek, true, 1, second},
			{a, 59500 * ms, allowN, true, 2, second},
			{b, 61 * sec, allowN, true, 3, second},
			{a, 62 * sec, allowN, true, 4, second},
			{b, 63 * sec, allowN, false, 4, second},
			{a, 64 * sec, peek, true, 4, second},
		}
		for i, m := range moves {
			at(m.at, a, b)
			who := "a"
			if m.who == b {
				who = "b"
			}
			label := step{at: m.at, op: m.op, cost: 1}.label(i) + " on instance " + who
			var r throttler.Result
			if m.op == peek {
				r = m.who.peek(t, label, p, "shared")
			} else {
				r = m.who.allow(t, label, p, "shared", 1)
			}
			if r.Allowed != m.allowed {
				t.Errorf("%s: Allowed = %v, want %v", label, r.Allowed, m.allowed)
			}
			for _, lr := range r.Limits() {
				switch lr.Name {
				case "anchored":
					if lr.Used != m.used || !lr.ResetAt.Equal(T0.Add(m.resetAt)) {
						t.Errorf("%s: anchored limit Used %d, ResetAt T0%+v; want %d, T0+%v",
							label, lr.Used, lr.ResetAt.Sub(T0), m.used, m.resetAt)
					}
				case "aligned":
					if !lr.ResetAt.Equal(T0.Add(3354322 * ms)) {
						t.Errorf("%s: aligned limit ResetAt T0%+v, want T0+54m14.322s", label, lr.ResetAt.Sub(T0))
					}
				}
			}
		}
	}
}
