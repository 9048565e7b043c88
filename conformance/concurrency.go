package conformance

import (
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// Concurrency: SPEC "Concurrency". Every burst below runs at one frozen
// clock reading, so how many requests fit is exact whatever the
// interleaving: with cost 1, exactly Max per fixed window and exactly what
// the GCRA formula allows.

const (
	burstGoroutines = 32
	burstAttempts   = 20 // per goroutine
	// burstTimeBound stops a burst that takes too long, so a slow or stuck
	// backend fails the subtest instead of running on.
	burstTimeBound = 20 * time.Second
)

// burst is the tally of one concurrent burst.
type burst struct {
	attempts, allowed int
	units             int64
	resetAts          map[time.Time]int // binding ResetAt of every result, UTC
	costsAllowed      map[int64]int
}

// hammer runs goroutines x attempts decisions for id, goroutine g through
// instances[g % len(instances)] with cost costOf(g, i), and tallies them.
// It fails the subtest if a decision errs or the time bound cuts the burst
// short.
func hammer(t *testing.T, e *env, instances []*instance, p *throttler.Policy, id string,
	costOf func(g, i int) int64) burst {
	t.Helper()
	var (
		mu   sync.Mutex
		b    = burst{resetAts: map[time.Time]int{}, costsAllowed: map[int64]int{}}
		errs []string
		wg   sync.WaitGroup
	)
	deadline := time.Now().Add(burstTimeBound)
	start := make(chan struct{})
	for g := range burstGoroutines {
		in := instances[g%len(instances)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := 0; i < burstAttempts && time.Now().Before(deadline) && e.ctx.Err() == nil; i++ {
				cost := costOf(g, i)
				r, err := in.thr.AllowN(e.ctx, p, id, cost)
				mu.Lock()
				b.attempts++
				switch {
				case err != nil:
					errs = append(errs, err.Error())
				case r.Degraded:
					errs = append(errs, fmt.Sprintf("degraded result: %v", r.Err))
				case r.Remaining < 0 || r.Used < 0 || r.Remaining != r.Limit-r.Used:
					errs = append(errs, fmt.Sprintf("Remaining %d, Used %d, Limit %d", r.Remaining, r.Used, r.Limit))
				default:
					b.resetAts[r.ResetAt.UTC()]++
					if r.Allowed {
						b.allowed++
						b.units += cost
						b.costsAllowed[cost]++
					}
				}
				mu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d of %d concurrent decisions failed; first: %s", len(errs), b.attempts, errs[0])
	}
	if want := burstGoroutines * burstAttempts; b.attempts < want {
		t.Fatalf("only %d of %d concurrent decisions ran within %v: the backend is too slow to check", b.attempts, want, burstTimeBound)
	}
	return b
}

func costOne(int, int) int64 { return 1 }

// expectAllowed checks a burst allowed exactly want requests, all carrying
// one ResetAt.
func expectAllowed(t *testing.T, label string, b burst, want int, resetAt time.Time) {
	t.Helper()
	if b.allowed != want {
		t.Errorf("%s: %d of %d concurrent requests allowed, want exactly %d", label, b.allowed, b.attempts, want)
	}
	if len(b.resetAts) != 1 || b.resetAts[resetAt.UTC()] == 0 {
		t.Errorf("%s: results carried ResetAt %v, want only T0+%v", label, describeResetAts(b.resetAts), resetAt.Sub(T0))
	}
}

func describeResetAts(m map[time.Time]int) string {
	var parts []string
	for at, n := range m {
		parts = append(parts, fmt.Sprintf("T0%+v (x%d)", at.Sub(T0), n))
	}
	sort.Strings(parts)
	return fmt.Sprint(parts)
}

// testConcurrentFixedWindowExact: many goroutines, cost 1, exactly Max
// allowed per anchored window, in two consecutive windows.
func testConcurrentFixedWindowExact(t *testing.T, e *env) {
	p := mustPolicy(t, "concurrent-fixed", throttler.PerHour(100).Named("100/h"))
	e.at(0)
	expectAllowed(t, "first window", hammer(t, e, []*instance{e.main}, p, "hot", costOne), 100, T0.Add(hour))
	e.at(hour)
	expectAllowed(t, "second window", hammer(t, e, []*instance{e.main}, p, "hot", costOne), 100, T0.Add(2*hour))
	e.main.timeline(t, p, "hot", []step{{hour, peek, 0, true, 0, 100, 2 * hour, 0}})
}

// testConcurrentAlignedWindowExact: the same for aligned windows, the
// second burst starting exactly on the boundary.
func testConcurrentAlignedWindowExact(t *testing.T, e *env) {
	p := mustPolicy(t, "concurrent-aligned", throttler.PerHour(100).Using(throttler.AlignedWindow).Named("100/h aligned"))
	e.at(0)
	expectAllowed(t, "first window", hammer(t, e, []*instance{e.main}, p, "hot", costOne), 100, T0.Add(3354322*ms))
	e.at(3354322 * ms)
	expectAllowed(t, "second window", hammer(t, e, []*instance{e.main}, p, "hot", costOne), 100, T0.Add(3354322*ms+hour))
}

// testConcurrentGCRAExact: GCRA never allows more than its formula: a full
// bucket of B at once, then exactly k after k emission intervals.
func testConcurrentGCRAExact(t *testing.T, e *env) {
	// 50/h: T = 72s, B = 50.
	p := mustPolicy(t, "concurrent-gcra", throttler.PerHour(50).Using(throttler.GCRA).Named("50/h gcra"))
	e.at(0)
	b := hammer(t, e, []*instance{e.main}, p, "hot", costOne)
	if b.allowed != 50 {
		t.Errorf("full bucket: %d of %d allowed, want exactly 50", b.allowed, b.attempts)
	}
	e.at(3 * 72 * sec)
	b = hammer(t, e, []*instance{e.main}, p, "hot", costOne)
	if b.allowed != 3 {
		t.Errorf("after 3 emission intervals: %d of %d allowed, want exactly 3", b.allowed, b.attempts)
	}
	e.main.timeline(t, p, "hot", []step{{216 * sec, peek, 0, true, 0, 50, hour + 216*sec, 0}})
}

// testConcurrentCostAboveOne: concurrent requests of cost above one. Every
// backend consumes exactly what it allowed, never more than Max: a denied
// request leaves nothing behind, however it raced. An exact backend also
// allows exactly as many requests as fit; a backend documenting
// CostAboveOneInexactUnderConcurrency may deny some that would fit.
func testConcurrentCostAboveOne(t *testing.T, e *env) {
	inexact := e.limits.CostAboveOneInexactUnderConcurrency
	fixed := mustPolicy(t, "concurrent-cost-fixed", throttler.PerHour(100).Named("100/h"))
	gcra := mustPolicy(t, "concurrent-cost-gcra", throttler.PerHour(50).Using(throttler.GCRA).Named("50/h gcra"))
	e.at(0)
	for _, c := range []struct {
		p      *throttler.Policy
		id     string
		costOf func(g, i int) int64
		fit    int // requests that fit, for uniform costs; 0 for mixed
	}{
		{fixed, "cost-3", func(int, int) int64 { return 3 }, 33},
		{fixed, "cost-mixed", func(g, i int) int64 { return int64(1 + (g+i)%4) }, 0},
		{gcra, "cost-2", func(int, int) int64 { return 2 }, 25},
		{gcra, "cost-mixed", func(g, i int) int64 { return int64(1 + (g+i)%4) }, 0},
	} {
		label := c.p.Name() + " " + c.id
		b := hammer(t, e, []*instance{e.main}, c.p, c.id, c.costOf)
		capacity := capacity(c.p.Limits()[0])
		if b.units > capacity {
			t.Errorf("%s: allowed %d units (%v by cost), more than the limit's %d", label, b.units, b.costsAllowed, capacity)
		}
		// Used as a peek reports it is clamped to the capacity, so only
		// this comparison can see units that denied requests left behind.
		used := e.main.peek(t, label+" peek", c.p, c.id).Used
		if used != b.units {
			t.Errorf("%s: %d units used after allowing %d: denied requests consumed", label, used, b.units)
		}
		if inexact {
			continue
		}
		if c.fit > 0 && b.allowed != c.fit {
			t.Errorf("%s: %d of %d requests allowed, want exactly %d", label, b.allowed, b.attempts, c.fit)
		}
	}
}

// testConcurrentPolicyAllOrNothing: under concurrency every limit of a
// policy consumes together or not at all: each limit's Used is exactly the
// number of requests allowed, and the tightest limit caps each burst.
func testConcurrentPolicyAllOrNothing(t *testing.T, e *env) {
	p := mustPolicy(t, "concurrent-policy",
		throttler.PerSecond(10).Named("10/s"),
		throttler.PerMinute(25).Named("25/min"),
		throttler.PerHour(1000).Named("1000/h"))
	for i, want := range []int{10, 10, 5} {
		e.at(time.Duration(i) * sec)
		b := hammer(t, e, []*instance{e.main}, p, "hot", costOne)
		if b.allowed != want {
			t.Errorf("burst %d: %d of %d allowed, want exactly %d", i, b.allowed, b.attempts, want)
		}
	}
	r := e.main.peek(t, "after the bursts", p, "hot")
	checkLimit(t, "after the bursts", r, "10/s", true, 5, 5, 3*sec, 0)
	checkLimit(t, "after the bursts", r, "25/min", true, 0, 25, 60*sec, 0)
	checkLimit(t, "after the bursts", r, "1000/h", true, 975, 25, hour, 0)
}

// testConcurrentTwoInstances: two throttlers over two backends of one
// harness, clocks 700 ms apart, deciding at once: exactly Max allowed in
// total, and every result carries the ResetAt of the one window they share.
func testConcurrentTwoInstances(t *testing.T, e *env) {
	p := mustPolicy(t, "concurrent-instances", throttler.PerHour(100).Named("100/h"))
	other := e.newInstance(700 * ms)
	at(0, e.main, other)
	b := hammer(t, e, []*instance{e.main, other}, p, "hot", costOne)
	if b.allowed != 100 {
		t.Errorf("%d of %d allowed across two instances, want exactly 100", b.allowed, b.attempts)
	}
	if len(b.resetAts) != 1 {
		t.Fatalf("results carried ResetAt %v, want one for the shared window", describeResetAts(b.resetAts))
	}
	for resetAt := range b.resetAts {
		if !resetAt.Equal(T0.Add(hour)) && !resetAt.Equal(T0.Add(hour+700*ms)) {
			t.Errorf("shared window ResetAt T0%+v, want T0+1h or T0+1h0m0.7s (opened by either instance)", resetAt.Sub(T0))
		}
	}
}

// testConcurrentRefund: concurrent allow-then-refund pairs: at most 32
// units are ever held against a limit of 50, so every request is allowed,
// and once all are refunded nothing is used.
func testConcurrentRefund(t *testing.T, e *env) {
	e.requireRefunder()
	p := mustPolicy(t, "concurrent-refund", throttler.PerHour(50).Named("50/h"))
	e.at(0)
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []string
		done int
	)
	deadline := time.Now().Add(burstTimeBound)
	for range burstGoroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < burstAttempts && time.Now().Before(deadline) && e.ctx.Err() == nil; i++ {
				r, err := e.main.thr.AllowN(e.ctx, p, "hot", 1)
				if err == nil && r.Allowed && !r.Degraded {
					_, err = e.main.thr.Refund(e.ctx, p, "hot", 1)
				} else if err == nil {
					err = fmt.Errorf("denied or degraded with at most %d units held of 50 (Used %d, degraded %v)",
						burstGoroutines, r.Used, r.Degraded)
				}
				mu.Lock()
				done++
				if err != nil {
					errs = append(errs, err.Error())
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d of %d allow-refund pairs failed; first: %s", len(errs), done, errs[0])
	}
	if done < burstGoroutines*burstAttempts {
		t.Fatalf("only %d of %d pairs ran within %v", done, burstGoroutines*burstAttempts, burstTimeBound)
	}
	e.main.timeline(t, p, "hot", []step{{0, peek, 0, true, 50, 0, hour, 0}})
}

// testConcurrentDistinctIdentifiers: bursts on 16 identifiers at once
// each get exactly their own Max.
func testConcurrentDistinctIdentifiers(t *testing.T, e *env) {
	p := mustPolicy(t, "concurrent-ids", throttler.PerHour(10).Named("10/h"))
	e.at(0)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		allowed = map[string]int{}
		errs    []string
	)
	deadline := time.Now().Add(burstTimeBound)
	for g := range burstGoroutines {
		id := fmt.Sprintf("user:%d", g%16)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < burstAttempts && time.Now().Before(deadline) && e.ctx.Err() == nil; i++ {
				r, err := e.main.thr.AllowN(e.ctx, p, id, 1)
				mu.Lock()
				if err != nil || r.Degraded {
					errs = append(errs, fmt.Sprintf("%s: %v %v", id, err, r.Err))
				} else if r.Allowed {
					allowed[id]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d decisions failed; first: %s", len(errs), errs[0])
	}
	for g := range 16 {
		id := fmt.Sprintf("user:%d", g)
		if allowed[id] != 10 {
			t.Errorf("%s: %d allowed, want exactly 10", id, allowed[id])
		}
	}
}
