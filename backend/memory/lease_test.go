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
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// Lease sets are swept 30 s after their latest lease expires, released or
// not (a crashed holder), and a held lease survives every sweep.
func TestLeaseSetsAreSwept(t *testing.T) {
	ctx := context.Background()
	clock := throttlertest.NewManualClock(t0)
	b := memorybackend.New(memorybackend.WithSweepClock(clock))
	th := newThrottler(t, b, clock, nil)
	short, err := throttler.NewConcurrencyLimit("short", 1, time.Second)
	require.NoError(t, err)
	long, err := throttler.NewConcurrencyLimit("long", 1, time.Hour)
	require.NoError(t, err)

	kept, err := th.Acquire(ctx, long, "keeper")
	require.NoError(t, err)
	require.True(t, kept.Acquired)
	for i := 0; i < 10000; i++ {
		lease, err := th.Acquire(ctx, short, fmt.Sprint("burst", i))
		require.NoError(t, err)
		require.True(t, lease.Acquired)
		if i%2 == 0 {
			require.NoError(t, lease.Release(ctx)) // the others crash
		}
		clock.Advance(20 * time.Millisecond)
	}
	assert.Less(t, b.Len(), 64*64+1000, "expired and released lease sets were swept")
	again, err := th.Acquire(ctx, long, "keeper")
	require.NoError(t, err)
	assert.False(t, again.Acquired, "a held lease survives every sweep")
}

// At WithMaxIdentifiers, a new lease set fails (and the failure mode
// decides) while held ones keep working.
func TestLeaseSetsCountAgainstMaxIdentifiers(t *testing.T) {
	ctx := context.Background()
	clock := throttlertest.NewManualClock(t0)
	b := memorybackend.New(memorybackend.WithMaxIdentifiers(2), memorybackend.WithSweepClock(clock))
	th := newThrottler(t, b, clock, nil)
	l, err := throttler.NewConcurrencyLimit("conc", 2, time.Minute, throttler.WithFailureMode(throttler.FailClosed))
	require.NoError(t, err)
	for _, id := range []string{"a", "b"} {
		lease, err := th.Acquire(ctx, l, id)
		require.NoError(t, err)
		require.True(t, lease.Acquired && !lease.Degraded)
	}
	lease, err := th.Acquire(ctx, l, "c")
	require.NoError(t, err)
	assert.True(t, lease.Degraded)
	assert.False(t, lease.Acquired)
	assert.True(t, errors.Is(lease.Err, memorybackend.ErrFull), "%v", lease.Err)
	lease, err = th.Acquire(ctx, l, "a")
	require.NoError(t, err)
	assert.True(t, lease.Acquired && !lease.Degraded, "held pairs keep working")
	assert.Equal(t, int64(2), lease.InFlight)
}
