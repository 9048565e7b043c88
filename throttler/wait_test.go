package throttler_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
)

// TestWaitReturnsAtOnceWhenTheDeadlineIsTooNear: the window reopens in a
// minute and the deadline is a second away: Wait fails before the deadline
// passes, with an error that says so.
func TestWaitReturnsAtOnceWhenTheDeadlineIsTooNear(t *testing.T) {
	_, clock := testkit.Clock()
	th := testkit.Throttler(t, memorybackend.New(), clock)
	p := policy(t, "1/min")
	_, err := th.Allow(context.Background(), p, "worker")
	require.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	r, err := th.Wait(ctx, p, "worker")
	require.ErrorIs(t, err, throttler.ErrWaitExceedsDeadline)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.NoError(t, ctx.Err(), "Wait returned at once, not at the deadline")
	assert.False(t, r.Allowed)
	assert.Equal(t, time.Minute, r.RetryAfter)
}

// TestWaitWakesWhenTheWindowOpens: on a manual clock, a waiting worker
// returns allowed no later than 50 ms (clock time) after the window it
// waits for opens, whatever the jitter.
func TestWaitWakesWhenTheWindowOpens(t *testing.T) {
	for _, spec := range []string{"3/min", "3/min sliding", "3/min gcra"} {
		t.Run(spec, func(t *testing.T) {
			mc, clock := testkit.Clock()
			th := testkit.Throttler(t, memorybackend.New(), clock)
			p := policy(t, spec)
			ctx := context.Background()
			_, err := th.AllowN(ctx, p, "worker", 3)
			require.NoError(t, err)
			denied, err := th.Allow(ctx, p, "worker")
			require.NoError(t, err)
			require.False(t, denied.Allowed)
			opens := testkit.T0.Add(denied.RetryAfter)

			done := make(chan throttler.Result, 1)
			errc := make(chan error, 1)
			go func() {
				r, err := th.Wait(ctx, p, "worker")
				errc <- err
				done <- r
			}()
			// Once the waiter sleeps, move the clock to just before the
			// window opens, then in 1 ms steps until Wait returns (at
			// most 100 ms of clock time).
			for i := 0; mc.Waiters() == 0; i++ {
				require.Less(t, i, 5000, "Wait never went to sleep")
				time.Sleep(time.Millisecond)
			}
			mc.Set(opens.Add(-time.Millisecond))
			var r throttler.Result
		loop:
			for range 100 {
				select {
				case err := <-errc:
					require.NoError(t, err)
					r = <-done
					break loop
				case <-time.After(2 * time.Millisecond):
					mc.Advance(time.Millisecond)
				}
			}
			require.True(t, r.Allowed, "Wait did not return within 100 ms of clock time")
			late := r.At.Sub(opens)
			assert.GreaterOrEqual(t, late, time.Duration(0), "allowed before the window opened")
			assert.LessOrEqual(t, late, 50*time.Millisecond, "allowed %v after the window opened", late)
			t.Logf("%s: the window opened at T0+%v, Wait returned at T0+%v (%v later)", spec,
				opens.Sub(testkit.T0), r.At.Sub(testkit.T0), late)
		})
	}
}

// TestWaitOnTheWallClock: without a clock of its own, Wait sleeps in real
// time and returns allowed.
func TestWaitOnTheWallClock(t *testing.T) {
	th := testkit.Throttler(t, memorybackend.New())
	p := policy(t, "1/50ms")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 3 {
		r, err := th.Wait(ctx, p, "worker")
		require.NoError(t, err)
		require.True(t, r.Allowed)
	}
}

// TestWaitErrors: a cost that never fits fails at once; a failure mode that
// denies fails with the backend's error; one that allows returns allowed;
// a context canceled while waiting ends the wait.
func TestWaitErrors(t *testing.T) {
	ctx := context.Background()
	_, clock := testkit.Clock()
	th := testkit.Throttler(t, memorybackend.New(), clock)
	_, err := th.WaitN(ctx, policy(t, "5/min"), "x", 6)
	require.ErrorIs(t, err, throttler.ErrCostExceedsLimit)

	closed := testkit.Throttler(t, failing{}, clock, throttler.WithLogger(nil), throttler.WithFailureMode(throttler.FailClosed))
	r, err := closed.Wait(ctx, policy(t, "5/min"), "x")
	require.ErrorIs(t, err, throttler.ErrBackend)
	require.ErrorIs(t, err, errDown)
	assert.True(t, r.Degraded && !r.Allowed)

	open := testkit.Throttler(t, failing{}, clock, throttler.WithLogger(nil))
	r, err = open.Wait(ctx, policy(t, "5/min"), "x")
	require.NoError(t, err)
	assert.True(t, r.Degraded && r.Allowed)

	p := policy(t, "1/min")
	_, err = th.Allow(ctx, p, "y")
	require.NoError(t, err)
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		time.Sleep(20 * time.Millisecond)
		cancel()
	}()
	_, err = th.Wait(cctx, p, "y")
	require.ErrorIs(t, err, context.Canceled)
	assert.False(t, errors.Is(err, throttler.ErrWaitExceedsDeadline))
}
