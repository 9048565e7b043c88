package conformance

import (
	"testing"

	"github.com/throttlekit/throttlekit/throttler"
)

// Sliding-window timelines, worked out by hand from SPEC "Sliding window":
// windows aligned on the multiples of W since the epoch; at now, with E the
// end of the window holding now, cur its count and prev the count of the
// one before, a request of cost c is allowed iff
// (cur + c)×W + prev×(E - now) <= Max×W; Remaining = Max - cur -
// ceil(prev×(E - now)/W); ResetAt = E + W while cur > 0, E while only prev
// > 0, now when both are 0; RetryAfter = E - floor((Max-cur-c)×W/prev) - now
// when Max-cur-c >= 0, else E + W - floor((Max-c)×W/cur) - now.
//
// T0 = 03:04:05.678, so the minute window holding T0 ends at T0+54.322s.

const slidingE1 = 54322 * ms // end of the minute window holding T0

// testSlidingWindowTimeline: 10/min sliding across three windows.
func testSlidingWindowTimeline(t *testing.T, e *env) {
	p := mustPolicy(t, "sliding", throttler.PerMinute(10).Using(throttler.SlidingWindow).Named("10/min sliding"))
	e1, e2, e3 := slidingE1, slidingE1+minute, slidingE1+2*minute
	e.main.timeline(t, p, "user:42", []step{
		{0, allowN, 4, true, 6, 4, e2, 0},
		// 4 + 7 > 10 in this window; in the next one the 4 weigh
		// (E2 - t)/W, and 7 + 4×(E2 - t)/W <= 10 from t = E2 - 45s.
		{0, allowN, 7, false, 6, 4, e2, e2 - 45*sec},
		{30 * sec, allowN, 6, true, 0, 10, e2, 0},
		// The next window: the 10 of the last one weigh in full at its
		// start, and one unit fits once 9/10 of W is left.
		{e1, peek, 0, true, 0, 10, e2, 0},
		{e1, allowN, 1, false, 0, 10, e2, 6 * sec},
		{e1 + 6*sec, allowN, 1, true, 0, 10, e3, 0},
		// Halfway: 1 + ceil(10 × 30/60) = 6 used.
		{e1 + 30*sec, peek, 0, true, 4, 6, e3, 0},
		{e1 + 30*sec, allowN, 5, false, 4, 6, e3, 6 * sec},
		{e1 + 30*sec, allowN, 4, true, 0, 10, e3, 0},
		// The third window: the second's 5 weigh ceil(5 × 45/60) = 4.
		{e2 + 15*sec, peek, 0, true, 6, 4, e2 + minute, 0},
		// Two windows later nothing counts any more.
		{200 * sec, peek, 0, true, 10, 0, 200 * sec, 0},
		{200 * sec, allowN, 11, false, 10, 0, 200 * sec, never},
	})
}

// testSlidingWindowRetryAfterIsExact: after a denial, waiting RetryAfter is
// enough and a millisecond less is not, on both of the formula's branches.
func testSlidingWindowRetryAfterIsExact(t *testing.T, e *env) {
	p := mustPolicy(t, "sliding-retry", throttler.PerMinute(10).Using(throttler.SlidingWindow).Named("10/min sliding"))
	e2 := slidingE1 + minute
	// The current window holds 7: a cost of 5 waits for the next window,
	// where 5 + 7×(E2 - t)/W <= 10 from t = E2 - floor(5×60/7)s.
	wait := e2 - 42857*ms
	e.main.timeline(t, p, "next-window", []step{
		{0, allowN, 7, true, 3, 7, e2, 0},
		{0, allowN, 5, false, 3, 7, e2, wait},
		{wait - ms, allowN, 5, false, 4, 6, e2, ms},
		{wait, allowN, 5, true, 0, 10, e2 + minute, 0},
	})
	// The previous window held 9: at the next window's start five units
	// wait until 9×(E2 - t) <= 5×W, at t = E2 - floor(5×60/9)s.
	wait = e2 - 33333*ms - slidingE1
	e.main.timeline(t, p, "same-window", []step{
		{0, allowN, 9, true, 1, 9, e2, 0},
		{slidingE1, allowN, 5, false, 1, 9, e2, wait},
		{slidingE1 + wait - ms, allowN, 5, false, 4, 6, e2, ms},
		{slidingE1 + wait, allowN, 5, true, 0, 10, e2 + minute, 0},
	})
}

// testSlidingWindowClockBehind: a host whose clock lags reads a window that
// a host ahead already opened as the current one, with its count in full:
// the lag never discards another host's units.
func testSlidingWindowClockBehind(t *testing.T, e *env) {
	p := mustPolicy(t, "sliding-skew", throttler.PerMinute(10).Using(throttler.SlidingWindow).Named("10/min sliding"))
	ahead := e.newInstance(10 * sec)
	// At T0+50s the host ahead reads T0+60s, in the next window, and
	// spends it.
	ahead.timeline(t, p, "shared", []step{{50 * sec, allowN, 10, true, 0, 10, slidingE1 + 2*minute, 0}})
	// The host behind, still in the first window, finds nothing left.
	e.main.timeline(t, p, "shared", []step{
		{50 * sec, peek, 0, true, 0, 10, slidingE1 + 2*minute, 0},
		{50 * sec, allowN, 1, false, 0, 10, slidingE1 + 2*minute, slidingE1 + 2*minute - 54*sec - 50*sec},
	})
}
