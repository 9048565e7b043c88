package memcachedbackend

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// nthPublish returns a beforePublish hook that runs f once, before the
// n-th window a call publishes (after its n-1 first openings).
func nthPublish(b *Backend, n int, f func()) func(string) {
	var calls int
	return func(string) {
		calls++
		if calls == n {
			b.hooks.beforePublish = nil
			f()
		}
	}
}

// waitFor waits for ch to be closed, failing the test after a generous
// bound rather than hanging.
func waitFor(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(4 * testTimeout):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// decideAt runs one decision of cost 1 at now straight on the backend.
func decideAt(t *testing.T, b *Backend, p *throttler.Policy, now time.Time) driver.Outcome {
	t.Helper()
	out, err := b.Decide(context.Background(), driver.Request{Policy: testkit.Compile(t, p), Identifier: "u", Cost: 1, Now: now})
	require.NoError(t, err)
	return out
}

// TestDeniedRequestOpensNothing runs the race the order of openings leaves
// ("two openings, Max 1"): R must open two windows, publishes the first,
// loses the second to S, and S's window is full after R's incr, so R is
// denied after its first opening was published.
func TestDeniedRequestOpensNothing(t *testing.T) {
	t.Run("one clock reading: the racing opener counts in the window", func(t *testing.T) {
		r, _ := newTestBackend(t, sharedAddrs(t, 1))
		s, err := New(r.client, WithPrefix(r.prefix))
		require.NoError(t, err)
		p := mustPolicy(t, "two", "10/min, 1/h")
		var byS driver.Outcome
		r.hooks.beforePublish = nthPublish(r, 2, func() { byS = decideAt(t, s, p, t0) })

		byR := decideAt(t, r, p, t0)
		assert.False(t, byR.Allowed, "R lost the hourly window to S, whose window is full")
		require.True(t, byS.Allowed)

		// S went through R's minute window before opening the hourly one:
		// the window holds S's unit and is exactly the one S would have
		// opened itself.
		peek, err := r.Peek(context.Background(), driver.Request{Policy: testkit.Compile(t, p), Identifier: "u", Now: t0.Add(time.Second)})
		require.NoError(t, err)
		assert.Equal(t, driver.State{Used: 1, End: t0.Add(time.Minute).UnixMilli()}, peek.States[0])
		assert.Equal(t, driver.State{Used: 1, End: t0.Add(time.Hour).UnixMilli()}, peek.States[1])
		assert.Equal(t, uint64(0), r.Stats().OpeningsRetracted, "S counts in it: nothing to retract")
		assert.Equal(t, uint64(0), r.Stats().RollbackFailures)
	})

	t.Run("readings across a window end: the opening is retracted", func(t *testing.T) {
		r, raw := newTestBackend(t, sharedAddrs(t, 1))
		s, err := New(r.client, WithPrefix(r.prefix))
		require.NoError(t, err)
		p := mustPolicy(t, "across", "10/min, 1/30s")
		require.True(t, decideAt(t, r, p, t0).Allowed)

		// At R's reading the minute window opened at t0 has closed; at S's,
		// a millisecond earlier, it is still open and S counts in it. The
		// 30 s window has closed for both. S runs after R's read and before
		// R's first publish: S counts in the old minute window and opens
		// the 30 s one, which R then loses and finds full.
		atR := t0.Add(time.Minute)
		atS := atR.Add(-time.Millisecond)
		var byS driver.Outcome
		r.hooks.beforePublish = nthPublish(r, 1, func() { byS = decideAt(t, s, p, atS) })

		byR := decideAt(t, r, p, atR)
		assert.False(t, byR.Allowed)
		require.True(t, byS.Allowed)
		assert.Equal(t, uint64(1), r.Stats().OpeningsRetracted)
		assert.Equal(t, uint64(0), r.Stats().RollbackFailures)
		assert.Equal(t, driver.State{}, byR.States[0], "reported as absent: R opened nothing")

		// The minute window R opened is retracted: its item still names a
		// counter, which holds the marker.
		k := newKeys(r.prefix, testkit.Compile(t, p), "u")
		it, err := raw.Get(k.window(0))
		require.NoError(t, err)
		w, ok := parseWindow(it.Value)
		require.True(t, ok)
		assert.Equal(t, atR.Add(time.Minute).UnixMilli(), w.end)
		it, err = raw.Get(k.counter(0, w))
		require.NoError(t, err)
		v, ok := parseInt(it.Value)
		require.True(t, ok)
		assert.GreaterOrEqual(t, v, retractedFloor)

		// Everyone takes it for absent: a peek reports the window that would
		// open now, a refund gives nothing back and resurrects nothing, and
		// the next request opens a window at its own reading, not at R's.
		later := atR.Add(10 * time.Second)
		req := driver.Request{Policy: testkit.Compile(t, p), Identifier: "u", Now: later}
		peek, err := r.Peek(context.Background(), req)
		require.NoError(t, err)
		assert.Equal(t, driver.State{}, peek.States[0])
		req.Cost = 1000
		refund, err := r.Refund(context.Background(), req)
		require.NoError(t, err)
		assert.Equal(t, driver.State{}, refund.States[0])
		next := decideAt(t, r, p, later)
		assert.True(t, next.Allowed)
		assert.Equal(t, driver.State{Used: 1, End: later.Add(time.Minute).UnixMilli()}, next.States[0])
	})
}

// TestDeniedOpeningResidualAcrossReadings reproduces the corner the
// package documentation declares: as in the retraction case above, but a
// third request T counts in R's new window between R's publish and R's
// check, and is denied too, giving its unit back only after R's check.
// R's window then stays open and empty until R's reading + Window.
func TestDeniedOpeningResidualAcrossReadings(t *testing.T) {
	r, _ := newTestBackend(t, sharedAddrs(t, 1))
	s, err := New(r.client, WithPrefix(r.prefix))
	require.NoError(t, err)
	tt, err := New(r.client, WithPrefix(r.prefix))
	require.NoError(t, err)
	p := mustPolicy(t, "residual", "10/min, 1/30s")
	require.True(t, decideAt(t, r, p, t0).Allowed)
	atR := t0.Add(time.Minute)
	atS := atR.Add(-time.Millisecond)
	r.hooks.beforePublish = nthPublish(r, 1, func() { require.True(t, decideAt(t, s, p, atS).Allowed) })

	// T reads at S's reading, where R's new minute window (ending at
	// atR+1min) is open and S's 30 s window is full. T counts in R's
	// window, is denied by S's, and holds its unit until released.
	holding, release := make(chan struct{}), make(chan struct{})
	tt.hooks.overLimit = func() {
		close(holding)
		<-release
	}
	var byT driver.Outcome
	var wg sync.WaitGroup
	r.hooks.beforeRetract = func(string) {
		r.hooks.beforeRetract = nil
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := tt.Decide(context.Background(), driver.Request{Policy: testkit.Compile(t, p), Identifier: "u", Cost: 1, Now: atS})
			assert.NoError(t, err)
			byT = out
		}()
		<-holding
	}
	byR := decideAt(t, r, p, atR)
	close(release)
	wg.Wait()
	assert.False(t, byR.Allowed)
	assert.False(t, byT.Allowed)
	assert.Equal(t, uint64(0), r.Stats().OpeningsRetracted, "T's unit was there at R's check")

	// The documented residual: a window opened by denied requests, empty,
	// ending at R's reading + Window. It never admits more than Max.
	later := atR.Add(10 * time.Second)
	peek, err := r.Peek(context.Background(), driver.Request{Policy: testkit.Compile(t, p), Identifier: "u", Now: later})
	require.NoError(t, err)
	assert.Equal(t, driver.State{Used: 0, End: atR.Add(time.Minute).UnixMilli()}, peek.States[0])
}

// TestGiveBackOutlivesTheContext ends the call's context between the
// units taken and their give-back: the give-back runs on its own budget,
// so the units come back and nothing counts as a rollback failure.
func TestGiveBackOutlivesTheContext(t *testing.T) {
	closed := throttler.WithFailureMode(throttler.FailClosed)

	t.Run("denial", func(t *testing.T) {
		b, _ := newTestBackend(t, sharedAddrs(t, 1))
		thr, _ := newThrottler(t, b)
		p := mustPolicy(t, "deny", "2/min", closed)
		for range 2 {
			r, err := thr.Allow(context.Background(), p, "u")
			require.NoError(t, err)
			require.True(t, r.Allowed)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		gaveBack := make(chan struct{})
		b.hooks.afterGiveBack = func() { close(gaveBack) }
		b.hooks.overLimit = func() {
			b.hooks.overLimit = nil
			cancel() // the incr went over; the decr is still to come
		}
		r, err := thr.Allow(ctx, p, "u")
		require.NoError(t, err)
		assert.False(t, r.Allowed)
		assert.Equal(t, int64(2), r.Used, "reported without its own unit")
		waitFor(t, gaveBack, "the give-back")
		b.hooks.afterGiveBack = nil

		peek, err := thr.Peek(context.Background(), p, "u")
		require.NoError(t, err)
		assert.Equal(t, int64(2), peek.Used, "the denied unit was given back")
		assert.Equal(t, uint64(0), b.Stats().RollbackFailures)
	})

	t.Run("failure after units were taken", func(t *testing.T) {
		b, _ := newTestBackend(t, sharedAddrs(t, 1))
		p := mustPolicy(t, "fail", "5/min, 10/min gcra")
		require.True(t, decideAt(t, b, p, t0).Allowed)

		// The minute window (opened a second earlier) takes its unit
		// first; the context ends before the GCRA write, which then fails:
		// the call is a failure, which the throttler turns into a denial
		// under FailClosed.
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		gaveBack := make(chan struct{})
		b.hooks.afterGiveBack = func() { close(gaveBack) }
		b.hooks.beforeCAS = func() {
			b.hooks.beforeCAS = nil
			cancel()
		}
		_, err := b.Decide(ctx, driver.Request{Policy: testkit.Compile(t, p), Identifier: "u", Cost: 1, Now: t0.Add(time.Second)})
		assert.ErrorIs(t, err, context.Canceled)
		waitFor(t, gaveBack, "the give-back")
		b.hooks.afterGiveBack = nil

		peek, err := b.Peek(context.Background(), driver.Request{Policy: testkit.Compile(t, p), Identifier: "u", Now: t0.Add(time.Second)})
		require.NoError(t, err)
		assert.Equal(t, int64(1), peek.States[0].Used, "the failed call's unit was given back")
		assert.Equal(t, uint64(0), b.Stats().RollbackFailures)
	})
}

// TestZeroBackendIsAnError calls every method of a Backend that New did not
// build: errors errors.Is can match, never a panic.
func TestZeroBackendIsAnError(t *testing.T) {
	p := mustPolicy(t, "zero", "1/s, 1/s gcra")
	req := driver.Request{Policy: testkit.Compile(t, p), Identifier: "u", Cost: 1, Now: t0}
	ctx := context.Background()
	for name, b := range map[string]*Backend{"zero value": {}, "nil pointer": nil} {
		t.Run(name, func(t *testing.T) {
			_, err := b.Decide(ctx, req)
			assert.ErrorIs(t, err, driver.ErrNotInitialized)
			_, err = b.Decide(ctx, driver.Request{Policy: testkit.Compile(t, p), Identifier: "u", Now: t0})
			assert.ErrorIs(t, err, driver.ErrNotInitialized, "cost 0")
			_, err = b.Peek(ctx, req)
			assert.ErrorIs(t, err, driver.ErrNotInitialized)
			_, err = b.Refund(ctx, req)
			assert.ErrorIs(t, err, driver.ErrNotInitialized)
			assert.ErrorIs(t, b.Reset(ctx, testkit.Compile(t, p), "u"), driver.ErrNotInitialized)
			assert.ErrorIs(t, b.Ping(ctx), driver.ErrNotInitialized)
			assert.Equal(t, Stats{}, b.Stats())

			if b != nil {
				_, err := testkit.Throttler(t, b, throttler.WithLogger(nil)).Allow(ctx, p, "u")
				assert.ErrorIs(t, err, throttler.ErrNotInitialized, "an error, never a silent allow")
			} else {
				_, err := throttler.New(b)
				assert.ErrorIs(t, err, throttler.ErrNotInitialized)
			}
		})
	}
}

// TestConcurrentCostOneMatchesSerialDecisions races requests of cost 1 at
// one clock reading per round, over a policy whose limits fall in all three
// ranks of the order (the second window opens at each round, the minute
// window is older, GCRA in between) and take turns binding. Each round
// must allow exactly as many as the reference algorithm does serially.
func TestConcurrentCostOneMatchesSerialDecisions(t *testing.T) {
	b1, _ := newTestBackend(t, sharedAddrs(t, 1))
	b2, err := New(b1.client, WithPrefix(b1.prefix))
	require.NoError(t, err)
	p := mustPolicy(t, "ranks", "2/s, 7/min, 6/min gcra burst=4")
	clock := throttlertest.NewManualClock(t0)
	thrs := []*throttler.Throttler{
		testkit.Throttler(t, b1, throttler.WithClock(clock), throttler.WithCallTimeout(2*testTimeout)),
		testkit.Throttler(t, b2, throttler.WithClock(clock), throttler.WithCallTimeout(2*testTimeout)),
	}
	const goroutines, perGoroutine = 12, 2
	dp := testkit.Compile(t, p)
	reference := make([]driver.State, len(p.Limits()))
	var totalAllowed int64
	for round := range 6 {
		now := t0.Add(time.Duration(round) * 2 * time.Second)
		clock.Set(now)
		var want int64
		for range goroutines * perGoroutine {
			if driver.Decide(dp, now, 1, reference) {
				want++
			}
		}
		var allowed atomic.Int64
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range perGoroutine {
					r, err := thrs[g%2].Allow(context.Background(), p, "hot")
					if assert.NoError(t, err) && assert.False(t, r.Degraded, "%v", r.Err) && r.Allowed {
						allowed.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		assert.Equal(t, want, allowed.Load(), "round %d", round)
		totalAllowed += allowed.Load()
		peek, err := thrs[0].Peek(context.Background(), p, "hot")
		require.NoError(t, err)
		assert.Equal(t, reference[1].Used, peek.Limits()[1].Used, "round %d: the minute window holds exactly the allowed units", round)
	}
	assert.Positive(t, totalAllowed)
	assert.Zero(t, b1.Stats().RollbackFailures+b2.Stats().RollbackFailures)
}

// TestEvictedCounterReopensLast evicts an older window's counter: the
// window must be opened again, which is left to the last rank, after the
// limits that can still deny, so a denied request does not reopen it.
func TestEvictedCounterReopensLast(t *testing.T) {
	for _, hourFull := range []bool{false, true} {
		name := "allowed: reopened at its own reading"
		if hourFull {
			name = "denied by a later limit: nothing reopened"
		}
		t.Run(name, func(t *testing.T) {
			b, raw := newTestBackend(t, sharedAddrs(t, 1))
			hourly := "5/h"
			if hourFull {
				hourly = "1/h"
			}
			p := mustPolicy(t, "evict", "10/min, "+hourly)
			require.True(t, decideAt(t, b, p, t0).Allowed)
			k := newKeys(b.prefix, testkit.Compile(t, p), "u")
			it, err := raw.Get(k.window(0))
			require.NoError(t, err)
			before := string(it.Value)
			w, ok := parseWindow(it.Value)
			require.True(t, ok)
			require.NoError(t, raw.Delete(k.counter(0, w)))

			now := t0.Add(time.Second)
			out := decideAt(t, b, p, now)
			assert.Equal(t, uint64(1), b.Stats().WindowsLost)
			it, err = raw.Get(k.window(0))
			require.NoError(t, err)
			if hourFull {
				assert.False(t, out.Allowed)
				assert.Equal(t, before, string(it.Value), "the window item is untouched")
				assert.Equal(t, driver.State{}, out.States[0])
				return
			}
			require.True(t, out.Allowed)
			assert.Equal(t, driver.State{Used: 1, End: now.Add(time.Minute).UnixMilli()}, out.States[0], "a fresh window")
			assert.Equal(t, int64(2), out.States[1].Used)
			assert.NotEqual(t, before, string(it.Value), "a new incarnation")
		})
	}
}

// TestOneOrderAtOneReading checks the order every request takes its units
// in. At one reading, U has opened the second window and taken the last
// unit of the (older) minute window. T finds the second window open; had T
// taken its units "open windows first, in policy order", it would hold a
// unit of the second window while the minute window denies it, and a
// request that read before U's opening (and so takes the minute window
// first) could be denied by that unit: two denials for one free unit.
// Ranked by start, T takes the older minute window first, like everyone.
func TestOneOrderAtOneReading(t *testing.T) {
	b, raw := newTestBackend(t, sharedAddrs(t, 1))
	p := mustPolicy(t, "order", "2/s, 2/min")
	require.True(t, decideAt(t, b, p, t0).Allowed)
	now := t0.Add(2 * time.Second)
	u := decideAt(t, b, p, now)
	require.True(t, u.Allowed, "U opens the second window and fills the minute window")

	k := newKeys(b.prefix, testkit.Compile(t, p), "u")
	it, err := raw.Get(k.window(0))
	require.NoError(t, err)
	second, ok := parseWindow(it.Value)
	require.True(t, ok)
	var heldAtDenial int64 = -1
	b.hooks.overLimit = func() {
		b.hooks.overLimit = nil
		it, err := raw.Get(k.counter(0, second))
		require.NoError(t, err)
		heldAtDenial, _ = parseInt(it.Value)
	}
	out := decideAt(t, b, p, now)
	assert.False(t, out.Allowed)
	assert.Equal(t, int64(1), heldAtDenial, "T was denied by the minute window before taking a unit of the second")
	assert.Equal(t, driver.State{Used: 1, End: now.Add(time.Second).UnixMilli()}, out.States[0])
	assert.Equal(t, int64(2), out.States[1].Used)
}
