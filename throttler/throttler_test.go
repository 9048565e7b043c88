package throttler_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

var t0 = testkit.T0

// failing is a backend that injects a fault no real store produces on
// demand: every call fails, or hangs until its context is done.
type failing struct{ hang bool }

var errDown = errors.New("store is down")

func (f failing) Decide(ctx context.Context, _ driver.Request) (driver.Outcome, error) {
	if f.hang {
		<-ctx.Done()
		return driver.Outcome{}, ctx.Err()
	}
	return driver.Outcome{}, errDown
}

// recorder collects observer events.
type recorder struct {
	mu     sync.Mutex
	events []throttler.Event
}

func (r *recorder) Observe(_ context.Context, e throttler.Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

func policy(t *testing.T, spec string, opts ...throttler.Option) *throttler.Policy {
	t.Helper()
	p, err := throttler.ParsePolicy("api", spec, opts...)
	require.NoError(t, err)
	return p
}

func TestFailureModes(t *testing.T) {
	ctx := context.Background()
	for _, mode := range []throttler.FailureMode{throttler.FailOpen, throttler.FailClosed} {
		t.Run(mode.String(), func(t *testing.T) {
			rec := &recorder{}
			th := testkit.Throttler(t, failing{}, throttler.WithClock(throttlertest.NewManualClock(t0)), throttler.WithObserver(rec))
			p := policy(t, "10/min, 100/h", throttler.WithFailureMode(mode))
			r, err := th.AllowN(ctx, p, "u", 2)
			require.NoError(t, err, "a backend failure is not returned as an error")
			assert.True(t, r.Degraded)
			assert.ErrorIs(t, r.Err, throttler.ErrBackend)
			assert.ErrorIs(t, r.Err, errDown)
			assert.Equal(t, mode == throttler.FailOpen, r.Allowed)
			assert.Equal(t, r.Limit-r.Used, r.Remaining)
			if mode == throttler.FailClosed {
				assert.Zero(t, r.Remaining, "a denial never claims remaining quota")
				assert.Equal(t, time.Second, r.RetryAfter)
			} else {
				assert.Equal(t, int64(8), r.Remaining, "fail open reports a fresh window after this request")
				assert.Zero(t, r.RetryAfter)
			}
			require.Len(t, rec.events, 1)
			assert.ErrorIs(t, rec.events[0].Err, errDown, "the observer hears of the failure")
			assert.Equal(t, "allow", rec.events[0].Op)
		})
	}
}

func TestHungBackendCostsAtMostTheTimeout(t *testing.T) {
	th := testkit.Throttler(t, failing{hang: true}, throttler.WithCallTimeout(20*time.Millisecond), throttler.WithLogger(nil))
	r, err := th.Allow(context.Background(), policy(t, "1/s"), "u")
	require.NoError(t, err)
	assert.True(t, r.Degraded)
	assert.True(t, r.Allowed)
	assert.ErrorIs(t, r.Err, context.DeadlineExceeded)

	// A policy's own timeout wins over the throttler's.
	p := policy(t, "1/s", throttler.WithCallTimeout(time.Millisecond), throttler.WithFailureMode(throttler.FailClosed))
	th = testkit.Throttler(t, failing{hang: true}, throttler.WithCallTimeout(time.Hour), throttler.WithLogger(nil))
	r, err = th.Allow(context.Background(), p, "u")
	require.NoError(t, err)
	assert.True(t, r.Degraded)
	assert.False(t, r.Allowed)
}

func TestCallerCancellationIsReturned(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	th := testkit.Throttler(t, failing{hang: true}, throttler.WithLogger(nil))
	_, err := th.Allow(ctx, policy(t, "1/s"), "u")
	assert.ErrorIs(t, err, context.Canceled)
}

// shortReply answers with the wrong number of states.
type shortReply struct{}

func (shortReply) Decide(context.Context, driver.Request) (driver.Outcome, error) {
	return driver.Outcome{Allowed: true, States: []driver.State{{}}}, nil
}

func TestMalformedReplyIsABackendFailure(t *testing.T) {
	th := testkit.Throttler(t, shortReply{}, throttler.WithLogger(nil))
	r, err := th.Allow(context.Background(), policy(t, "1/s, 2/min"), "u")
	require.NoError(t, err)
	assert.True(t, r.Degraded)
	assert.ErrorIs(t, r.Err, driver.ErrBadReply)
	assert.ErrorIs(t, r.Err, throttler.ErrBackend)
}

func TestInvalidInput(t *testing.T) {
	ctx := context.Background()
	th := testkit.Throttler(t, memorybackend.New())
	p := policy(t, "1/s")
	_, err := th.Allow(ctx, nil, "u")
	assert.ErrorIs(t, err, throttler.ErrInvalidPolicy)
	_, err = th.Allow(ctx, &throttler.Policy{}, "u")
	assert.ErrorIs(t, err, throttler.ErrInvalidPolicy)
	_, err = th.Allow(ctx, p, "")
	assert.ErrorIs(t, err, throttler.ErrInvalidIdentifier)
	_, err = th.AllowN(ctx, p, "u", -1)
	assert.ErrorIs(t, err, throttler.ErrInvalidCost)
	_, err = th.Refund(ctx, p, "u", -1)
	assert.ErrorIs(t, err, throttler.ErrInvalidCost)
	_, err = th.AllowAll(ctx, 1)
	assert.ErrorIs(t, err, throttler.ErrInvalidPolicy)
	_, err = th.AllowAll(ctx, 1, throttler.Subject{Policy: p, Identifier: ""})
	assert.ErrorIs(t, err, throttler.ErrInvalidIdentifier)
	var zero throttler.Throttler
	_, err = zero.Allow(ctx, p, "u")
	assert.ErrorIs(t, err, throttler.ErrNotInitialized)
	assert.ErrorIs(t, zero.Ping(ctx), throttler.ErrNotInitialized)
}

func TestUnsupportedCapabilities(t *testing.T) {
	ctx := context.Background()
	th := testkit.Throttler(t, shortReply{})
	_, err := th.Refund(ctx, policy(t, "1/s"), "u", 1)
	assert.ErrorIs(t, err, errors.ErrUnsupported)
	assert.ErrorIs(t, th.Reset(ctx, policy(t, "1/s"), "u"), errors.ErrUnsupported)
	assert.NoError(t, th.Ping(ctx), "no Pinger: taken to be reachable")
}

func TestNeverAllowed(t *testing.T) {
	ctx := context.Background()
	clock := throttlertest.NewManualClock(t0)
	th := testkit.Throttler(t, memorybackend.New(), throttler.WithClock(clock))
	p := policy(t, "10/min, 5/s gcra")
	_, err := th.AllowN(ctx, p, "u", 2)
	require.NoError(t, err)
	r, err := th.AllowN(ctx, p, "u", 6)
	require.ErrorIs(t, err, throttler.ErrCostExceedsLimit)
	assert.False(t, r.Allowed)
	assert.True(t, r.NeverAllowed)
	assert.Equal(t, throttler.Never, r.RetryAfter)
	assert.Equal(t, "5/s gcra", r.Binding, "the limit that can never hold it binds")
	assert.Equal(t, int64(8), r.Limits()[0].Remaining, "figures are the real, unchanged state")
	peek, err := th.Peek(ctx, p, "u")
	require.NoError(t, err)
	assert.Equal(t, int64(2), peek.Limits()[0].Used, "nothing was consumed")
}

// noRefund hides the memory backend's Refunder, to exercise AllowAll's
// peek-first fallback.
type noRefund struct{ b driver.Backend }

func (n noRefund) Decide(ctx context.Context, r driver.Request) (driver.Outcome, error) {
	return n.b.Decide(ctx, r)
}

func TestAllowAll(t *testing.T) {
	ctx := context.Background()
	for name, backend := range map[string]func() driver.Backend{
		"refunder":   func() driver.Backend { return memorybackend.New() },
		"peek-first": func() driver.Backend { return noRefund{memorybackend.New()} },
	} {
		t.Run(name, func(t *testing.T) {
			clock := throttlertest.NewManualClock(t0)
			th := testkit.Throttler(t, backend(), throttler.WithClock(clock))
			ipPolicy, err := throttler.ParsePolicy("ip", "3/min")
			require.NoError(t, err)
			userPolicy, err := throttler.ParsePolicy("user", "2/min")
			require.NoError(t, err)
			ip := throttler.Subject{Policy: ipPolicy, Identifier: "203.0.113.9"}
			user := throttler.Subject{Policy: userPolicy, Identifier: "user:42"}

			r, err := th.AllowAll(ctx, 1, ip, user)
			require.NoError(t, err)
			assert.True(t, r.Allowed)
			assert.Equal(t, "user", r.Policy, "the subject with the least remaining binds")
			assert.Len(t, r.Subjects, 2)
			_, err = th.AllowAll(ctx, 1, ip, user)
			require.NoError(t, err)

			r, err = th.AllowAll(ctx, 1, ip, user)
			require.NoError(t, err)
			assert.False(t, r.Allowed)
			assert.Equal(t, "user", r.Policy)
			assert.Zero(t, r.Remaining)
			assert.Equal(t, time.Duration(time.Minute), r.RetryAfter)

			peek, err := th.Peek(ctx, ipPolicy, ip.Identifier)
			require.NoError(t, err)
			assert.Equal(t, int64(2), peek.Used, "the denied request was given back on the IP")
		})
	}
}

func TestRefundAndReset(t *testing.T) {
	ctx := context.Background()
	clock := throttlertest.NewManualClock(t0)
	th := testkit.Throttler(t, memorybackend.New(), throttler.WithClock(clock))
	p := policy(t, "5/min, 10/s gcra")
	_, err := th.AllowN(ctx, p, "u", 4)
	require.NoError(t, err)
	r, err := th.Refund(ctx, p, "u", 3)
	require.NoError(t, err)
	assert.Equal(t, int64(1), r.Limits()[0].Used)
	assert.Equal(t, int64(1), r.Limits()[1].Used)
	r, err = th.Refund(ctx, p, "u", 100)
	require.NoError(t, err)
	assert.Zero(t, r.Limits()[0].Used, "not below zero")
	assert.Zero(t, r.Limits()[1].Used, "not below now")
	assert.Equal(t, t0.Truncate(time.Millisecond).Add(time.Minute), r.Limits()[0].ResetAt, "the window stays")

	_, err = th.AllowN(ctx, p, "u", 5)
	require.NoError(t, err)
	require.NoError(t, th.Reset(ctx, p, "u"))
	r, err = th.Peek(ctx, p, "u")
	require.NoError(t, err)
	assert.Equal(t, int64(5), r.Remaining)
	assert.Equal(t, clock.Now().Truncate(time.Millisecond).Add(time.Minute), r.Limits()[0].ResetAt, "would open now")
}

func TestResultTimesKeepTheClockLocation(t *testing.T) {
	loc := time.FixedZone("X", 3600)
	th := testkit.Throttler(t, memorybackend.New(), throttler.WithClock(throttlertest.NewManualClock(t0.In(loc))))
	r, err := th.Allow(context.Background(), policy(t, "1/s, 1/s gcra"), "u")
	require.NoError(t, err)
	assert.Equal(t, loc, r.Limits()[0].ResetAt.Location())
	assert.Equal(t, loc, r.Limits()[1].ResetAt.Location())
}

func TestAllowAllNeverAllowedSpendsNothing(t *testing.T) {
	ctx := context.Background()
	for name, b := range map[string]driver.Backend{"refunder": memorybackend.New(), "peek-first": noRefund{memorybackend.New()}} {
		t.Run(name, func(t *testing.T) {
			th := testkit.Throttler(t, b, throttler.WithClock(throttlertest.NewManualClock(t0)))
			wide := policy(t, "100/min")
			narrow, err := throttler.ParsePolicy("narrow", "3/min")
			require.NoError(t, err)
			r, err := th.AllowAll(ctx, 5,
				throttler.Subject{Policy: wide, Identifier: "ip"},
				throttler.Subject{Policy: narrow, Identifier: "user"})
			require.ErrorIs(t, err, throttler.ErrCostExceedsLimit)
			assert.True(t, r.NeverAllowed)
			assert.Equal(t, throttler.Never, r.RetryAfter)
			assert.Equal(t, "narrow", r.Policy)
			peek, err := th.Peek(ctx, wide, "ip")
			require.NoError(t, err)
			assert.Zero(t, peek.Used, "nothing spent on the other subject")
		})
	}
}

func TestClockOutOfRange(t *testing.T) {
	maxTime := time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)
	ctx := context.Background()
	p := policy(t, "3/s, 3/s gcra")
	// +1 ns and +999,999 ns share the bound's Unix millisecond (UnixMilli
	// floors), so they prove the check compares whole readings. Every
	// operation, the zero-allocation in-process path included, reads the
	// clock through the same Throttler.now.
	for _, at := range []time.Time{{}, time.Date(1969, 12, 31, 23, 0, 0, 0, time.UTC), time.Unix(0, -1),
		maxTime.Add(time.Nanosecond), maxTime.Add(999_999 * time.Nanosecond), maxTime.Add(time.Millisecond)} {
		th := testkit.Throttler(t, memorybackend.New(), throttler.WithClock(throttlertest.NewManualClock(at)))
		_, err := th.Allow(ctx, p, "u")
		assert.ErrorIs(t, err, throttler.ErrClockOutOfRange, "%v", at)
		_, err = th.Peek(ctx, p, "u")
		assert.ErrorIs(t, err, throttler.ErrClockOutOfRange)
		_, err = th.Refund(ctx, p, "u", 1)
		assert.ErrorIs(t, err, throttler.ErrClockOutOfRange)
		_, err = th.AllowAll(ctx, 1, throttler.Subject{Policy: p, Identifier: "u"})
		assert.ErrorIs(t, err, throttler.ErrClockOutOfRange)
	}
	// The epoch itself and MaxTime are fine.
	for _, at := range []time.Time{time.Unix(0, 0), maxTime} {
		th := testkit.Throttler(t, memorybackend.New(), throttler.WithClock(throttlertest.NewManualClock(at)))
		r, err := th.Allow(ctx, p, "u")
		require.NoError(t, err, "%v", at)
		assert.True(t, r.Allowed)
		assert.Equal(t, int64(2), r.Remaining)
	}
}

// cancelling wraps a backend and cancels the caller's context during the
// second subject's decision, as a client that hangs up would.
type cancelling struct {
	driver.Backend
	cancel func()
	calls  int
}

func (c *cancelling) Decide(ctx context.Context, r driver.Request) (driver.Outcome, error) {
	c.calls++
	if c.calls == 2 {
		c.cancel()
		return driver.Outcome{}, ctx.Err()
	}
	return c.Backend.Decide(ctx, r)
}

func (c *cancelling) Refund(ctx context.Context, r driver.Request) (driver.Outcome, error) {
	return c.Backend.(driver.Refunder).Refund(ctx, r)
}

func TestAllowAllGivesBackAfterTheCallerLeaves(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	mem := memorybackend.New()
	th := testkit.Throttler(t, &cancelling{Backend: mem, cancel: cancel}, throttler.WithClock(throttlertest.NewManualClock(t0)))
	a, err := throttler.ParsePolicy("a", "5/min")
	require.NoError(t, err)
	b, err := throttler.ParsePolicy("b", "5/min")
	require.NoError(t, err)
	_, err = th.AllowAll(ctx, 1, throttler.Subject{Policy: a, Identifier: "x"}, throttler.Subject{Policy: b, Identifier: "x"})
	require.ErrorIs(t, err, context.Canceled)
	r, err := testkit.Throttler(t, mem, throttler.WithClock(throttlertest.NewManualClock(t0))).Peek(context.Background(), a, "x")
	require.NoError(t, err)
	assert.Zero(t, r.Used, "the first subject's unit was given back although the caller left")
}
