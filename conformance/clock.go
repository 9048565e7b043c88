package conformance

import (
	"testing"

	"github.com/throttlekit/throttlekit/throttler"
)

// SPEC "Time" 4: a clock that goes backwards never produces a negative
// count, a negative remaining, or a ResetAt that moves within an open
// window. A window stays open while now < ResetAt, however far back now
// goes, so every figure below follows from the stored window.

// testClockBackwardsWithinWindow: the clock goes back inside one open
// anchored window, even before the moment the window opened.
func testClockBackwardsWithinWindow(t *testing.T, e *env) {
	p := mustPolicy(t, "backwards", throttler.PerMinute(5).Named("5/min"))
	e.main.timeline(t, p, "user:42", []step{
		{30 * sec, allowN, 1, true, 4, 1, 90 * sec, 0},
		{10 * sec, allowN, 1, true, 3, 2, 90 * sec, 0},
		{0, allowN, 3, true, 0, 5, 90 * sec, 0},
		{-5 * sec, allowN, 1, false, 0, 5, 90 * sec, 95 * sec},
		{-5 * sec, peek, 0, true, 0, 5, 90 * sec, 0},
		{89*sec + 999*ms, peek, 0, true, 0, 5, 90 * sec, 0},
		{90 * sec, allowN, 1, true, 4, 1, 150 * sec, 0},
	})
}

// testClockBackwardsAcrossWindowBoundary: the clock goes back across the
// end of a window into an earlier window's span: the stored window (the
// later one) is still open, so counts continue in it and its ResetAt
// stays, for anchored and for aligned windows.
func testClockBackwardsAcrossWindowBoundary(t *testing.T, e *env) {
	anchored := mustPolicy(t, "backwards-anchored", throttler.PerMinute(3).Named("3/min"))
	e.main.timeline(t, anchored, "user:42", []step{
		{0, allowN, 1, true, 2, 1, 60 * sec, 0},
		{70 * sec, allowN, 2, true, 1, 2, 130 * sec, 0},
		{50 * sec, peek, 0, true, 1, 2, 130 * sec, 0},
		{50 * sec, allowN, 1, true, 0, 3, 130 * sec, 0},
		{50 * sec, allowN, 1, false, 0, 3, 130 * sec, 80 * sec},
		{-100 * sec, allowN, 1, false, 0, 3, 130 * sec, 230 * sec},
		{130 * sec, allowN, 1, true, 2, 1, 190 * sec, 0},
	})
	aligned := mustPolicy(t, "backwards-aligned", throttler.PerMinute(4).Using(throttler.AlignedWindow).Named("4/min aligned"))
	e.main.timeline(t, aligned, "user:42", []step{
		{0, allowN, 1, true, 3, 1, 54322 * ms, 0},
		{60 * sec, allowN, 1, true, 3, 1, 114322 * ms, 0},
		{50 * sec, allowN, 1, true, 2, 2, 114322 * ms, 0},
		{50 * sec, peek, 0, true, 2, 2, 114322 * ms, 0},
		{-10 * sec, allowN, 2, true, 0, 4, 114322 * ms, 0},
		{-10 * sec, allowN, 1, false, 0, 4, 114322 * ms, 124322 * ms},
		{114322 * ms, allowN, 1, true, 3, 1, 174322 * ms, 0},
	})
}

// testClockBackwardsGCRA: with the clock behind a TAT, Remaining clamps at
// 0 and Used at B; even a peek (cost 0) is denied while TAT - B*T > now,
// with RetryAfter by the formula; nothing changes.
func testClockBackwardsGCRA(t *testing.T, e *env) {
	// 10/min: T = 6s, B = 10.
	p := mustPolicy(t, "backwards-gcra", throttler.PerMinute(10).Using(throttler.GCRA).Named("10/min gcra"))
	e.main.timeline(t, p, "user:42", []step{
		{60 * sec, allowN, 5, true, 5, 5, 90 * sec, 0},
		{40 * sec, peek, 0, true, 1, 9, 90 * sec, 0},
		{40 * sec, allowN, 1, true, 0, 10, 96 * sec, 0},
		{40 * sec, allowN, 1, false, 0, 10, 96 * sec, 2 * sec},
		{20 * sec, peek, 0, false, 0, 10, 96 * sec, 16 * sec},
		{20 * sec, allowN, 1, false, 0, 10, 96 * sec, 22 * sec},
		{-hour, peek, 0, false, 0, 10, 96 * sec, hour + 36*sec},
		{96 * sec, peek, 0, true, 10, 0, 96 * sec, 0},
	})
}
