package throttler_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
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

// failingLeaser fails every call, leases included; down switches the
// lease calls between failing and a memory backend's answers.
type failingLeaser struct {
	failing
	mem  *memorybackend.Backend
	down *atomic.Bool
}

func (f failingLeaser) Acquire(ctx context.Context, req driver.LeaseRequest) (driver.LeaseOutcome, error) {
	if f.down == nil || f.down.Load() {
		return driver.LeaseOutcome{}, errDown
	}
	return f.mem.Acquire(ctx, req)
}

func (f failingLeaser) Release(ctx context.Context, req driver.LeaseRequest) (driver.LeaseOutcome, error) {
	if f.down == nil || f.down.Load() {
		return driver.LeaseOutcome{}, errDown
	}
	return f.mem.Release(ctx, req)
}

func concurrency(t *testing.T, max int64, opts ...throttler.Option) *throttler.ConcurrencyLimit {
	t.Helper()
	l, err := throttler.NewConcurrencyLimit("uploads", max, time.Minute, opts...)
	require.NoError(t, err)
	return l
}

func TestConcurrencyLimitAccessors(t *testing.T) {
	l := concurrency(t, 4)
	assert.Equal(t, "uploads", l.Name())
	assert.Equal(t, int64(4), l.Max())
	assert.Equal(t, time.Minute, l.LeaseTTL())
	var zero *throttler.ConcurrencyLimit
	assert.Equal(t, "", zero.Name())
	assert.Zero(t, zero.Max())
	assert.Zero(t, (&throttler.ConcurrencyLimit{}).LeaseTTL())

	_, err := throttler.NewConcurrencyLimit("c", 1, time.Second, throttler.WithClock(throttlertest.NewManualClock(t0)))
	assert.ErrorIs(t, err, throttler.ErrInvalidOption, "a throttler's option given to a limit")
	_, err = throttler.NewConcurrencyLimit("c", 1, time.Second, nil)
	assert.ErrorIs(t, err, throttler.ErrInvalidOption)
}

// The lease lifecycle over the memory backend, with what observers see.
func TestLeaseLifecycle(t *testing.T) {
	ctx := context.Background()
	clock := throttlertest.NewManualClock(t0)
	rec := &recorder{}
	th := testkit.Throttler(t, memorybackend.New(), throttler.WithClock(clock), throttler.WithObserver(rec))
	l := concurrency(t, 1)

	a, err := th.Acquire(ctx, l, "u")
	require.NoError(t, err)
	require.True(t, a.Acquired)
	assert.Len(t, a.ID, 32)
	assert.True(t, t0.Add(time.Minute).Equal(a.ExpiresAt), "%v", a.ExpiresAt)
	assert.Equal(t, t0.Location(), a.ExpiresAt.Location(), "times keep the clock's location")
	b, err := th.Acquire(ctx, l, "u")
	require.NoError(t, err)
	assert.False(t, b.Acquired)
	assert.NotEqual(t, a.ID, b.ID)
	assert.Equal(t, time.Minute, b.RetryAfter)

	clock.Advance(30 * time.Second)
	held, err := a.Renew(ctx)
	require.NoError(t, err)
	assert.True(t, held)
	assert.True(t, t0.Add(90*time.Second).Equal(a.ExpiresAt), "%v", a.ExpiresAt)
	require.NoError(t, a.Release(ctx))
	require.NoError(t, a.Release(ctx), "a second release is a no-op")
	require.NoError(t, b.Release(ctx), "releasing a refused lease is a no-op")
	held, err = a.Renew(ctx)
	require.NoError(t, err)
	assert.False(t, held, "a released lease is not renewed")

	var ops []string
	for _, e := range rec.events {
		ops = append(ops, e.Op)
		assert.Equal(t, "uploads", e.Policy)
		assert.Equal(t, "u", e.Identifier)
		assert.Equal(t, "memory", e.Backend)
		assert.NoError(t, e.Err)
	}
	assert.Equal(t, []string{"acquire", "acquire", "renew", "release"}, ops, "one event per backend call")
	first, refused, renewed := rec.events[0].Result, rec.events[1].Result, rec.events[2].Result
	assert.True(t, first.Allowed)
	assert.Equal(t, int64(1), first.Used)
	assert.Equal(t, int64(0), first.Remaining)
	assert.False(t, refused.Allowed)
	assert.Equal(t, time.Minute, refused.RetryAfter)
	assert.True(t, renewed.Allowed)
	assert.Equal(t, t0.Add(30*time.Second), renewed.At)
	assert.False(t, rec.events[3].HasResult(), "release carries no Result")
}

func TestLeaseFailureModes(t *testing.T) {
	ctx := context.Background()
	down := &atomic.Bool{}
	down.Store(true)
	mem := memorybackend.New()
	backend := failingLeaser{mem: mem, down: down}
	for _, c := range []struct {
		mode     throttler.FailureMode
		acquired bool
		inFlight int64
		retry    time.Duration
	}{
		{throttler.FailOpen, true, 1, 0},
		{throttler.FailClosed, false, 3, time.Second},
	} {
		t.Run(c.mode.String(), func(t *testing.T) {
			rec := &recorder{}
			th := testkit.Throttler(t, backend, throttler.WithClock(throttlertest.NewManualClock(t0)), throttler.WithObserver(rec), throttler.WithLogger(nil))
			lease, err := th.Acquire(ctx, concurrency(t, 3, throttler.WithFailureMode(c.mode)), "u")
			require.NoError(t, err, "a backend failure is not an error")
			assert.True(t, lease.Degraded)
			assert.ErrorIs(t, lease.Err, throttler.ErrBackend)
			assert.ErrorIs(t, lease.Err, errDown)
			assert.Equal(t, c.acquired, lease.Acquired)
			assert.Equal(t, c.inFlight, lease.InFlight)
			assert.Equal(t, c.retry, lease.RetryAfter)
			require.Len(t, rec.events, 1)
			assert.ErrorIs(t, rec.events[0].Err, errDown)
			assert.True(t, rec.events[0].Result.Degraded)

			err = lease.Release(ctx)
			assert.ErrorIs(t, err, throttler.ErrBackend, "the store may hold the lease: it is told, and fails")
			assert.Len(t, rec.events, 2)
		})
	}

	// Once the store answers again, a degraded lease's release reaches it.
	th := testkit.Throttler(t, backend, throttler.WithClock(throttlertest.NewManualClock(t0)), throttler.WithLogger(nil))
	lease, err := th.Acquire(ctx, concurrency(t, 3), "u")
	require.NoError(t, err)
	require.True(t, lease.Degraded)
	down.Store(false)
	assert.NoError(t, lease.Release(ctx))
}

// FailLocal takes leases on the local store, on this process's share of
// Max, and releases them there.
func TestLeaseLocalFallback(t *testing.T) {
	ctx := context.Background()
	down := &atomic.Bool{}
	down.Store(true)
	th := testkit.Throttler(t, failingLeaser{mem: memorybackend.New(), down: down},
		throttler.WithClock(throttlertest.NewManualClock(t0)), throttler.WithLogger(nil),
		throttler.WithLocalFallback(memorybackend.New(), 4))
	l := concurrency(t, 10) // a share of 3 per process
	var leases []*throttler.Lease
	for i := range 4 {
		lease, err := th.Acquire(ctx, l, "u")
		require.NoError(t, err)
		assert.True(t, lease.Degraded && lease.Local)
		assert.Equal(t, int64(3), lease.Limit)
		assert.Equal(t, i < 3, lease.Acquired, "lease %d", i)
		leases = append(leases, lease)
	}
	held, err := leases[0].Renew(ctx)
	require.NoError(t, err)
	assert.True(t, held, "renewed on the local store")
	assert.ErrorIs(t, leases[0].Release(ctx), throttler.ErrBackend, "the store is told too, and fails")
	lease, err := th.Acquire(ctx, l, "u")
	require.NoError(t, err)
	assert.True(t, lease.Acquired, "the local release freed a slot")
}

func TestLeaseInputAndUnsupported(t *testing.T) {
	ctx := context.Background()
	l := concurrency(t, 1)
	th := testkit.Throttler(t, failing{})
	_, err := th.Acquire(ctx, l, "u")
	assert.ErrorIs(t, err, errors.ErrUnsupported)
	assert.Contains(t, err.Error(), "driver.Leaser")

	var zero throttler.Throttler
	_, err = zero.Acquire(ctx, l, "u")
	assert.ErrorIs(t, err, throttler.ErrNotInitialized)

	th = testkit.Throttler(t, memorybackend.New(), throttler.WithClock(throttlertest.NewManualClock(time.Unix(-1, 0))))
	_, err = th.Acquire(ctx, l, "u")
	assert.ErrorIs(t, err, throttler.ErrClockOutOfRange)
	_, err = th.Acquire(ctx, l, strings.Repeat("x", 1025))
	assert.ErrorIs(t, err, throttler.ErrInvalidIdentifier)

	canceled, cancel := context.WithCancel(ctx)
	cancel()
	th = testkit.Throttler(t, memorybackend.New())
	lease, err := th.Acquire(canceled, l, "u")
	assert.Nil(t, lease)
	assert.ErrorIs(t, err, context.Canceled)
}

// A lease is released even when the caller's context has ended: the slot
// is owed.
func TestLeaseReleaseOutlivesTheCaller(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	th := testkit.Throttler(t, memorybackend.New(), throttler.WithClock(throttlertest.NewManualClock(t0)))
	l := concurrency(t, 1)
	lease, err := th.Acquire(ctx, l, "u")
	require.NoError(t, err)
	cancel()
	require.NoError(t, lease.Release(ctx))
	next, err := th.Acquire(context.Background(), l, "u")
	require.NoError(t, err)
	assert.True(t, next.Acquired)
}
