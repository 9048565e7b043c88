package breaker_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/breaker"
	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// decideOnly hides every optional interface of a backend.
type decideOnly struct{ inner driver.Backend }

func (d decideOnly) Decide(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	return d.inner.Decide(ctx, req)
}

// Leases go through the breaker to the wrapped backend; a wrapped backend
// without leases is unsupported at once, whatever the breaker's state.
func TestLeasesThroughTheBreaker(t *testing.T) {
	ctx := context.Background()
	b, err := breaker.Wrap(memorybackend.New(), "memory", breaker.WithLogger(nil))
	require.NoError(t, err)
	th := testkit.Throttler(t, b, throttler.WithClock(throttlertest.NewManualClock(testkit.T0)))
	l, err := throttler.NewConcurrencyLimit("conc", 1, time.Minute)
	require.NoError(t, err)
	lease, err := th.Acquire(ctx, l, "u")
	require.NoError(t, err)
	require.True(t, lease.Acquired)
	refused, err := th.Acquire(ctx, l, "u")
	require.NoError(t, err)
	assert.False(t, refused.Acquired)
	require.NoError(t, lease.Release(ctx))
	again, err := th.Acquire(ctx, l, "u")
	require.NoError(t, err)
	assert.True(t, again.Acquired)

	none, err := breaker.Wrap(decideOnly{memorybackend.New()}, "memcached-like", breaker.WithLogger(nil))
	require.NoError(t, err)
	_, err = testkit.Throttler(t, none).Acquire(ctx, l, "u")
	assert.ErrorIs(t, err, errors.ErrUnsupported)
	var zero breaker.Backend
	_, err = zero.Acquire(ctx, driver.LeaseRequest{})
	assert.ErrorIs(t, err, driver.ErrNotInitialized)
}
