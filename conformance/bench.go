package conformance

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// manyIdentifiers is how many identifiers the spread-out benchmarks cycle
// through.
const manyIdentifiers = 10_000

// RunBenchmarks measures a backend through a Throttler on the wall clock
// (the wall clock), each sub-benchmark with a fresh harness from
// newHarness, at 1, 16 and 64 goroutines (explicit goroutines, so the
// count is what the name says whatever GOMAXPROCS is):
//
//   - HotIdentifier: every decision for one identifier, the worst case for
//     a store's lock or a Redis key;
//   - ManyIdentifiers: decisions spread over 10,000 identifiers;
//   - ThreeLimitPolicy: one identifier under a policy of three limits (a
//     second, minute and hour limit), decided together;
//   - Peek: peeks at one identifier (through Peeker when the backend has
//     it, otherwise Decide with cost 0);
//   - GCRA and SlidingWindow: ManyIdentifiers under a GCRA limit and under
//     a sliding-window limit, beside the fixed window's figure;
//   - TakeUpTo: AllowUpTo(5) over the 10,000 identifiers;
//   - Lease: a concurrency lease acquired and released for one identifier
//     (two backend calls per operation), skipped for a backend without
//     driver.Leaser; compare it with HotIdentifier, one fixed-window
//     decision per operation.
//
// Quotas are high enough that every decision is allowed, so the
// benchmarks measure the path that writes. Each reports decisions/s. A
// decision that fails or degrades fails the benchmark.
func RunBenchmarks(b *testing.B, newHarness HarnessMaker) {
	huge := driver.MaxQuota
	hot := benchPolicy(b, "bench-hot", throttler.PerHour(huge).Named("hour"))
	three := benchPolicy(b, "bench-three",
		throttler.PerSecond(huge).Named("second"),
		throttler.PerMinute(huge).Named("minute"),
		throttler.PerHour(huge).Named("hour"))
	gcra := benchPolicy(b, "bench-gcra", throttler.PerHour(huge).Using(throttler.GCRA).Named("hour"))
	sliding := benchPolicy(b, "bench-sliding", throttler.PerHour(1e9).Using(throttler.SlidingWindow).Named("hour"))
	many := make([]string, manyIdentifiers)
	for i := range many {
		many[i] = fmt.Sprintf("user:%d", i)
	}
	for _, c := range []struct {
		name string
		p    *throttler.Policy
		ids  []string
		op   benchOp
	}{
		{"HotIdentifier", hot, []string{"hot"}, benchAllow},
		{"ManyIdentifiers", hot, many, benchAllow},
		{"ThreeLimitPolicy", three, []string{"hot"}, benchAllow},
		{"Peek", hot, []string{"hot"}, benchPeek},
		{"GCRA", gcra, many, benchAllow},
		{"SlidingWindow", sliding, many, benchAllow},
		{"TakeUpTo", hot, many, benchTake},
	} {
		for _, goroutines := range []int{1, 16, 64} {
			b.Run(fmt.Sprintf("%s/goroutines=%d", c.name, goroutines), func(b *testing.B) {
				benchDecisions(b, newHarness, goroutines, c.p, c.ids, c.op)
			})
		}
	}
	conc, err := throttler.NewConcurrencyLimit("bench-lease", huge, time.Hour)
	if err != nil {
		b.Fatalf("NewConcurrencyLimit: %v", err)
	}
	for _, goroutines := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("Lease/goroutines=%d", goroutines), func(b *testing.B) {
			benchLeases(b, newHarness, goroutines, conc)
		})
	}
}

// benchLeases runs b.N acquire-and-release pairs for one identifier split
// over goroutines, and reports leases/s.
func benchLeases(b *testing.B, newHarness HarnessMaker, goroutines int, l *throttler.ConcurrencyLimit) {
	thr, ctx := benchThrottler(b, newHarness)
	var (
		failed   atomic.Int64
		firstErr atomic.Value
		wg       sync.WaitGroup
	)
	fail := func(err error) {
		if failed.Add(1) == 1 {
			firstErr.Store(err.Error())
		}
	}
	if lease, err := thr.Acquire(ctx, l, "hot"); errors.Is(err, errors.ErrUnsupported) {
		b.Skipf("backend has no concurrency leases: %v", err)
	} else if err == nil {
		_ = lease.Release(ctx)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for g := range goroutines {
		n := b.N / goroutines
		if g < b.N%goroutines {
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range n {
				lease, err := thr.Acquire(ctx, l, "hot")
				switch {
				case err != nil:
					fail(err)
					continue
				case lease.Degraded:
					fail(lease.Err)
				case !lease.Acquired:
					fail(fmt.Errorf("refused with %d in flight", lease.InFlight))
				}
				if err := lease.Release(ctx); err != nil {
					fail(err)
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d of %d lease operations failed; first: %v", n, b.N, firstErr.Load())
	}
	if s := b.Elapsed().Seconds(); s > 0 {
		b.ReportMetric(float64(b.N)/s, "leases/s")
	}
}

// benchThrottler makes a harness, a backend and a throttler over it on the
// wall clock, all closed when the benchmark ends.
func benchThrottler(b *testing.B, newHarness HarnessMaker) (*throttler.Throttler, context.Context) {
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	h, err := newHarness(ctx, b)
	if err != nil {
		b.Fatalf("making harness: %v", err)
	}
	b.Cleanup(h.Close)
	backend, err := h.MakeBackend(ctx)
	if err != nil {
		b.Fatalf("MakeBackend: %v", err)
	}
	thr, err := throttler.New(backend,
		throttler.WithLogger(nil),
		throttler.WithObserver(&failureLog{}),
		throttler.WithCallTimeout(callTimeoutOf(b, h)))
	if err != nil {
		b.Fatalf("throttler.New: %v", err)
	}
	return thr, ctx
}

// benchOp is the operation a benchmark repeats.
type benchOp int

const (
	benchAllow benchOp = iota // AllowN(1)
	benchPeek                 // Peek
	benchTake                 // AllowUpTo(5)
)

func benchPolicy(b *testing.B, name string, limits ...throttler.Limit) *throttler.Policy {
	b.Helper()
	p, err := throttler.NewPolicy(name, limits)
	if err != nil {
		b.Fatalf("NewPolicy(%q): %v", name, err)
	}
	checkNotation(b, p)
	return p
}

// benchDecisions runs b.N decisions split over goroutines, goroutine g
// cycling through ids from its own offset.
func benchDecisions(b *testing.B, newHarness HarnessMaker, goroutines int, p *throttler.Policy, ids []string, op benchOp) {
	thr, ctx := benchThrottler(b, newHarness)
	var (
		failed   atomic.Int64
		firstErr atomic.Value
		wg       sync.WaitGroup
	)
	b.ReportAllocs()
	b.ResetTimer()
	for g := range goroutines {
		n := b.N / goroutines
		if g < b.N%goroutines {
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			next := (g * 7919) % len(ids)
			for range n {
				var (
					r   throttler.Result
					err error
				)
				switch op {
				case benchPeek:
					r, err = thr.Peek(ctx, p, ids[next])
				case benchTake:
					r, err = thr.AllowUpTo(ctx, p, ids[next], 5)
				default:
					r, err = thr.AllowN(ctx, p, ids[next], 1)
				}
				if err == nil && r.Degraded {
					err = r.Err
				}
				if err != nil {
					if failed.Add(1) == 1 {
						firstErr.Store(err.Error())
					}
				}
				if next++; next == len(ids) {
					next = 0
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	if n := failed.Load(); n > 0 {
		b.Fatalf("%d of %d decisions failed; first: %v", n, b.N, firstErr.Load())
	}
	if s := b.Elapsed().Seconds(); s > 0 {
		b.ReportMetric(float64(b.N)/s, "decisions/s")
	}
}
