package throttler_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// failingNonblocking is a nonblocking backend whose Decide fails, or
// answers with too few states: the in-process fast path must apply the
// failure mode as the general path does.
type failingNonblocking struct{ short bool }

func (f failingNonblocking) Decide(context.Context, driver.Request) (driver.Outcome, error) {
	if f.short {
		return driver.Outcome{Allowed: true}, nil
	}
	return driver.Outcome{}, errors.New("store is down")
}

func (failingNonblocking) Nonblocking() bool { return true }

func TestInProcessPathAppliesTheFailureMode(t *testing.T) {
	ctx := context.Background()
	p := testkit.Policy(t, "api", "10/s, 100/min")
	for _, short := range []bool{false, true} {
		open := testkit.Throttler(t, failingNonblocking{short}, throttler.WithLogger(nil))
		r, err := open.Allow(ctx, p, "u")
		require.NoError(t, err)
		assert.True(t, r.Allowed && r.Degraded, "short=%v: fails open", short)
		assert.ErrorIs(t, r.Err, throttler.ErrBackend)
		assert.Equal(t, "u", r.Identifier)
		assert.EqualValues(t, 1, r.LimitAt(0).Used)

		closed := testkit.Throttler(t, failingNonblocking{short}, throttler.WithLogger(nil), throttler.WithFailureMode(throttler.FailClosed))
		r, err = closed.Allow(ctx, p, "u")
		require.NoError(t, err)
		assert.True(t, !r.Allowed && r.Degraded, "short=%v: fails closed", short)
		for _, l := range r.Limits() {
			assert.False(t, l.Allowed)
			assert.Zero(t, l.Remaining)
			assert.Equal(t, l.Limit, l.Used)
		}
	}
	r, err := testkit.Throttler(t, failingNonblocking{short: true}, throttler.WithLogger(nil)).Allow(ctx, p, "u")
	require.NoError(t, err)
	assert.ErrorIs(t, r.Err, driver.ErrBadReply)
}
