package memcachedbackend

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/throttler"
)

// hotFigures are what one run of decisions on a hot identifier came to:
// the retries are lost compare-and-swap races (Stats.CASConflicts).
type hotFigures struct {
	decisions, allowed, degraded int
	conflicts, exhausted         uint64
	latencies                    []time.Duration
	elapsed                      time.Duration
}

func (f hotFigures) quantile(q float64) time.Duration {
	if len(f.latencies) == 0 {
		return 0
	}
	return f.latencies[min(int(q*float64(len(f.latencies))), len(f.latencies)-1)].Round(10 * time.Microsecond)
}

func (f hotFigures) String() string {
	return fmt.Sprintf("%d decisions (%d allowed, %d degraded) in %v, %.0f/s: %.3f retries per decision, %d retries exhausted; latency p50 %v, p99 %v, max %v",
		f.decisions, f.allowed, f.degraded, f.elapsed.Round(time.Millisecond), float64(f.decisions)/f.elapsed.Seconds(),
		float64(f.conflicts)/float64(f.decisions), f.exhausted, f.quantile(0.5), f.quantile(0.99), f.quantile(1))
}

// decideHot has goroutines callers decide each times on one identifier,
// through a throttler per backend (one per process, the callers spread
// over them), on the real clock with a call timeout long enough that
// latency shows as latency, and returns the figures; the backends'
// counters give the retries.
func decideHot(t *testing.T, backends []*Backend, p *throttler.Policy, goroutines, each int) hotFigures {
	thrs := make([]*throttler.Throttler, len(backends))
	for i, b := range backends {
		th, err := throttler.New(b, throttler.WithCallTimeout(2*testTimeout), throttler.WithLogger(nil))
		require.NoError(t, err)
		thrs[i] = th
	}
	ctx := context.Background()
	before := make([]Stats, len(backends))
	for i, b := range backends {
		before[i] = b.Stats()
	}
	var mu sync.Mutex
	var f hotFigures
	var wg sync.WaitGroup
	start := time.Now()
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat := make([]time.Duration, 0, each)
			allowed, degraded := 0, 0
			for range each {
				t0 := time.Now()
				r, err := thrs[g%len(thrs)].Allow(ctx, p, "hot")
				lat = append(lat, time.Since(t0))
				if err != nil {
					t.Error(err)
					return
				}
				if r.Degraded {
					degraded++
				} else if r.Allowed {
					allowed++
				}
			}
			mu.Lock()
			f.latencies = append(f.latencies, lat...)
			f.allowed += allowed
			f.degraded += degraded
			mu.Unlock()
		}()
	}
	wg.Wait()
	f.elapsed = time.Since(start)
	f.decisions = len(f.latencies)
	slices.Sort(f.latencies)
	for i, b := range backends {
		s := b.Stats()
		f.conflicts += s.CASConflicts - before[i].CASConflicts
		f.exhausted += s.RetriesExhausted - before[i].RetriesExhausted
	}
	return f
}

// TestHotIdentifierContention measures compare-and-swap retries and
// decision latency on one hot identifier under 64 goroutines, in one
// process and split over two (two Backends over one server), with the
// identifier's turns (the default) and without. The figures are logged;
// what is asserted is that a process's callers of one identifier, taking
// turns, never lose a race to each other: within one process, no retry.
func TestHotIdentifierContention(t *testing.T) {
	addrs := sharedAddrs(t, 1)
	for _, spec := range []string{"1000000/s gcra", "2000/s gcra", "1000000/s sliding", "1000000/h, 1000000/s gcra"} {
		t.Run(spec, func(t *testing.T) {
			p := mustPolicy(t, "hot", spec)
			for _, processes := range []int{1, 2} {
				for _, turns := range []bool{false, true} {
					first, _ := newTestBackend(t, addrs)
					backends := []*Backend{first}
					for len(backends) < processes {
						other, err := New(first.client, WithPrefix(first.prefix))
						require.NoError(t, err)
						t.Cleanup(other.CloseIdleConnections)
						backends = append(backends, other)
					}
					for _, b := range backends {
						b.turnsOff = !turns
					}
					f := decideHot(t, backends, p, 64, 100)
					t.Logf("%s, %d process(es), turns %v: %v", spec, processes, turns, f)
					if turns && processes == 1 {
						require.Zero(t, f.conflicts, "callers of one process lost races to each other")
					}
				}
			}
		})
	}
}

// TestTurnsComeInArrivalOrder checks the queue itself: turns come in the
// order asked, and a waiter whose context ends leaves the line without
// holding up those behind it.
func TestTurnsComeInArrivalOrder(t *testing.T) {
	var tr turns
	ctx := context.Background()
	require.NoError(t, tr.wait(ctx, "r")) // the first holds the turn at once

	// Ten more ask one after another (each is queued before the next
	// asks); the turns must come in that order.
	const n = 10
	var order []int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		queued := make(chan struct{})
		go func() {
			defer wg.Done()
			go func() {
				for {
					tr.mu.Lock()
					l := len(tr.queues["r"])
					tr.mu.Unlock()
					if l == i+2 {
						close(queued)
						return
					}
					time.Sleep(time.Millisecond)
				}
			}()
			require.NoError(t, tr.wait(ctx, "r"))
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			tr.done("r")
		}()
		<-queued
	}
	// One more gives up while it waits: it leaves the line.
	gone, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- tr.wait(gone, "r") }()
	for {
		tr.mu.Lock()
		l := len(tr.queues["r"])
		tr.mu.Unlock()
		if l == n+2 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	require.ErrorIs(t, <-errc, context.Canceled)

	before := tr.endedTurns("r").Load()
	tr.done("r") // the first ends its turn
	wg.Wait()
	assert.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, order)
	assert.Equal(t, before+n+1, tr.endedTurns("r").Load(), "every ended turn counted")
	tr.mu.Lock()
	assert.Empty(t, tr.queues, "the line is gone once empty")
	tr.mu.Unlock()

	// A waiter whose context has already ended leaves at once; the next in
	// line still gets the turn.
	require.NoError(t, tr.wait(ctx, "s"))
	late, cancelLate := context.WithCancel(ctx)
	cancelLate()
	require.ErrorIs(t, tr.wait(late, "s"), context.Canceled)
	next := make(chan error, 1)
	go func() { next <- tr.wait(ctx, "s") }()
	tr.done("s")
	require.NoError(t, <-next)
	tr.done("s")
	tr.mu.Lock()
	assert.Empty(t, tr.queues)
	tr.mu.Unlock()
}
