package memcachedbackend

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// t0 is where test clocks start: a realistic instant, not aligned to a
// second, so aligned and anchored windows end at different moments.
var t0 = time.Date(2030, time.January, 2, 3, 4, 5, 678_000_000, time.UTC)

// newThrottler returns a throttler over b with a manual clock at t0.
func newThrottler(tb testing.TB, b driver.Backend, opts ...throttler.Option) (*throttler.Throttler, *throttlertest.ManualClock) {
	clock := throttlertest.NewManualClock(t0)
	opts = append([]throttler.Option{throttler.WithClock(clock), throttler.WithCallTimeout(2 * testTimeout),
		throttler.WithLogger(nil)}, opts...)
	return testkit.Throttler(tb, b, opts...), clock
}

func mustPolicy(t testing.TB, name, limits string, opts ...throttler.Option) *throttler.Policy {
	t.Helper()
	p, err := throttler.ParsePolicy(name, limits, opts...)
	require.NoError(t, err)
	return p
}

// want is the expected top-level figures of one timeline step.
type want struct {
	at        time.Duration // clock offset from t0
	cost      int64
	allowed   bool
	used      int64
	resetAt   time.Duration // offset from t0
	retry     time.Duration
	isPeek    bool
	isRefund  bool
	bindingIs string
}

func runTimeline(t *testing.T, thr *throttler.Throttler, clock *throttlertest.ManualClock, p *throttler.Policy, id string, steps []want) {
	t.Helper()
	ctx := context.Background()
	for i, s := range steps {
		clock.Set(t0.Add(s.at))
		var r throttler.Result
		var err error
		switch {
		case s.isPeek:
			r, err = thr.Peek(ctx, p, id)
		case s.isRefund:
			r, err = thr.Refund(ctx, p, id, s.cost)
		default:
			r, err = thr.AllowN(ctx, p, id, s.cost)
		}
		require.NoError(t, err, "step %d", i)
		require.False(t, r.Degraded, "step %d: %v", i, r.Err)
		label := fmt.Sprintf("step %d (t0+%v cost %d)", i, s.at, s.cost)
		assert.Equal(t, s.allowed, r.Allowed, "%s: Allowed", label)
		assert.Equal(t, s.used, r.Used, "%s: Used", label)
		assert.Equal(t, r.Limit-s.used, r.Remaining, "%s: Remaining", label)
		assert.Equal(t, s.resetAt, r.ResetAt.Sub(t0), "%s: ResetAt", label)
		assert.Equal(t, s.retry, r.RetryAfter, "%s: RetryAfter", label)
		if s.bindingIs != "" {
			assert.Equal(t, s.bindingIs, r.Binding, "%s: Binding", label)
		}
	}
}

func TestFixedWindowTimelines(t *testing.T) {
	b, _ := newTestBackend(t, sharedAddrs(t, 1))
	thr, clock := newThrottler(t, b)
	const sec, minute = time.Second, time.Minute

	t.Run("anchored", func(t *testing.T) {
		p := mustPolicy(t, "anchored", "3/min")
		runTimeline(t, thr, clock, p, "user:1", []want{
			{at: 0, isPeek: true, allowed: true, used: 0, resetAt: minute},
			{at: 0, cost: 1, allowed: true, used: 1, resetAt: minute},
			{at: 10 * sec, cost: 2, allowed: true, used: 3, resetAt: minute},
			{at: 20 * sec, cost: 1, allowed: false, used: 3, resetAt: minute, retry: 40 * sec},
			{at: 30 * sec, isRefund: true, cost: 1, allowed: true, used: 2, resetAt: minute},
			{at: 31 * sec, cost: 1, allowed: true, used: 3, resetAt: minute},
			{at: minute, isPeek: true, allowed: true, used: 0, resetAt: 2 * minute},
			{at: minute + sec, cost: 1, allowed: true, used: 1, resetAt: 2*minute + sec},
			// A refund after the window closed does nothing.
			{at: 3 * minute, isRefund: true, cost: 1, allowed: true, used: 0, resetAt: 4 * minute},
		})
	})
	t.Run("aligned", func(t *testing.T) {
		p := mustPolicy(t, "aligned", "2/min aligned")
		end := t0.Truncate(minute).Add(minute).Sub(t0)
		runTimeline(t, thr, clock, p, "user:1", []want{
			{at: 0, cost: 1, allowed: true, used: 1, resetAt: end},
			{at: sec, cost: 1, allowed: true, used: 2, resetAt: end},
			{at: 2 * sec, cost: 1, allowed: false, used: 2, resetAt: end, retry: end - 2*sec},
			{at: end, cost: 2, allowed: true, used: 2, resetAt: end + minute},
		})
	})
	t.Run("clock backwards keeps the window", func(t *testing.T) {
		p := mustPolicy(t, "backwards", "5/min aligned")
		end := t0.Truncate(minute).Add(minute).Sub(t0)
		runTimeline(t, thr, clock, p, "user:1", []want{
			{at: end + sec, cost: 1, allowed: true, used: 1, resetAt: end + minute},
			// Back into the previous aligned slot: the stored window is
			// still open at this reading, so it is the one counted.
			{at: end - sec, cost: 1, allowed: true, used: 2, resetAt: end + minute},
		})
	})
	t.Run("denial opens nothing", func(t *testing.T) {
		p := mustPolicy(t, "two", "10/s, 1/h")
		runTimeline(t, thr, clock, p, "user:1", []want{
			{at: 0, cost: 1, allowed: true, used: 1, resetAt: time.Hour, bindingIs: "1/h"},
			{at: 5 * sec, cost: 1, allowed: false, used: 1, resetAt: time.Hour, retry: time.Hour - 5*sec, bindingIs: "1/h"},
		})
		clock.Set(t0.Add(6 * sec))
		r, err := thr.Peek(context.Background(), p, "user:1")
		require.NoError(t, err)
		// The /s window closed at t0+1s; the denial at t0+5s opened none.
		assert.Equal(t, 6*sec+sec, r.Limits()[0].ResetAt.Sub(t0))
		assert.Equal(t, int64(0), r.Limits()[0].Used)
	})
	t.Run("binding on deny is the largest RetryAfter", func(t *testing.T) {
		p := mustPolicy(t, "both", "1/s, 1/h")
		runTimeline(t, thr, clock, p, "user:1", []want{
			{at: 0, cost: 1, allowed: true, used: 1, resetAt: time.Hour, bindingIs: "1/h"},
			{at: 0, cost: 1, allowed: false, used: 1, resetAt: time.Hour, retry: time.Hour, bindingIs: "1/h"},
		})
	})
}

func TestGCRATimeline(t *testing.T) {
	b, _ := newTestBackend(t, sharedAddrs(t, 1))
	thr, clock := newThrottler(t, b)
	// 6/min: T = 10 s; burst 2.
	p := mustPolicy(t, "gcra", "6/min gcra burst=2")
	const sec = time.Second
	runTimeline(t, thr, clock, p, "user:1", []want{
		{at: 0, cost: 1, allowed: true, used: 1, resetAt: 10 * sec},
		{at: 0, cost: 1, allowed: true, used: 2, resetAt: 20 * sec},
		{at: sec, cost: 1, allowed: false, used: 2, resetAt: 20 * sec, retry: 9 * sec},
		{at: 10 * sec, cost: 1, allowed: true, used: 2, resetAt: 30 * sec},
		{at: 10 * sec, isRefund: true, cost: 1, allowed: true, used: 1, resetAt: 20 * sec},
		{at: 45 * sec, isPeek: true, allowed: true, used: 0, resetAt: 45 * sec},
	})
}

func TestMixedPolicyRollsBackEveryLimit(t *testing.T) {
	b, raw := newTestBackend(t, sharedAddrs(t, 1))
	thr, clock := newThrottler(t, b)
	ctx := context.Background()
	p := mustPolicy(t, "mixed", "100/min, 3/min gcra, 50/h aligned")
	for i := range 3 {
		r, err := thr.Allow(ctx, p, "u")
		require.NoError(t, err)
		require.True(t, r.Allowed, "request %d", i)
	}
	r, err := thr.Allow(ctx, p, "u")
	require.NoError(t, err)
	require.False(t, r.Allowed)
	assert.Equal(t, "3/min gcra", r.Binding)
	assert.Equal(t, int64(3), r.Limits()[0].Used)
	assert.Equal(t, int64(3), r.Limits()[2].Used)

	// A GCRA limit that only denies once an older window took its unit
	// (the minute window opened a second earlier comes first in the
	// order): make its CAS lose to a writer that fills the bucket.
	p2 := mustPolicy(t, "mixed2", "100/min, 2/min gcra")
	r, err = thr.Allow(ctx, p2, "v")
	require.NoError(t, err)
	require.True(t, r.Allowed)
	clock.Advance(time.Second)
	k := newKeys(b.prefix, testkit.Compile(t, p2), "v")
	b.hooks.beforeCAS = func() {
		b.hooks.beforeCAS = nil
		tat := clock.Now().Add(time.Minute).UnixMicro()
		require.NoError(t, raw.Set(&memcache.Item{Key: k.cas(1), Value: []byte(fmt.Sprint(tat)), Expiration: 120}))
	}
	before := b.Stats().RoundTrips
	r, err = thr.Allow(ctx, p2, "v")
	require.NoError(t, err)
	assert.False(t, r.Allowed)
	assert.Equal(t, int64(1), r.Limits()[0].Used, "the fixed window's unit was given back")
	// get, incr, CAS lost, reread GCRA, decr.
	assert.Equal(t, uint64(5), b.Stats().RoundTrips-before)
	peek, err := thr.Peek(ctx, p2, "v")
	require.NoError(t, err)
	assert.Equal(t, int64(1), peek.Limits()[0].Used)
	assert.Equal(t, uint64(0), b.Stats().RollbackFailures)
}

func TestPeekNeverWrites(t *testing.T) {
	b, raw := newTestBackend(t, sharedAddrs(t, 1))
	thr, _ := newThrottler(t, b)
	p := mustPolicy(t, "peek", "5/min, 10/h aligned, 3/s gcra")
	for range 3 {
		r, err := thr.Peek(context.Background(), p, "nobody")
		require.NoError(t, err)
		require.True(t, r.Allowed)
	}
	k := newKeys(b.prefix, testkit.Compile(t, p), "nobody")
	for i := range len(p.Limits()) {
		for _, key := range []string{k.window(i), k.cas(i)} {
			_, err := raw.Get(key)
			assert.ErrorIs(t, err, memcache.ErrCacheMiss, "key %s", key)
		}
	}
	// Cost 0 through Decide is a peek too.
	out, err := b.Decide(context.Background(), driver.Request{Policy: testkit.Compile(t, p), Identifier: "nobody", Now: t0})
	require.NoError(t, err)
	assert.True(t, out.Allowed)
	assert.Equal(t, make([]driver.State, 3), out.States)
	_, err = raw.Get(k.window(0))
	assert.ErrorIs(t, err, memcache.ErrCacheMiss)
}

func TestResetForgetsState(t *testing.T) {
	b, _ := newTestBackend(t, sharedAddrs(t, 1))
	thr, _ := newThrottler(t, b)
	ctx := context.Background()
	p := mustPolicy(t, "reset", "1/min, 1/min gcra")
	r, err := thr.Allow(ctx, p, "u")
	require.NoError(t, err)
	require.True(t, r.Allowed)
	r, err = thr.Allow(ctx, p, "u")
	require.NoError(t, err)
	require.False(t, r.Allowed)
	require.NoError(t, thr.Reset(ctx, p, "u"))
	r, err = thr.Allow(ctx, p, "u")
	require.NoError(t, err)
	assert.True(t, r.Allowed)
	// Resetting what does not exist is fine.
	require.NoError(t, thr.Reset(ctx, p, "never-seen"))
}

func TestPingAndConfig(t *testing.T) {
	b, _ := newTestBackend(t, sharedAddrs(t, 3))
	require.NoError(t, b.Ping(context.Background()))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.ErrorIs(t, b.Ping(ctx), context.Canceled)

	_, err := New(nil)
	assert.ErrorIs(t, err, driver.ErrInvalidOption)
	client := memcache.New("127.0.0.1:1")
	_, err = New(client, WithPrefix(""))
	assert.ErrorIs(t, err, driver.ErrInvalidOption)
	_, err = New(client, WithCASRetries(-1))
	assert.ErrorIs(t, err, driver.ErrInvalidOption)
	_, err = New(client, nil)
	assert.ErrorIs(t, err, driver.ErrInvalidOption)
	assert.ErrorContains(t, err, "memcached: nil Option")
	_, err = NewClient(0)
	assert.ErrorIs(t, err, driver.ErrInvalidOption)

	// Bad input to the backend itself is an error, never a panic.
	p := mustPolicy(t, "p", "1/s")
	_, err = b.Decide(context.Background(), driver.Request{Policy: testkit.Compile(t, nil), Identifier: "x", Cost: 1})
	assert.ErrorIs(t, err, throttler.ErrInvalidPolicy)
	_, err = b.Decide(context.Background(), driver.Request{Policy: testkit.Compile(t, p), Identifier: "", Cost: 1})
	assert.ErrorIs(t, err, driver.ErrInvalidOption)
	_, err = b.Decide(context.Background(), driver.Request{Policy: testkit.Compile(t, p), Identifier: "x", Cost: -1})
	assert.ErrorIs(t, err, driver.ErrInvalidOption)
	// A cost above capacity straight to the backend: denied, nothing written.
	out, err := b.Decide(context.Background(), driver.Request{Policy: testkit.Compile(t, p), Identifier: "x", Cost: 2, Now: t0})
	require.NoError(t, err)
	assert.False(t, out.Allowed)
}

func TestMalformedStoredValuesAreErrors(t *testing.T) {
	b, raw := newTestBackend(t, sharedAddrs(t, 1))
	p := mustPolicy(t, "bad", "5/min, 5/min gcra")
	k := newKeys(b.prefix, testkit.Compile(t, p), "u")
	req := driver.Request{Policy: testkit.Compile(t, p), Identifier: "u", Cost: 1, Now: t0}
	for _, c := range []struct{ key, value string }{
		{k.window(0), "not a window"},
		{k.window(0), "123 short"},
		{k.cas(1), "12x"},
	} {
		require.NoError(t, raw.Set(&memcache.Item{Key: c.key, Value: []byte(c.value), Expiration: 60}))
		_, err := b.Decide(context.Background(), req)
		assert.ErrorIs(t, err, driver.ErrBadReply, "value %q", c.value)
		require.NoError(t, raw.Delete(c.key))
	}
	// A counter that holds text: memcached refuses the incr.
	out, err := b.Decide(context.Background(), req)
	require.NoError(t, err)
	require.True(t, out.Allowed)
	it, err := raw.Get(k.window(0))
	require.NoError(t, err)
	w, ok := parseWindow(it.Value)
	require.True(t, ok)
	require.NoError(t, raw.Set(&memcache.Item{Key: k.counter(0, w), Value: []byte("abc"), Expiration: 60}))
	_, err = b.Decide(context.Background(), req)
	assert.Error(t, err)
}

func TestConcurrentCostOneIsExact(t *testing.T) {
	addrs := sharedAddrs(t, 1)
	// Two processes' worth of backends over one server.
	b1, _ := newTestBackend(t, addrs)
	b2, err := New(b1.client, WithPrefix(b1.prefix))
	require.NoError(t, err)
	p := mustPolicy(t, "exact", "40/min, 25/h, 30/min gcra burst=30")
	clock := throttlertest.NewManualClock(t0)
	thrs := []*throttler.Throttler{
		testkit.Throttler(t, b1, throttler.WithClock(clock), throttler.WithCallTimeout(2*testTimeout)),
		testkit.Throttler(t, b2, throttler.WithClock(clock), throttler.WithCallTimeout(2*testTimeout)),
	}
	const goroutines, perGoroutine = 16, 4
	batch := func() int64 {
		var allowed atomic.Int64
		var wg sync.WaitGroup
		for g := range goroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range perGoroutine {
					r, err := thrs[g%2].Allow(context.Background(), p, "hot")
					if !assert.NoError(t, err) || !assert.False(t, r.Degraded, "%v", r.Err) {
						return
					}
					if r.Allowed {
						allowed.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		return allowed.Load()
	}
	// Every window opens under contention: exactly the hourly 25 fit.
	assert.Equal(t, int64(25), batch())
	// An hour later the hourly window closed and the other two reopen.
	clock.Set(t0.Add(time.Hour))
	assert.Equal(t, int64(25), batch())
	// Ten minutes on, only the minute window closed; the hourly window
	// opened an hour in is full.
	clock.Set(t0.Add(time.Hour + 10*time.Minute))
	assert.Equal(t, int64(0), batch())
}

func TestConcurrentCostOneWithSecondLimitOpen(t *testing.T) {
	b, _ := newTestBackend(t, sharedAddrs(t, 1))
	thr, clock := newThrottler(t, b)
	// The minute window is open and the second window closed at each
	// batch: requests race to open the first limit while incrementing the
	// second, which must still be exact.
	p := mustPolicy(t, "order", "7/s, 1000/min")
	var total int64
	for round := range 5 {
		clock.Set(t0.Add(time.Duration(round) * 2 * time.Second))
		var allowed atomic.Int64
		var wg sync.WaitGroup
		for range 12 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 2 {
					r, err := thr.Allow(context.Background(), p, "hot")
					if assert.NoError(t, err) && assert.False(t, r.Degraded, "%v", r.Err) && r.Allowed {
						allowed.Add(1)
					}
				}
			}()
		}
		wg.Wait()
		assert.Equal(t, int64(7), allowed.Load(), "round %d", round)
		total += allowed.Load()
	}
	r, err := thr.Peek(context.Background(), p, "hot")
	require.NoError(t, err)
	assert.Equal(t, total, r.Limits()[1].Used)
}

func TestCostAboveOneMayDenySpuriouslyNeverOverAdmits(t *testing.T) {
	addrs := sharedAddrs(t, 1)
	b, _ := newTestBackend(t, addrs)
	other, err := New(b.client, WithPrefix(b.prefix)) // a second process
	require.NoError(t, err)
	thr, _ := newThrottler(t, b)
	thrOther, _ := newThrottler(t, other)
	ctx := context.Background()
	p := mustPolicy(t, "weak", "5/min")

	// Three units used; two remain.
	r, err := thr.AllowN(ctx, p, "u", 3)
	require.NoError(t, err)
	require.True(t, r.Allowed)

	// A request of cost 3 does not fit. Between its incr (the counter
	// reads 6) and its decr, a request of cost 1, which fits, runs.
	var during throttler.Result
	b.hooks.overLimit = func() {
		b.hooks.overLimit = nil
		during, err = thrOther.AllowN(ctx, p, "u", 1)
		require.NoError(t, err)
	}
	r, err = thr.AllowN(ctx, p, "u", 3)
	require.NoError(t, err)
	assert.False(t, r.Allowed, "cost 3 does not fit in 2")
	assert.False(t, during.Allowed, "the documented weakness: a fitting request denied while another's units are in flight")

	// Once the cost-3 units are given back, the two units are there.
	r, err = thrOther.AllowN(ctx, p, "u", 2)
	require.NoError(t, err)
	assert.True(t, r.Allowed)
	assert.Equal(t, int64(5), r.Used)

	// And under concurrency with mixed costs, never more than Max units.
	p2 := mustPolicy(t, "weak2", "20/min, 40/h")
	var units atomic.Int64
	var wg sync.WaitGroup
	for g := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range 6 {
				cost := int64(1 + (g+j)%3)
				r, err := thr.AllowN(ctx, p2, "mix", cost)
				if assert.NoError(t, err) && assert.False(t, r.Degraded) && r.Allowed {
					units.Add(cost)
				}
			}
		}()
	}
	wg.Wait()
	assert.LessOrEqual(t, units.Load(), int64(20))
	peek, err := thr.Peek(ctx, p2, "mix")
	require.NoError(t, err)
	assert.Equal(t, units.Load(), peek.Limits()[0].Used, "the counter holds exactly the allowed units")
	assert.Equal(t, units.Load(), peek.Limits()[1].Used)
}

func TestRetriesExhaustedIsCountedAndHandled(t *testing.T) {
	b, raw := newTestBackend(t, sharedAddrs(t, 1), WithCASRetries(3))
	p := mustPolicy(t, "cas", "10/min gcra")
	pClosed := mustPolicy(t, "cas", "10/min gcra", throttler.WithFailureMode(throttler.FailClosed))
	k := newKeys(b.prefix, testkit.Compile(t, p), "u")
	var observed []error
	var mu sync.Mutex
	thr, clock := newThrottler(t, b, throttler.WithObserver(throttler.ObserverFunc(func(_ context.Context, e throttler.Event) {
		if e.Err != nil {
			mu.Lock()
			observed = append(observed, e.Err)
			mu.Unlock()
		}
	})))
	ctx := context.Background()
	r, err := thr.Allow(ctx, p, "u")
	require.NoError(t, err)
	require.True(t, r.Allowed)

	// Every CAS loses to a writer that slips in between read and write.
	tat := clock.Now().Add(6 * time.Second).UnixMicro()
	b.hooks.beforeCAS = func() {
		require.NoError(t, raw.Set(&memcache.Item{Key: k.cas(0), Value: []byte(fmt.Sprint(tat)), Expiration: 60}))
	}
	before := b.Stats()
	r, err = thr.Allow(ctx, p, "u")
	require.NoError(t, err)
	assert.True(t, r.Degraded)
	assert.True(t, r.Allowed, "fail open")
	assert.ErrorIs(t, r.Err, ErrRetriesExhausted)
	assert.ErrorIs(t, r.Err, throttler.ErrBackend)

	r, err = thr.Allow(ctx, pClosed, "u")
	require.NoError(t, err)
	assert.True(t, r.Degraded)
	assert.False(t, r.Allowed, "fail closed")
	assert.ErrorIs(t, r.Err, ErrRetriesExhausted)

	after := b.Stats()
	assert.Equal(t, uint64(2), after.RetriesExhausted-before.RetriesExhausted)
	assert.Equal(t, uint64(2*4), after.CASConflicts-before.CASConflicts, "one attempt and three retries per call")
	mu.Lock()
	require.Len(t, observed, 2)
	assert.ErrorIs(t, observed[0], ErrRetriesExhausted)
	mu.Unlock()

	// Without the interfering writer the state is usable again.
	b.hooks.beforeCAS = nil
	r, err = thr.Allow(ctx, p, "u")
	require.NoError(t, err)
	assert.False(t, r.Degraded)
	assert.True(t, r.Allowed)
}

func TestContextEndsBetweenRoundTrips(t *testing.T) {
	b, _ := newTestBackend(t, sharedAddrs(t, 1))
	p := mustPolicy(t, "ctx", "5/min")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	before := b.Stats().RoundTrips
	_, err := b.Decide(ctx, driver.Request{Policy: testkit.Compile(t, p), Identifier: "u", Cost: 1, Now: t0})
	assert.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, before, b.Stats().RoundTrips, "no round trip once the context is done")
}

func TestLongWindowsOutliveRelativeExpiry(t *testing.T) {
	b, raw := newTestBackend(t, sharedAddrs(t, 1))
	thr, _ := newThrottler(t, b)
	ctx := context.Background()
	// Past 30 days memcached reads expirations as absolute Unix times; a
	// relative number of seconds there would be a moment in 1970 and the
	// items would vanish at once.
	for _, limits := range []string{"3/31d", "3/400d aligned", "3/400d gcra", "3/29d"} {
		p := mustPolicy(t, "long", limits)
		r, err := thr.Allow(ctx, p, limits)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		r, err = thr.Peek(ctx, p, limits)
		require.NoError(t, err)
		assert.Equal(t, int64(1), r.Used, "%s: state survived", limits)
		k := newKeys(b.prefix, testkit.Compile(t, p), limits)
		key := k.window(0)
		if p.Limits()[0].Algorithm == throttler.GCRA {
			key = k.cas(0)
		}
		_, err = raw.Get(key)
		assert.NoError(t, err, limits)
	}
}

func TestExpiration(t *testing.T) {
	wall := func() time.Time { return time.Unix(1_800_000_000, 0) }
	day := 24 * time.Hour
	const margin = grace + clockMargin
	assert.Equal(t, int32(margin), expiration(0, 0, wall), "closed state: the margin only")
	assert.Equal(t, int32(1+margin), expiration(time.Millisecond, 0, wall), "rounded up, plus the margin")
	assert.Equal(t, int32(60+margin+1), expiration(time.Minute, 1, wall))
	assert.Equal(t, int32(relativeExpiryMax), expiration(30*day-margin*time.Second, 0, wall), "largest relative")
	assert.Equal(t, int32(1_800_000_000+relativeExpiryMax+margin+absoluteExpirySlack),
		expiration(30*day, 0, wall), "absolute past 30 days")
	assert.Equal(t, int32(1_800_000_000+400*86400+margin+absoluteExpirySlack), expiration(400*day, 0, wall))
	assert.Equal(t, int32(0), expiration(4000*day, 0, func() time.Time { return time.Unix(2_100_000_000, 0) }),
		"beyond 2038: no expiry rather than a wrapped one")
}

func TestServerStoppedDegradesAndRecovers(t *testing.T) {
	srv := localserverT(t)
	client, err := NewClient(100*time.Millisecond, srv.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close() })
	b, err := New(client, WithPrefix(freshPrefix()))
	require.NoError(t, err)
	var failures atomic.Int64
	thr, clock := newThrottler(t, b, throttler.WithCallTimeout(100*time.Millisecond),
		throttler.WithObserver(throttler.ObserverFunc(func(_ context.Context, e throttler.Event) {
			if e.Err != nil {
				failures.Add(1)
			}
		})))
	ctx := context.Background()
	open := mustPolicy(t, "open", "1/h")
	closed := mustPolicy(t, "closed", "1/h", throttler.WithFailureMode(throttler.FailClosed))

	r, err := thr.Allow(ctx, open, "u")
	require.NoError(t, err)
	require.True(t, r.Allowed)
	require.False(t, r.Degraded)

	require.NoError(t, srv.Stop())
	for _, c := range []struct {
		p       *throttler.Policy
		allowed bool
	}{{open, true}, {closed, false}, {open, true}} {
		start := time.Now()
		r, err := thr.Allow(ctx, c.p, "u")
		elapsed := time.Since(start)
		require.NoError(t, err)
		assert.True(t, r.Degraded, "%s", c.p.Name())
		assert.Equal(t, c.allowed, r.Allowed, "%s: failure mode", c.p.Name())
		assert.ErrorIs(t, r.Err, throttler.ErrBackend)
		assert.Less(t, elapsed, 5*time.Second, "bounded by the timeouts")
	}
	assert.Error(t, thr.Ping(ctx))
	assert.GreaterOrEqual(t, failures.Load(), int64(3))

	require.NoError(t, srv.Start())
	clock.Advance(time.Second)
	// Connections to the old process may fail once each; then it works.
	var last throttler.Result
	for range 5 {
		last, err = thr.Allow(ctx, closed, "u")
		require.NoError(t, err)
		if !last.Degraded {
			break
		}
	}
	assert.False(t, last.Degraded, "recovered: %v", last.Err)
	assert.True(t, last.Allowed, "the restarted server holds no state")
	require.NoError(t, thr.Ping(ctx))
}

func TestRefundAndResetSurviveMissingState(t *testing.T) {
	b, _ := newTestBackend(t, sharedAddrs(t, 1))
	p := mustPolicy(t, "absent", "5/min, 5/min gcra")
	out, err := b.Refund(context.Background(), driver.Request{Policy: testkit.Compile(t, p), Identifier: "u", Cost: 3, Now: t0})
	require.NoError(t, err)
	assert.True(t, out.Allowed)
	assert.Equal(t, make([]driver.State, 2), out.States)
	assert.NoError(t, b.Reset(context.Background(), testkit.Compile(t, p), "u"))
}

func TestPrefixBounds(t *testing.T) {
	_, err := New(dummyClient(), WithPrefix(strings.Repeat("p", MaxPrefixLen)))
	assert.NoError(t, err)
	_, err = New(dummyClient(), WithPrefix(strings.Repeat(" ", MaxPrefixLen/3+1)))
	assert.ErrorIs(t, err, driver.ErrInvalidOption, "escaped length counts")
}

func TestRoundTrips(t *testing.T) {
	b, _ := newTestBackend(t, sharedAddrs(t, 1))
	thr, clock := newThrottler(t, b)
	ctx := context.Background()
	count := func(f func()) uint64 {
		before := b.Stats().RoundTrips
		f()
		return b.Stats().RoundTrips - before
	}
	allow := func(p *throttler.Policy, id string, allowed bool) func() {
		return func() {
			r, err := thr.Allow(ctx, p, id)
			require.NoError(t, err)
			require.False(t, r.Degraded)
			require.Equal(t, allowed, r.Allowed)
		}
	}
	peek := func(p *throttler.Policy, id string) func() {
		return func() {
			_, err := thr.Peek(ctx, p, id)
			require.NoError(t, err)
		}
	}
	one := mustPolicy(t, "one", "2/min")
	assert.Equal(t, uint64(1), count(peek(one, "u")), "peek, no window")
	assert.Equal(t, uint64(3), count(allow(one, "u", true)), "open: get, add counter, publish")
	assert.Equal(t, uint64(2), count(allow(one, "u", true)), "get, incr")
	assert.Equal(t, uint64(3), count(allow(one, "u", false)), "get, incr, decr")
	assert.Equal(t, uint64(2), count(peek(one, "u")), "peek: get, get counter")

	gcra := mustPolicy(t, "gcra", "1/min gcra")
	assert.Equal(t, uint64(2), count(allow(gcra, "u", true)), "get, add")
	assert.Equal(t, uint64(1), count(allow(gcra, "u", false)), "get: denied on the read")

	three := mustPolicy(t, "three", "10/s, 100/min aligned, 1000/h")
	allow(three, "u", true)()
	assert.Equal(t, uint64(4), count(allow(three, "u", true)), "get, three incrs")
	clock.Advance(2 * time.Second)
	assert.Equal(t, uint64(6), count(allow(three, "u", true)),
		"get, read the open counters, two incrs, then open the first (2)")
}

func TestResetClearsUnreadableState(t *testing.T) {
	b, raw := newTestBackend(t, sharedAddrs(t, 1))
	p := mustPolicy(t, "junk", "5/min, 5/min gcra")
	k := newKeys(b.prefix, testkit.Compile(t, p), "u")
	req := driver.Request{Policy: testkit.Compile(t, p), Identifier: "u", Cost: 1, Now: t0}
	require.NoError(t, raw.Set(&memcache.Item{Key: k.window(0), Value: []byte("junk"), Expiration: 60}))
	require.NoError(t, raw.Set(&memcache.Item{Key: k.cas(1), Value: []byte("junk"), Expiration: 60}))
	_, err := b.Decide(context.Background(), req)
	require.ErrorIs(t, err, driver.ErrBadReply)
	require.NoError(t, b.Reset(context.Background(), testkit.Compile(t, p), "u"))
	out, err := b.Decide(context.Background(), req)
	require.NoError(t, err)
	assert.True(t, out.Allowed)
}

// TestWindowOpeningRace makes two processes find the same closed window and
// race to open the next: the one that publishes first wins, the other's
// units go into the winner's counter, and its own counter disappears.
func TestWindowOpeningRace(t *testing.T) {
	for _, closed := range []bool{false, true} {
		t.Run(fmt.Sprintf("previous window exists=%v", closed), func(t *testing.T) {
			loser, raw := newTestBackend(t, sharedAddrs(t, 1))
			winner, err := New(loser.client, WithPrefix(loser.prefix))
			require.NoError(t, err)
			p := mustPolicy(t, "race", "5/min")
			ctx := context.Background()
			start := t0
			if closed {
				_, err := loser.Decide(ctx, driver.Request{Policy: testkit.Compile(t, p), Identifier: "u", Cost: 3, Now: t0.Add(-2 * time.Minute)})
				require.NoError(t, err)
			}
			var won driver.Outcome
			var orphan string
			loser.hooks.beforePublish = func(counter string) {
				// The loser has added its counter and not published it.
				loser.hooks.beforePublish = nil
				orphan = counter
				won, err = winner.Decide(ctx, driver.Request{Policy: testkit.Compile(t, p), Identifier: "u", Cost: 1, Now: start.Add(time.Millisecond)})
				require.NoError(t, err)
			}
			lost, err := loser.Decide(ctx, driver.Request{Policy: testkit.Compile(t, p), Identifier: "u", Cost: 2, Now: start})
			require.NoError(t, err)

			end := start.Add(time.Millisecond + time.Minute).UnixMilli()
			require.True(t, won.Allowed)
			assert.Equal(t, driver.State{Used: 1, End: end}, won.States[0], "winner opened its window")
			require.True(t, lost.Allowed)
			assert.Equal(t, driver.State{Used: 3, End: end}, lost.States[0], "loser counted in the winner's window")
			assert.Equal(t, uint64(1), loser.Stats().CASConflicts)

			// Exactly one counter holds the window's units: the loser's was
			// deleted.
			it, err := raw.Get(newKeys(loser.prefix, testkit.Compile(t, p), "u").window(0))
			require.NoError(t, err)
			w, ok := parseWindow(it.Value)
			require.True(t, ok)
			assert.Equal(t, end, w.end)
			assert.NotEqual(t, newKeys(loser.prefix, testkit.Compile(t, p), "u").counter(0, w), orphan)
			_, err = raw.Get(orphan)
			assert.ErrorIs(t, err, memcache.ErrCacheMiss, "the loser's unpublished counter is gone")
			out, err := winner.Peek(ctx, driver.Request{Policy: testkit.Compile(t, p), Identifier: "u", Now: start})
			require.NoError(t, err)
			assert.Equal(t, int64(3), out.States[0].Used)
		})
	}
}
