package shardedbackend

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
	"github.com/throttlekit/throttlekit/throttler/driver"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// Leases go to the primary of the identifier's shard, and only there.
func TestLeasesGoToTheOwner(t *testing.T) {
	ctx := context.Background()
	b := newMemoryLayout(t, "a", "b", "c")
	th := testkit.Throttler(t, b, throttler.WithClock(throttlertest.NewManualClock(t0)))
	l, err := throttler.NewConcurrencyLimit("conc", 1, time.Minute)
	require.NoError(t, err)
	dl, err := driver.NewConcurrencyLimit("conc", 1, time.Minute)
	require.NoError(t, err)
	for _, id := range identifiers(30) {
		lease, err := th.Acquire(ctx, l, id)
		require.NoError(t, err)
		require.True(t, lease.Acquired, id)
		for _, s := range b.shards {
			out, err := s.primary.(driver.Leaser).Release(ctx, driver.LeaseRequest{Limit: dl, Identifier: id, Lease: "probe", Now: t0})
			require.NoError(t, err)
			assert.Equal(t, s.name == b.ShardFor(id), out.InFlight == 1, "%s on shard %s", id, s.name)
		}
		require.NoError(t, lease.Release(ctx))
		again, err := th.Acquire(ctx, l, id)
		require.NoError(t, err)
		assert.True(t, again.Acquired)
	}
}

func TestLeasesUnsupportedByThePrimary(t *testing.T) {
	ctx := context.Background()
	b, err := New([]Shard{{Name: "a", Primary: decideOnly{memorybackend.New()}}})
	require.NoError(t, err)
	dl, err := driver.NewConcurrencyLimit("conc", 1, time.Minute)
	require.NoError(t, err)
	req := driver.LeaseRequest{Limit: dl, Identifier: "x", Lease: "l", Now: t0}
	_, err = b.Acquire(ctx, req)
	require.ErrorIs(t, err, errors.ErrUnsupported)
	assert.Contains(t, err.Error(), `shard "a": acquire`)
	_, err = b.Release(ctx, req)
	require.ErrorIs(t, err, errors.ErrUnsupported)

	// The throttler returns it as an error, not a degraded lease.
	l, err := throttler.NewConcurrencyLimit("conc", 1, time.Minute)
	require.NoError(t, err)
	lease, err := testkit.Throttler(t, b).Acquire(ctx, l, "x")
	assert.Nil(t, lease)
	assert.ErrorIs(t, err, errors.ErrUnsupported)
}
