package conformance

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// Take up to N (SPEC "Take up to N"): the largest k <= n that every limit
// allows, charged to every limit at once; 0 when nothing fits, reported as
// the denial of one unit.

// testTakeUpToTightestLimit: a batch gets what the tightest limit leaves,
// and every limit is charged the same k.
func testTakeUpToTightestLimit(t *testing.T, e *env) {
	p := mustPolicy(t, "take", throttler.PerSecond(5).Named("5/s"), throttler.PerMinute(8).Named("8/min"))
	id := "batch"
	e.at(0)
	r := e.main.take(t, "t0 take 10", p, id, 10)
	checkTake(t, "t0 take 10", r, 5, map[string]int64{"5/s": 5, "8/min": 5})
	e.at(sec)
	r = e.main.take(t, "t1s take 10", p, id, 10)
	checkTake(t, "t1s take 10", r, 3, map[string]int64{"5/s": 3, "8/min": 8})
	e.at(2 * sec)
	r = e.main.take(t, "t2s take 10", p, id, 10)
	checkTake(t, "t2s take 10", r, 0, map[string]int64{"5/s": 0, "8/min": 8})
	// Nothing fits: the denial of one unit, waiting for the minute window.
	if r.Binding != "8/min" || r.RetryAfter != minute-2*sec {
		t.Errorf("t2s take 10: binding %s RetryAfter %v, want 8/min and %v", r.Binding, r.RetryAfter, minute-2*sec)
	}
	e.at(minute)
	r = e.main.take(t, "t60s take 2", p, id, 2)
	checkTake(t, "t60s take 2", r, 2, map[string]int64{"5/s": 2, "8/min": 2})
}

// testTakeUpToEveryAlgorithm: GCRA and a sliding window grant exactly their
// Remaining; n beyond the capacity gets at most the capacity.
func testTakeUpToEveryAlgorithm(t *testing.T, e *env) {
	p := mustPolicy(t, "take-mixed",
		throttler.PerMinute(10).WithBurst(4).Named("gcra"),
		throttler.PerMinute(20).Using(throttler.SlidingWindow).Named("sliding"),
		throttler.PerHour(100).Using(throttler.AlignedWindow).Named("aligned"))
	e.at(0)
	r := e.main.take(t, "take 50", p, "x", 50)
	checkTake(t, "take 50", r, 4, map[string]int64{"gcra": 4, "sliding": 4, "aligned": 4})
	// GCRA 10/min burst 4: T = 6 s; 13 s later two units have dripped back.
	e.at(13 * sec)
	r = e.main.take(t, "take 50 at 13s", p, "x", 50)
	checkTake(t, "take 50 at 13s", r, 2, map[string]int64{"gcra": 4, "sliding": 6, "aligned": 6})
	e.at(13 * sec)
	r = e.main.take(t, "take 1 at 13s", p, "x", 1)
	checkTake(t, "take 1 at 13s", r, 0, map[string]int64{"gcra": 4, "sliding": 6, "aligned": 6})
	if r.RetryAfter != 5*sec {
		t.Errorf("take 1 at 13s: RetryAfter %v, want 5s (the next GCRA unit at 18s)", r.RetryAfter)
	}
}

// testConcurrentTakeExact: concurrent takes of up to 3 units never grant
// more than the limit in total, and do grant all of it.
func testConcurrentTakeExact(t *testing.T, e *env) {
	p := mustPolicy(t, "concurrent-take", throttler.PerHour(100).Named("100/h"), throttler.PerMinute(1000).Using(throttler.SlidingWindow).Named("1000/min sliding"))
	e.at(0)
	var (
		mu      sync.Mutex
		granted int64
		errs    []string
		wg      sync.WaitGroup
	)
	deadline := time.Now().Add(burstTimeBound)
	for g := range burstGoroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < burstAttempts && time.Now().Before(deadline) && e.ctx.Err() == nil; i++ {
				r, err := e.main.thr.AllowUpTo(e.ctx, p, "hot", int64(1+(g+i)%3))
				mu.Lock()
				switch {
				case err != nil:
					errs = append(errs, err.Error())
				case r.Degraded:
					errs = append(errs, fmt.Sprintf("degraded: %v", r.Err))
				case r.Granted < 0 || r.Granted > 3 || r.Allowed != (r.Granted > 0):
					errs = append(errs, fmt.Sprintf("granted %d, allowed %v", r.Granted, r.Allowed))
				default:
					granted += r.Granted
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		t.Error(err)
	}
	if granted != 100 {
		t.Errorf("%d units granted in all, want exactly 100", granted)
	}
	r := e.main.peek(t, "after", p, "hot")
	if r.Limits()[0].Used != 100 || r.Limits()[1].Used != 100 {
		t.Errorf("after the burst: used %d and %d, want 100 on both limits", r.Limits()[0].Used, r.Limits()[1].Used)
	}
}

// take runs AllowUpTo and checks the invariants every result keeps.
func (in *instance) take(t *testing.T, label string, p *throttler.Policy, id string, n int64) throttler.Result {
	t.Helper()
	r, err := in.thr.AllowUpTo(in.env.ctx, p, id, n)
	if err != nil {
		t.Fatalf("%s: AllowUpTo(%q, %s, %d): unexpected error: %v", label, p.Name(), printable(id), n, err)
	}
	cost := max(r.Granted, 1)
	checkInvariants(t, label, p, id, in.clock.Now(), cost, r)
	return r
}

// checkTake checks a take's grant and each limit's Used after it.
func checkTake(t *testing.T, label string, r throttler.Result, granted int64, used map[string]int64) {
	t.Helper()
	if r.Granted != granted || r.Allowed != (granted > 0) {
		t.Errorf("%s: Granted %d Allowed %v, want %d and %v", label, r.Granted, r.Allowed, granted, granted > 0)
	}
	for _, l := range r.Limits() {
		if want, ok := used[l.Name]; ok && l.Used != want {
			t.Errorf("%s: limit %s Used %d, want %d", label, l.Name, l.Used, want)
		}
	}
}
