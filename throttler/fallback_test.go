package throttler_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// TestLocalFallbackKeepsAbusersLimited: while the store is down, FailLocal
// decides in process on this process's share of the policy (100/min over 4
// processes: 25), so an abusive identifier gets its share and no more, and
// every other identifier still passes.
func TestLocalFallbackKeepsAbusersLimited(t *testing.T) {
	ctx := context.Background()
	clock := throttlertest.NewManualClock(t0)
	th := testkit.Throttler(t, failing{}, throttler.WithClock(clock), throttler.WithLogger(nil),
		throttler.WithLocalFallback(memorybackend.New(), 4))
	p := policy(t, "100/min, 1000/h")
	allowed := 0
	for range 100 {
		r, err := th.Allow(ctx, p, "abuser")
		require.NoError(t, err)
		require.True(t, r.Degraded, "a backend failure is never hidden")
		require.True(t, r.Local)
		require.ErrorIs(t, r.Err, errDown)
		if r.Allowed {
			allowed++
		}
		clock.Advance(100 * time.Millisecond)
	}
	assert.Equal(t, 25, allowed, "the abuser gets this process's share of the minute")
	for i := range 20 {
		r, err := th.Allow(ctx, p, fmt.Sprint("user:", i))
		require.NoError(t, err)
		assert.True(t, r.Allowed, "others pass")
		assert.Equal(t, int64(25), r.Limit, "the figures are the share's")
		assert.Equal(t, "api", r.Policy)
	}
	// A new minute: the share is whole again.
	clock.Advance(time.Minute)
	r, err := th.Allow(ctx, p, "abuser")
	require.NoError(t, err)
	assert.True(t, r.Allowed)
}

// FailLocal without a local store would deny every request during an
// outage: New refuses it, and a policy or concurrency limit that chose it
// is refused by a throttler without one, at its first call and before any
// backend call, naming both settings. A throttler-wide FailOpen still
// applies to other policies.
func TestFailLocalWithoutAStoreIsRefused(t *testing.T) {
	ctx := context.Background()
	th, err := throttler.New(memorybackend.New(), throttler.WithFailureMode(throttler.FailLocal))
	assert.Nil(t, th)
	require.ErrorIs(t, err, throttler.ErrInvalidOption)
	assert.EqualError(t, err, "throttlekit: invalid option: New: WithFailureMode(FailLocal) needs WithLocalFallback on the throttler"+
		" (the in-process store FailLocal decides with); without it every request would be denied during an outage")

	th = testkit.Throttler(t, failing{}, throttler.WithClock(throttlertest.NewManualClock(t0)), throttler.WithLogger(nil))
	p := policy(t, "10/min", throttler.WithFailureMode(throttler.FailLocal))
	_, err = th.Allow(ctx, p, "u")
	require.ErrorIs(t, err, throttler.ErrInvalidOption)
	assert.Contains(t, err.Error(), `policy "`+p.Name()+`": WithFailureMode(FailLocal) needs WithLocalFallback`)
	_, err = th.Peek(ctx, p, "u")
	assert.ErrorIs(t, err, throttler.ErrInvalidOption)
	_, err = th.Acquire(ctx, concurrency(t, 3, throttler.WithFailureMode(throttler.FailLocal)), "u")
	require.ErrorIs(t, err, throttler.ErrInvalidOption)
	assert.Contains(t, err.Error(), `concurrency limit "`)

	r, err := th.Allow(ctx, policy(t, "10/min"), "u")
	require.NoError(t, err)
	assert.True(t, r.Degraded)
	assert.True(t, r.Allowed)
}

// WithFailureMode beside WithLocalFallback keeps the mode it names; a
// policy may still choose FailLocal.
func TestLocalFallbackOptions(t *testing.T) {
	ctx := context.Background()
	th := testkit.Throttler(t, failing{}, throttler.WithClock(throttlertest.NewManualClock(t0)), throttler.WithLogger(nil),
		throttler.WithFailureMode(throttler.FailOpen), throttler.WithLocalFallback(memorybackend.New(), 2))
	r, err := th.Allow(ctx, policy(t, "1/min"), "u")
	require.NoError(t, err)
	assert.False(t, r.Local, "the throttler-wide mode is fail open")
	p := policy(t, "1/min", throttler.WithFailureMode(throttler.FailLocal))
	r, err = th.Allow(ctx, p, "u")
	require.NoError(t, err)
	assert.True(t, r.Local)
	assert.True(t, r.Allowed)
	r, err = th.Allow(ctx, p, "u")
	require.NoError(t, err)
	assert.False(t, r.Allowed, "1/min over 2 processes is still 1")
	for _, opt := range []throttler.Option{throttler.WithLocalFallback(nil, 2), throttler.WithLocalFallback(memorybackend.New(), 0)} {
		_, err := throttler.New(memorybackend.New(), opt)
		assert.ErrorIs(t, err, throttler.ErrInvalidOption)
	}
	assert.Equal(t, "local", throttler.FailLocal.String())
}
