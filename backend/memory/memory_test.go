package memorybackend_test

import (
	"context"
	"errors"
	"fmt"
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

func newThrottler(t *testing.T, b driver.Backend, clock throttler.Clock, events *[]throttler.Event) *throttler.Throttler {
	return testkit.Throttler(t, b, throttler.WithClock(clock), throttler.WithLogger(nil),
		throttler.WithObserver(throttler.ObserverFunc(func(_ context.Context, e throttler.Event) {
			if events != nil {
				*events = append(*events, e)
			}
		})))
}

func TestMaxIdentifiersFailsNewcomersOnly(t *testing.T) {
	ctx := context.Background()
	clock := throttlertest.NewManualClock(t0)
	b := memorybackend.New(memorybackend.WithMaxIdentifiers(3), memorybackend.WithSweepClock(clock))
	var events []throttler.Event
	th := newThrottler(t, b, clock, &events)
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
	assert.ErrorIs(t, r.Err, memorybackend.ErrFull)
	assert.ErrorIs(t, r.Err, throttler.ErrBackend)
	require.NotEmpty(t, events)
	assert.ErrorIs(t, events[len(events)-1].Err, memorybackend.ErrFull, "the observer hears of it")

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

	// Once the windows have closed (plus the 30 s grace), the sweep makes
	// room and the newcomer is served exactly.
	clock.Advance(time.Minute + 30*time.Second)
	r, err = th.Allow(ctx, p, "newcomer")
	require.NoError(t, err)
	assert.False(t, r.Degraded)
	assert.True(t, r.Allowed)
	assert.Equal(t, int64(1), r.Remaining)
	assert.Equal(t, 1, b.Len(), "the three closed pairs were swept")
}

func TestSweepKeepsLiveStateAndGrace(t *testing.T) {
	ctx := context.Background()
	clock := throttlertest.NewManualClock(t0)
	b := memorybackend.New(memorybackend.WithSweepClock(clock))
	th := newThrottler(t, b, clock, nil)
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
		clock.Advance(20 * time.Millisecond) // 200 s in all; a state lives its second plus 30 s of grace
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
	clock := throttlertest.NewManualClock(t0)
	th := newThrottler(t, memorybackend.New(), clock, nil)
	v1, err := throttler.NewPolicy("api", []throttler.Limit{{Name: "minute", Max: 10, Window: time.Minute}})
	require.NoError(t, err)
	for i := 0; i < 4; i++ {
		_, err := th.Allow(ctx, v1, "u")
		require.NoError(t, err)
	}
	// The same policy name, the minute limit raised, an hour limit added:
	// the minute window and its count carry over; the new limit starts fresh.
	v2, err := throttler.NewPolicy("api", []throttler.Limit{
		{Name: "hour", Max: 100, Window: time.Hour}, {Name: "minute", Max: 20, Window: time.Minute}})
	require.NoError(t, err)
	r, err := th.Allow(ctx, v2, "u")
	require.NoError(t, err)
	require.True(t, r.Allowed)
	assert.Equal(t, int64(1), r.Limits()[0].Used)
	assert.Equal(t, int64(5), r.Limits()[1].Used)
	assert.Equal(t, t0.Add(time.Minute).Truncate(time.Millisecond), r.Limits()[1].ResetAt)
}

// TestRedefinedPolicyKeepsDroppedLimits: a policy redefined without one of
// its limits leaves that limit's state as it was, for the old definition.
func TestRedefinedPolicyKeepsDroppedLimits(t *testing.T) {
	ctx := context.Background()
	clock := throttlertest.NewManualClock(t0)
	th := newThrottler(t, memorybackend.New(), clock, nil)
	both := testkit.Policy(t, "api", "3/min, 100/h")
	hourOnly := testkit.Policy(t, "api", "100/h")
	for i := 0; i < 3; i++ {
		r, err := th.Allow(ctx, both, "u")
		require.NoError(t, err)
		require.True(t, r.Allowed)
	}
	r, err := th.Allow(ctx, hourOnly, "u")
	require.NoError(t, err)
	assert.Equal(t, int64(4), r.Used)
	r, err = th.Allow(ctx, both, "u")
	require.NoError(t, err)
	assert.False(t, r.Allowed, "the minute limit is still spent")
	assert.Equal(t, int64(4), r.Limits()[1].Used)
}

func TestCanceledContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b := memorybackend.New()
	p := testkit.Policy(t, "api", "1/s")
	_, err := b.Decide(ctx, driver.Request{Policy: testkit.Compile(t, p), Identifier: "x", Cost: 1, Now: t0})
	assert.True(t, errors.Is(err, context.Canceled))
	// Through the throttler, the caller's own cancellation is returned as is.
	_, err = newThrottler(t, b, throttlertest.NewManualClock(t0), nil).Allow(ctx, p, "x")
	assert.ErrorIs(t, err, context.Canceled)
}

// TestSweepNeverLosesTheInsertingRequest is the regression test for a sweep,
// triggered by an insert, deleting the entry that insert had just made.
func TestSweepNeverLosesTheInsertingRequest(t *testing.T) {
	ctx := context.Background()
	clock := throttlertest.NewManualClock(t0)
	b := memorybackend.New()
	th := newThrottler(t, b, clock, nil)
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
	b := memorybackend.New()
	p, err := throttler.ParsePolicy("api", "3/min")
	require.NoError(t, err)
	onTime := newThrottler(t, b, throttlertest.NewManualClock(t0), nil)
	ahead := newThrottler(t, b, throttlertest.NewManualClock(t0.Add(10*time.Minute)), nil)
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
	var b memorybackend.Backend
	p := testkit.Policy(t, "api", "3/min")
	req := driver.Request{Policy: testkit.Compile(t, p), Identifier: "x", Cost: 1, Now: t0}
	_, err := b.Decide(context.Background(), req)
	assert.ErrorIs(t, err, driver.ErrNotInitialized)
	_, err = b.Refund(context.Background(), req)
	assert.ErrorIs(t, err, driver.ErrNotInitialized)
	assert.ErrorIs(t, b.Reset(context.Background(), req.Policy, "x"), driver.ErrNotInitialized)
	assert.ErrorIs(t, b.Ping(context.Background()), driver.ErrNotInitialized)
	// Through a throttler it is an error, never a silent allow.
	_, err = testkit.Throttler(t, &b).Allow(context.Background(), p, "x")
	assert.ErrorIs(t, err, throttler.ErrNotInitialized)
	var nilBackend *memorybackend.Backend
	_, err = throttler.New(nilBackend)
	assert.ErrorIs(t, err, throttler.ErrNotInitialized)
}

// A negative bound is a mistake, not a wish for no bound (that is 0): New
// keeps it as the Backend's configuration error, throttler.New refuses the
// Backend (directly, as a local fallback, or inside a decorator), and a
// call made on it anyway fails with it instead of deciding unbounded.
func TestNegativeMaxIdentifiersIsAnError(t *testing.T) {
	b := memorybackend.New(memorybackend.WithMaxIdentifiers(-1))
	const want = "throttlekit: invalid option: memory: WithMaxIdentifiers(-1) is negative; 0 means no bound"
	require.ErrorIs(t, b.CheckConfig(throttler.DefaultCallTimeout), driver.ErrInvalidOption)
	assert.EqualError(t, b.CheckConfig(0), want)

	th, err := throttler.New(b)
	assert.Nil(t, th)
	require.ErrorIs(t, err, throttler.ErrInvalidOption)
	assert.EqualError(t, err, want)
	_, err = throttler.New(memorybackend.New(), throttler.WithLocalFallback(b, 2))
	require.ErrorIs(t, err, throttler.ErrInvalidOption)
	assert.EqualError(t, err, "throttlekit: WithLocalFallback: invalid option: memory: WithMaxIdentifiers(-1) is negative; 0 means no bound")

	p := testkit.Policy(t, "api", "3/min")
	_, err = b.Decide(context.Background(), driver.Request{Policy: testkit.Compile(t, p), Identifier: "x", Cost: 1, Now: t0})
	assert.ErrorIs(t, err, driver.ErrInvalidOption)

	assert.NoError(t, memorybackend.New(memorybackend.WithMaxIdentifiers(0)).CheckConfig(0))
}
