package conformance

import (
	"testing"

	"github.com/throttlekit/throttlekit/throttler"
)

// Fixed-window timelines. Every expected figure below is worked out by hand
// from SPEC "Fixed window" with T0 = 03:04:05.678: an anchored window opened
// at T0+x ends at T0+x+Window; an aligned one-minute window ends at the next
// whole minute, 03:05:00.000 = T0+54.322s.

// testFixedWindowAnchoredTimeline: windows open at the first request that
// finds none, close Window later, and denials and peeks move nothing.
func testFixedWindowAnchoredTimeline(t *testing.T, e *env) {
	p := mustPolicy(t, "anchored", throttler.PerMinute(3).Named("3/min"))
	e.main.timeline(t, p, "user:42", []step{
		{0, allowN, 1, true, 2, 1, 60 * sec, 0},
		{10 * sec, allowN, 1, true, 1, 2, 60 * sec, 0},
		{20 * sec, peek, 0, true, 1, 2, 60 * sec, 0},
		{30 * sec, allowN, 1, true, 0, 3, 60 * sec, 0},
		{40 * sec, allowN, 1, false, 0, 3, 60 * sec, 20 * sec},
		{59*sec + 999*ms, allowN, 1, false, 0, 3, 60 * sec, ms},
		{60 * sec, allowN, 1, true, 2, 1, 120 * sec, 0},
		{60 * sec, peek, 0, true, 2, 1, 120 * sec, 0},
		{119*sec + 999*ms, allowN, 2, true, 0, 3, 120 * sec, 0},
		// Closed at T0+120s: the peek reports the window that would open
		// now and opens nothing, so the next request anchors at T0+200s.
		{150 * sec, peek, 0, true, 3, 0, 210 * sec, 0},
		{200 * sec, allowN, 1, true, 2, 1, 260 * sec, 0},
	})
}

// testFixedWindowAnchoredBoundary: a window is open while now < ResetAt,
// to the millisecond; stored times are whole milliseconds, so a reading
// between two milliseconds counts as the earlier one.
func testFixedWindowAnchoredBoundary(t *testing.T, e *env) {
	p := mustPolicy(t, "anchored-boundary", throttler.PerMinute(2).Named("2/min"))
	e.main.timeline(t, p, "boundary", []step{
		{0, allowN, 1, true, 1, 1, 60 * sec, 0},
		{59*sec + 999*ms, allowN, 1, true, 0, 2, 60 * sec, 0},
		{59*sec + 999*ms, allowN, 1, false, 0, 2, 60 * sec, ms},
		{59*sec + 999*ms + 500*us, allowN, 1, false, 0, 2, 60 * sec, ms},
		{60 * sec, allowN, 1, true, 1, 1, 120 * sec, 0},
		{60*sec + ms, allowN, 1, true, 0, 2, 120 * sec, 0},
		{60*sec + ms, allowN, 1, false, 0, 2, 120 * sec, 60*sec - ms},
	})
}

// testFixedWindowAlignedTimeline: aligned windows end at the multiples of
// Window since the Unix epoch, whenever the first request came.
func testFixedWindowAlignedTimeline(t *testing.T, e *env) {
	p := mustPolicy(t, "aligned", throttler.PerMinute(4).Using(throttler.AlignedWindow).Named("4/min aligned"))
	e.main.timeline(t, p, "user:42", []step{
		{0, allowN, 1, true, 3, 1, 54322 * ms, 0},
		{30 * sec, allowN, 2, true, 1, 3, 54322 * ms, 0},
		{54321 * ms, allowN, 2, false, 1, 3, 54322 * ms, ms},
		{54321 * ms, allowN, 1, true, 0, 4, 54322 * ms, 0},
		{54322 * ms, allowN, 1, true, 3, 1, 114322 * ms, 0},
		{60 * sec, peek, 0, true, 3, 1, 114322 * ms, 0},
		// 03:07:25.678 is in the window ending 03:08:00.000.
		{200 * sec, peek, 0, true, 4, 0, 234322 * ms, 0},
		{234321 * ms, allowN, 4, true, 0, 4, 234322 * ms, 0},
		{234321 * ms, allowN, 1, false, 0, 4, 234322 * ms, ms},
	})
}

// testFixedWindowAlignedBoundary: aligned windows of one second and of
// seven seconds (which do not divide a minute, so only floor(now/Window)
// arithmetic on Unix milliseconds gets them right).
func testFixedWindowAlignedBoundary(t *testing.T, e *env) {
	second := mustPolicy(t, "aligned-second", throttler.PerSecond(2).Using(throttler.AlignedWindow).Named("2/s aligned"))
	e.main.timeline(t, second, "boundary", []step{
		{0, allowN, 1, true, 1, 1, 322 * ms, 0},
		{321 * ms, allowN, 1, true, 0, 2, 322 * ms, 0},
		{321 * ms, allowN, 1, false, 0, 2, 322 * ms, ms},
		{322 * ms, allowN, 1, true, 1, 1, 1322 * ms, 0},
		{1321 * ms, allowN, 1, true, 0, 2, 1322 * ms, 0},
		{1321 * ms, allowN, 1, false, 0, 2, 1322 * ms, ms},
		{5 * sec, peek, 0, true, 2, 0, 5322 * ms, 0},
	})
	// T0 is 1893553445678 ms since the epoch; the multiples of 7000 around
	// it are T0+6.322s and T0+13.322s.
	seven := mustPolicy(t, "aligned-seven", throttler.Per(3, 7*sec).Using(throttler.AlignedWindow).Named("3/7s aligned"))
	e.main.timeline(t, seven, "boundary", []step{
		{0, allowN, 3, true, 0, 3, 6322 * ms, 0},
		{6321 * ms, allowN, 1, false, 0, 3, 6322 * ms, ms},
		{6322 * ms, allowN, 1, true, 2, 1, 13322 * ms, 0},
		{13321 * ms, allowN, 2, true, 0, 3, 13322 * ms, 0},
		{13322 * ms, peek, 0, true, 3, 0, 20322 * ms, 0},
	})
}

// testFixedWindowCostAboveOne: a request of cost n consumes n units; a
// denied cost-2 request leaves its unit for a cost-1 request; cost 0
// through AllowN is a peek.
func testFixedWindowCostAboveOne(t *testing.T, e *env) {
	p := mustPolicy(t, "costs", throttler.PerHour(10).Named("10/h"))
	e.main.timeline(t, p, "costly", []step{
		{0, allowN, 4, true, 6, 4, hour, 0},
		{sec, allowN, 5, true, 1, 9, hour, 0},
		{2 * sec, allowN, 2, false, 1, 9, hour, hour - 2*sec},
		{3 * sec, allowN, 1, true, 0, 10, hour, 0},
		{4 * sec, allowN, 0, true, 0, 10, hour, 0},
		{hour, allowN, 10, true, 0, 10, 2 * hour, 0},
		{hour + sec, allowN, 3, false, 0, 10, 2 * hour, hour - sec},
	})
}

// testPeekOpensNothing: a peek reports the window that would open now and
// stores nothing, for every algorithm; the first real request anchors the
// window at its own time.
func testPeekOpensNothing(t *testing.T, e *env) {
	anchored := mustPolicy(t, "peek-anchored", throttler.PerMinute(3).Named("anchored"))
	e.main.timeline(t, anchored, "peeker", []step{
		{0, peek, 0, true, 3, 0, 60 * sec, 0},
		{10 * sec, peek, 0, true, 3, 0, 70 * sec, 0},
		{30 * sec, allowN, 1, true, 2, 1, 90 * sec, 0},
		{40 * sec, peek, 0, true, 2, 1, 90 * sec, 0},
	})
	aligned := mustPolicy(t, "peek-aligned", throttler.PerMinute(3).Using(throttler.AlignedWindow).Named("aligned"))
	e.main.timeline(t, aligned, "peeker", []step{
		{0, peek, 0, true, 3, 0, 54322 * ms, 0},
		{60 * sec, peek, 0, true, 3, 0, 114322 * ms, 0},
		{120 * sec, allowN, 1, true, 2, 1, 174322 * ms, 0},
		{130 * sec, peek, 0, true, 2, 1, 174322 * ms, 0},
	})
	// GCRA 3/min: T = 20s. An absent TAT reads as now: full bucket, ResetAt
	// now.
	gcra := mustPolicy(t, "peek-gcra", throttler.PerMinute(3).Using(throttler.GCRA).Named("gcra"))
	e.main.timeline(t, gcra, "peeker", []step{
		{0, peek, 0, true, 3, 0, 0, 0},
		{10 * sec, peek, 0, true, 3, 0, 10 * sec, 0},
		{30 * sec, allowN, 1, true, 2, 1, 50 * sec, 0},
		{40 * sec, peek, 0, true, 2, 1, 50 * sec, 0},
	})
}

// testZeroCostOpensNothing: AllowN with cost 0 is a peek: it opens no
// window and consumes nothing, also on an exhausted window.
func testZeroCostOpensNothing(t *testing.T, e *env) {
	p := mustPolicy(t, "zero-cost",
		throttler.PerMinute(2).Named("anchored"),
		throttler.PerHour(5).Using(throttler.AlignedWindow).Named("aligned"),
		throttler.PerMinute(4).Using(throttler.GCRA).Named("gcra"))
	e.main.timeline(t, p, "zero", []step{
		{0, allowN, 0, true, 2, 0, 60 * sec, 0},
		{10 * sec, allowN, 0, true, 2, 0, 70 * sec, 0},
		{20 * sec, allowN, 2, true, 0, 2, 80 * sec, 0},
		{30 * sec, allowN, 0, true, 0, 2, 80 * sec, 0},
		{30 * sec, allowN, 0, true, 0, 2, 80 * sec, 0},
		{30 * sec, allowN, 1, false, 0, 2, 80 * sec, 50 * sec},
	})
	at(30*sec, e.main)
	r := e.main.peek(t, "final peek", p, "zero")
	// GCRA 4/min: T = 15s, B = 4; two units at T0+20s put TAT at T0+50s.
	checkLimit(t, "final peek", r, "aligned", true, 3, 2, 3354322*ms, 0)
	checkLimit(t, "final peek", r, "gcra", true, 2, 2, 50*sec, 0)
}

// testClosedWindowIgnored: a stored window whose ResetAt <= now is closed
// and ignored, whatever the store still holds (GitHub's Fix 2).
func testClosedWindowIgnored(t *testing.T, e *env) {
	anchored := mustPolicy(t, "closed-anchored", throttler.PerMinute(3).Named("3/min"))
	e.main.timeline(t, anchored, "stale", []step{
		{0, allowN, 3, true, 0, 3, 60 * sec, 0},
		{59*sec + 999*ms, peek, 0, true, 0, 3, 60 * sec, 0},
		{60 * sec, peek, 0, true, 3, 0, 120 * sec, 0},
		{61 * sec, allowN, 1, true, 2, 1, 121 * sec, 0},
		{hour, peek, 0, true, 3, 0, hour + 60*sec, 0},
		{hour, allowN, 3, true, 0, 3, hour + 60*sec, 0},
	})
	aligned := mustPolicy(t, "closed-aligned", throttler.PerMinute(3).Using(throttler.AlignedWindow).Named("3/min aligned"))
	e.main.timeline(t, aligned, "stale", []step{
		{0, allowN, 3, true, 0, 3, 54322 * ms, 0},
		{54322 * ms, peek, 0, true, 3, 0, 114322 * ms, 0},
		{54322 * ms, allowN, 2, true, 1, 2, 114322 * ms, 0},
		{hour, peek, 0, true, 3, 0, hour + 54322*ms, 0},
	})
}

// testClosedWindowIgnoredGCRA: a TAT at or before now counts as absent:
// the bucket is full and ResetAt is now.
func testClosedWindowIgnoredGCRA(t *testing.T, e *env) {
	// 3/min GCRA: T = 20s, B = 3.
	p := mustPolicy(t, "closed-gcra", throttler.PerMinute(3).Using(throttler.GCRA).Named("3/min gcra"))
	e.main.timeline(t, p, "stale", []step{
		{0, allowN, 3, true, 0, 3, 60 * sec, 0},
		{60 * sec, peek, 0, true, 3, 0, 60 * sec, 0},
		{hour, peek, 0, true, 3, 0, hour, 0},
		{hour, allowN, 1, true, 2, 1, hour + 20*sec, 0},
	})
}

// testClosedWindowAcrossInstances: whether a window is closed is decided by
// the request's now, not by the store: an instance whose clock lags by 1 ms
// still sees the window that another instance already finds closed, and
// both then see the window the other opened.
func testClosedWindowAcrossInstances(t *testing.T, e *env) {
	p := mustPolicy(t, "closed-instances", throttler.PerMinute(3).Named("3/min"))
	lagging := e.newInstance(-ms)
	at(0, e.main, lagging)
	e.main.allow(t, "main at T0", p, "shared", 3)
	at(60*sec, e.main, lagging)
	e.main.timeline(t, p, "shared", []step{{60 * sec, peek, 0, true, 3, 0, 120 * sec, 0}})
	lagging.timeline(t, p, "shared", []step{{60 * sec, peek, 0, true, 0, 3, 60 * sec, 0}})
	e.main.timeline(t, p, "shared", []step{{60 * sec, allowN, 1, true, 2, 1, 120 * sec, 0}})
	lagging.timeline(t, p, "shared", []step{{60 * sec, allowN, 1, true, 1, 2, 120 * sec, 0}})
}

// testCostExceedsCapacityFixed: a cost above Max can never succeed: it is
// refused with ErrCostExceedsLimit, NeverAllowed and RetryAfter Never, and
// it changes nothing (the peek after it opens its window where it would
// have opened anyway).
func testCostExceedsCapacityFixed(t *testing.T, e *env) {
	p := mustPolicy(t, "too-costly", throttler.PerMinute(3).Named("3/min"))
	e.main.timeline(t, p, "greedy", []step{
		{0, allowN, 4, false, 3, 0, 60 * sec, never},
		{10 * sec, peek, 0, true, 3, 0, 70 * sec, 0},
		{10 * sec, allowN, 1, true, 2, 1, 70 * sec, 0},
		{20 * sec, allowN, 4, false, 2, 1, 70 * sec, never},
		{20 * sec, allowN, 1000, false, 2, 1, 70 * sec, never},
		{20 * sec, peek, 0, true, 2, 1, 70 * sec, 0},
		// An ordinary denial stays finite.
		{20 * sec, allowN, 3, false, 2, 1, 70 * sec, 50 * sec},
		{20 * sec, allowN, 2, true, 0, 3, 70 * sec, 0},
		{30 * sec, allowN, 4, false, 0, 3, 70 * sec, never},
	})
}

// testCostExceedsCapacityPolicy: a cost above one limit's capacity can
// never succeed, even while the other limits would allow it; that limit
// binds with RetryAfter Never and no limit changes.
func testCostExceedsCapacityPolicy(t *testing.T, e *env) {
	p := mustPolicy(t, "too-costly-policy",
		throttler.PerSecond(10).Named("10/s"),
		throttler.PerMinute(3).Named("3/min"),
		throttler.PerHour(100).Named("100/h"))
	at(0, e.main)
	e.main.allow(t, "t0", p, "greedy", 1)
	at(sec/2, e.main)
	r := e.main.allowNever(t, "t1 cost 4", p, "greedy", 4)
	checkBinding(t, "t1 cost 4", r, "3/min")
	checkLimit(t, "t1 cost 4", r, "10/s", true, 9, 1, sec, 0)
	checkLimit(t, "t1 cost 4", r, "3/min", false, 2, 1, 60*sec, never)
	checkLimit(t, "t1 cost 4", r, "100/h", true, 99, 1, hour, 0)
	r = e.main.peek(t, "t2 peek", p, "greedy")
	checkLimit(t, "t2 peek", r, "10/s", true, 9, 1, sec, 0)
	checkLimit(t, "t2 peek", r, "3/min", true, 2, 1, 60*sec, 0)
	checkLimit(t, "t2 peek", r, "100/h", true, 99, 1, hour, 0)
}
