package memory_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 678_000_000, time.UTC)

func newThrottler(b throttler.Backend, clock throttler.Clock, events *[]throttler.Event) *throttler.Throttler {
	return throttler.New(b, throttler.WithClock(clock), throttler.WithObserver(throttler.ObserverFunc(func(e throttler.Event) {
		if events != nil {
			*events = append(*events, e)
		}
	})))
}

func TestMaxIdentifiersFailsNewcomersOnly(t *testing.T) {
	ctx := context.Background()
	clock := throttler.NewManualClock(t0)
	b := memory.New(memory.WithMaxIdentifiers(3), memory.WithSweepClock(clock))
	var events []throttler.Event
	th := newThrottler(b, clock, &events)
	p, err := throttler.ParsePolicy("api", "2/min", throttler.WithFailureMode(throttler.FailClosed))
	require.NoError(t, err)

	for i := 0; i < 3; i++ {
		r, err := th.Allow(ctx, p, fmt.Sprint("id", i))
		require.NoError(t, err)
		require.True(t, r.Allowed)
		require.False(t, r.Degraded)
	}
	require.Equal(t, 3, b.Len())

	// The fourth identifier finds no room: the failure mode decides it.
	r, err := th.Allow(ctx, p, "newcomer")
	require.NoError(t, err)
	assert.True(t, r.Degraded)
	assert.False(t, r.Allowed, "fail closed")
	assert.ErrorIs(t, r.Err, memory.ErrFull)
	assert.ErrorIs(t, r.Err, throttler.ErrBackend)
	require.NotEmpty(t, events)
	assert.ErrorIs(t, events[len(events)-1].Err, memory.ErrFull, "the observer hears of it")

	// Identifiers already held keep exact counts.
	r, err = th.Allow(ctx, p, "id0")
	require.NoError(t, err)
	assert.True(t, r.Allowed)
	assert.Equal(t, int64(0), r.Remaining)
	r, err = th.Allow(ctx, p, "id0")
	require.NoError(t, err)
	assert.False(t, r.Allowed)
	assert.False(t, r.Degraded)

	// Peeks and denials of a newcomer store nothing, so they still work.
	r, err = th.Peek(ctx, p, "newcomer")
	require.NoError(t, err)
	assert.False(t, r.Degraded)
	assert.Equal(t, int64(2), r.Remaining)

	// Once the windows have closed (plus the grace second), the sweep makes
	// room and the newcomer is served exactly.
	clock.Advance(time.Minute + time.Second)
	r, err = th.Allow(ctx, p, "newcomer")
	require.NoError(t, err)
	assert.False(t, r.Degraded)
	assert.True(t, r.Allowed)
	assert.Equal(t, int64(1), r.Remaining)
	assert.Equal(t, 1, b.Len(), "the three closed pairs were swept")
}

func TestSweepKeepsLiveStateAndGraceSecond(t *testing.T) {
	ctx := context.Background()
	clock := throttler.NewManualClock(t0)
	b := memory.New(memory.WithSweepClock(clock))
	th := newThrottler(b, clock, nil)
	short, err := throttler.ParsePolicy("short", "5/s")
	require.NoError(t, err)
	long, err := throttler.ParsePolicy("long", "5/h")
	require.NoError(t, err)

	_, err = th.Allow(ctx, long, "keeper")
	require.NoError(t, err)
	// Enough inserts to trigger sweeps, in windows that close quickly.
	for i := 0; i < 10000; i++ {
		_, err := th.Allow(ctx, short, fmt.Sprint("burst", i))
		require.NoError(t, err)
		clock.Advance(5 * time.Millisecond)
	}
	// A shard sweeps after max(64, half its size) inserts, so at most 64
	// swept-to-be pairs per shard linger beside the live ones.
	assert.Less(t, b.Len(), 64*64+1000, "closed windows were swept")
	r, err := th.Peek(ctx, long, "keeper")
	require.NoError(t, err)
	assert.Equal(t, int64(1), r.Used, "live state survives every sweep")
}

func TestRedefinedPolicyKeepsSharedLimits(t *testing.T) {
	ctx := context.Background()
	clock := throttler.NewManualClock(t0)
	th := newThrottler(memory.New(), clock, nil)
	v1, err := throttler.NewPolicy("api", []throttler.Limit{throttler.PerMinute(10).Named("minute")})
	require.NoError(t, err)
	for i := 0; i < 4; i++ {
		_, err := th.Allow(ctx, v1, "u")
		require.NoError(t, err)
	}
	// The same policy name, the minute limit raised, an hour limit added:
	// the minute window and its count carry over; the new limit starts fresh.
	v2, err := throttler.NewPolicy("api", []throttler.Limit{
		throttler.PerHour(100).Named("hour"), throttler.PerMinute(20).Named("minute")})
	require.NoError(t, err)
	r, err := th.Allow(ctx, v2, "u")
	require.NoError(t, err)
	require.True(t, r.Allowed)
	assert.Equal(t, int64(1), r.Limits[0].Used)
	assert.Equal(t, int64(5), r.Limits[1].Used)
	assert.Equal(t, t0.Add(time.Minute).Truncate(time.Millisecond), r.Limits[1].ResetAt)
}

func TestCanceledContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b := memory.New()
	p, err := throttler.ParsePolicy("api", "1/s")
	require.NoError(t, err)
	_, err = b.Decide(ctx, throttler.Request{Policy: p, Identifier: "x", Cost: 1, Now: t0})
	assert.True(t, errors.Is(err, context.Canceled))
	// Through the throttler, the caller's own cancellation is returned as is.
	_, err = newThrottler(b, throttler.NewManualClock(t0), nil).Allow(ctx, p, "x")
	assert.ErrorIs(t, err, context.Canceled)
}

// TestSweepNeverLosesTheInsertingRequest is the regression test for a sweep,
// triggered by an insert, deleting the entry that insert had just made.
func TestSweepNeverLosesTheInsertingRequest(t *testing.T) {
	ctx := context.Background()
	clock := throttler.NewManualClock(t0)
	b := memory.New()
	th := newThrottler(b, clock, nil)
	p, err := throttler.ParsePolicy("api", "5/min")
	require.NoError(t, err)
	const n = 10000
	for i := 0; i < n; i++ {
		_, err := th.Allow(ctx, p, fmt.Sprint("id", i))
		require.NoError(t, err)
	}
	lost := 0
	for i := 0; i < n; i++ {
		r, err := th.Peek(ctx, p, fmt.Sprint("id", i))
		require.NoError(t, err)
		if r.Used != 1 {
			lost++
		}
	}
	assert.Zero(t, lost, "every identifier keeps its unit")
	assert.Equal(t, n, b.Len())
}

// TestClockAheadCannotSweepLiveState: a throttler whose clock runs ten
// minutes ahead stores and sweeps plenty, and another throttler's live
// window, on the same backend, survives it with its count and its end.
func TestClockAheadCannotSweepLiveState(t *testing.T) {
	ctx := context.Background()
	b := memory.New()
	p, err := throttler.ParsePolicy("api", "3/min")
	require.NoError(t, err)
	onTime := newThrottler(b, throttler.NewManualClock(t0), nil)
	ahead := newThrottler(b, throttler.NewManualClock(t0.Add(10*time.Minute)), nil)
	var first throttler.Result
	for i := 0; i < 3; i++ {
		first, err = onTime.Allow(ctx, p, "victim")
		require.NoError(t, err)
	}
	for i := 0; i < 20000; i++ {
		_, err := ahead.Allow(ctx, p, fmt.Sprint("other", i))
		require.NoError(t, err)
	}
	r, err := onTime.Allow(ctx, p, "victim")
	require.NoError(t, err)
	assert.False(t, r.Allowed, "the victim's full window is still there")
	assert.Equal(t, first.ResetAt, r.ResetAt)
}

func TestZeroBackendFailsWithoutPanicking(t *testing.T) {
	var b memory.Backend
	p, err := throttler.ParsePolicy("api", "3/min")
	require.NoError(t, err)
	req := throttler.Request{Policy: p, Identifier: "x", Cost: 1, Now: t0}
	_, err = b.Decide(context.Background(), req)
	assert.ErrorIs(t, err, memory.ErrNotInitialized)
	_, err = b.Refund(context.Background(), req)
	assert.ErrorIs(t, err, memory.ErrNotInitialized)
	assert.ErrorIs(t, b.Reset(context.Background(), p, "x"), memory.ErrNotInitialized)
	assert.ErrorIs(t, b.Ping(context.Background()), memory.ErrNotInitialized)
	r, err := throttler.New(&b).Allow(context.Background(), p, "x")
	require.NoError(t, err)
	assert.True(t, r.Degraded)
	assert.ErrorIs(t, r.Err, memory.ErrNotInitialized)
}
