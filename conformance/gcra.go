package conformance

import (
	"fmt"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// GCRA timelines, worked out by hand from SPEC "GCRA": T = ceil(Window /
// Max) in microseconds, B = Burst (Max unless set), newTAT = max(TAT, now)
// + n*T, allowed iff newTAT - B*T <= now, Remaining = floor((now - (TAT' -
// B*T)) / T) clamped to [0, B], ResetAt = max(TAT', now), RetryAfter =
// newTAT - B*T - now.

// testGCRATimeline: 10/min without an explicit burst (T = 6s, B = 10).
func testGCRATimeline(t *testing.T, e *env) {
	p := mustPolicy(t, "gcra", throttler.PerMinute(10).Using(throttler.GCRA).Named("10/min gcra"))
	e.main.timeline(t, p, "user:42", []step{
		{0, allowN, 1, true, 9, 1, 6 * sec, 0},
		{0, allowN, 4, true, 5, 5, 30 * sec, 0},
		{3 * sec, peek, 0, true, 5, 5, 30 * sec, 0},
		{3 * sec, allowN, 5, true, 0, 10, 60 * sec, 0},
		{3 * sec, allowN, 1, false, 0, 10, 60 * sec, 3 * sec},
		{6*sec - us, allowN, 1, false, 0, 10, 60 * sec, us},
		{6 * sec, allowN, 1, true, 0, 10, 66 * sec, 0},
		{20 * sec, peek, 0, true, 2, 8, 66 * sec, 0},
		{20 * sec, allowN, 3, false, 2, 8, 66 * sec, 4 * sec},
		{20 * sec, allowN, 2, true, 0, 10, 78 * sec, 0},
		{200 * sec, peek, 0, true, 10, 0, 200 * sec, 0},
		{200 * sec, allowN, 10, true, 0, 10, 260 * sec, 0},
		{200 * sec, allowN, 11, false, 0, 10, 260 * sec, never},
	})
}

// testGCRABurstTimeline: 10/min with burst 3 (T = 6s, B = 3): the burst,
// not Max, is the capacity, the Limit and the largest possible cost.
func testGCRABurstTimeline(t *testing.T, e *env) {
	p := mustPolicy(t, "gcra-burst", throttler.PerMinute(10).WithBurst(3).Named("10/min burst 3"))
	e.main.timeline(t, p, "user:42", []step{
		{0, allowN, 1, true, 2, 1, 6 * sec, 0},
		{0, allowN, 2, true, 0, 3, 18 * sec, 0},
		{0, allowN, 1, false, 0, 3, 18 * sec, 6 * sec},
		{6 * sec, allowN, 1, true, 0, 3, 24 * sec, 0},
		{9 * sec, peek, 0, true, 0, 3, 24 * sec, 0},
		{12 * sec, allowN, 2, false, 1, 2, 24 * sec, 6 * sec},
		{12 * sec, allowN, 1, true, 0, 3, 30 * sec, 0},
		{100 * sec, peek, 0, true, 3, 0, 100 * sec, 0},
		{100 * sec, allowN, 4, false, 3, 0, 100 * sec, never},
		{100 * sec, allowN, 3, true, 0, 3, 118 * sec, 0},
	})
}

// testGCRAEmissionIntervalRoundsUp: 7/s gives T = ceil(1e6/7) = 142858µs,
// so the rate never exceeds the nominal one: a full bucket takes 1.000006s
// to refill, not 1s.
func testGCRAEmissionIntervalRoundsUp(t *testing.T, e *env) {
	p := mustPolicy(t, "gcra-rounding", throttler.PerSecond(7).Using(throttler.GCRA).Named("7/s gcra"))
	e.main.timeline(t, p, "user:42", []step{
		{0, allowN, 7, true, 0, 7, 1000006 * us, 0},
		{0, allowN, 1, false, 0, 7, 1000006 * us, 142858 * us},
		{sec, peek, 0, true, 6, 1, 1000006 * us, 0},
		{1000006 * us, peek, 0, true, 7, 0, 1000006 * us, 0},
		{1000006 * us, allowN, 1, true, 6, 1, 1142864 * us, 0},
	})
}

// testGCRACostAboveOne: 12/min burst 6 (T = 5s, B = 6) with costs of 2 to
// 6: each unit moves TAT by T.
func testGCRACostAboveOne(t *testing.T, e *env) {
	p := mustPolicy(t, "gcra-costs", throttler.PerMinute(12).WithBurst(6).Named("12/min burst 6"))
	e.main.timeline(t, p, "costly", []step{
		{0, allowN, 4, true, 2, 4, 20 * sec, 0},
		{0, allowN, 3, false, 2, 4, 20 * sec, 5 * sec},
		{0, allowN, 2, true, 0, 6, 30 * sec, 0},
		{7 * sec, allowN, 2, false, 1, 5, 30 * sec, 3 * sec},
		{7 * sec, allowN, 1, true, 0, 6, 35 * sec, 0},
		{20 * sec, allowN, 3, true, 0, 6, 50 * sec, 0},
		{20 * sec, allowN, 0, true, 0, 6, 50 * sec, 0},
		{50 * sec, peek, 0, true, 6, 0, 50 * sec, 0},
		{50 * sec, allowN, 6, true, 0, 6, 80 * sec, 0},
	})
}

// testGCRARetryAfterIsExact: after a denial, waiting RetryAfter is enough
// and one microsecond less is not, for every cost up to the burst.
func testGCRARetryAfterIsExact(t *testing.T, e *env) {
	// 10/min burst 3: T = 6s, B = 3; three units at T0 put TAT at T0+18s.
	p := mustPolicy(t, "gcra-retry", throttler.PerMinute(10).WithBurst(3).Named("10/min burst 3"))
	for cost := int64(1); cost <= 3; cost++ {
		id := fmt.Sprintf("retry-%d", cost)
		wait := 6 * sec * time.Duration(cost) // newTAT - B*T - now = 18s + cost*6s - 18s
		e.main.timeline(t, p, id, []step{
			{0, allowN, 3, true, 0, 3, 18 * sec, 0},
			{0, allowN, cost, false, 0, 3, 18 * sec, wait},
			{wait - us, allowN, cost, false, cost - 1, 3 - (cost - 1), 18 * sec, us},
			{wait, allowN, cost, true, 0, 3, 18*sec + wait, 0},
		})
	}
}

// testCostExceedsCapacityGCRA: above the burst (not Max) a GCRA request can
// never succeed and changes nothing.
func testCostExceedsCapacityGCRA(t *testing.T, e *env) {
	p := mustPolicy(t, "gcra-too-costly", throttler.PerMinute(10).WithBurst(3).Named("10/min burst 3"))
	e.main.timeline(t, p, "greedy", []step{
		{0, allowN, 4, false, 3, 0, 0, never},
		{0, allowN, 10, false, 3, 0, 0, never},
		{0, peek, 0, true, 3, 0, 0, 0},
		{0, allowN, 1, true, 2, 1, 6 * sec, 0},
		{sec, allowN, 4, false, 2, 1, 6 * sec, never},
		{sec, peek, 0, true, 2, 1, 6 * sec, 0},
		{sec, allowN, 3, false, 2, 1, 6 * sec, 5 * sec},
	})
}
