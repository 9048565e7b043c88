package memcachedbackend

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/conformance"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// BenchmarkDecide measures allowed decisions through a Throttler against
// one real memcached, spread over 1024 identifiers, with 1, 16 and 64
// goroutines. It reports decisions per second and round trips per decision
// (counted by the backend, one per gomemcache call).
func BenchmarkDecide(b *testing.B) {
	addrs := sharedAddrs(b, 1)
	cases := []struct{ name, limits string }{
		{"fixed", "1000000000/h"},
		{"aligned", "1000000000/h aligned"},
		{"gcra", "1000000/s gcra"},
		{"three-limits", "100000000/s, 1000000000/min aligned, 1000000000/h"},
	}
	for _, c := range cases {
		for _, goroutines := range []int{1, 16, 64} {
			b.Run(fmt.Sprintf("%s/goroutines=%d", c.name, goroutines), func(b *testing.B) {
				backend, _ := newTestBackend(b, addrs)
				thr, _ := newThrottler(b, backend)
				p := mustPolicy(b, "bench", c.limits)
				ids := make([]string, 1024)
				for i := range ids {
					ids[i] = fmt.Sprintf("user:%d", i)
				}
				ctx := context.Background()
				// Open every window first: the steady state is what runs.
				for _, id := range ids {
					if _, err := thr.Allow(ctx, p, id); err != nil {
						b.Fatal(err)
					}
				}
				var next atomic.Int64
				var failed atomic.Bool
				before := backend.Stats()
				b.ResetTimer()
				start := time.Now()
				var wg sync.WaitGroup
				for range goroutines {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for {
							i := next.Add(1) - 1
							if i >= int64(b.N) {
								return
							}
							r, err := thr.Allow(ctx, p, ids[i%int64(len(ids))])
							if err != nil || r.Degraded || !r.Allowed {
								failed.Store(true)
								return
							}
						}
					}()
				}
				wg.Wait()
				elapsed := time.Since(start)
				b.StopTimer()
				if failed.Load() {
					b.Fatal("a decision failed or was denied")
				}
				after := backend.Stats()
				b.ReportMetric(float64(b.N)/elapsed.Seconds(), "decisions/s")
				b.ReportMetric(float64(after.RoundTrips-before.RoundTrips)/float64(b.N), "roundtrips/decision")
			})
		}
	}
}

// BenchmarkDenied measures denials of one exhausted identifier: the
// incr that goes over, the decr that gives the units back, and the read.
func BenchmarkDenied(b *testing.B) {
	backend, _ := newTestBackend(b, sharedAddrs(b, 1))
	thr, _ := newThrottler(b, backend)
	p := mustPolicy(b, "bench", "1/h")
	ctx := context.Background()
	if _, err := thr.Allow(ctx, p, "hot"); err != nil {
		b.Fatal(err)
	}
	before := backend.Stats()
	b.ResetTimer()
	for range b.N {
		r, err := thr.Allow(ctx, p, "hot")
		if err != nil || r.Allowed || r.Degraded {
			b.Fatalf("want a denial: %+v, %v", r, err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(backend.Stats().RoundTrips-before.RoundTrips)/float64(b.N), "roundtrips/decision")
}

// BenchmarkConformance runs the conformance suite's benchmarks (1, 16 and
// 64 goroutines; a hot identifier, many identifiers, a three-limit policy,
// peeks) against one real memcached, adding round trips per decision to
// the suite's decisions/s.
func BenchmarkConformance(b *testing.B) {
	addrs := sharedAddrs(b, 1)
	conformance.RunBenchmarks(b, func(_ context.Context, tb testing.TB) (conformance.Harness, error) {
		h := &countingHarness{harness: harness{addrs: addrs, prefix: freshPrefix()}}
		if bb, ok := tb.(*testing.B); ok {
			// Runs when the sub-benchmark's b.N decisions are done.
			bb.Cleanup(func() {
				if bb.N > 0 {
					bb.ReportMetric(float64(h.roundTrips())/float64(bb.N), "roundtrips/decision")
				}
			})
		}
		return h, nil
	})
}

// countingHarness is the conformance harness, remembering its backends so
// that their round trips can be summed.
type countingHarness struct {
	harness
	mu       sync.Mutex
	backends []*Backend
}

func (h *countingHarness) MakeBackend(ctx context.Context) (driver.Backend, error) {
	b, err := h.harness.MakeBackend(ctx)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	h.backends = append(h.backends, b.(*Backend))
	h.mu.Unlock()
	return b, nil
}

func (h *countingHarness) roundTrips() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var n uint64
	for _, b := range h.backends {
		n += b.Stats().RoundTrips
	}
	return n
}
