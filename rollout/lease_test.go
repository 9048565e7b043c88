package rollout

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

func leaseLimit(t *testing.T, max int64) *throttler.ConcurrencyLimit {
	t.Helper()
	l, err := throttler.NewConcurrencyLimit("conc", max, time.Minute)
	require.NoError(t, err)
	return l
}

// inFlight returns how many leases b holds for id under l.
func inFlight(t *testing.T, b driver.Backend, l *throttler.ConcurrencyLimit, id string) int64 {
	t.Helper()
	out, err := b.(driver.Leaser).Release(context.Background(), driver.LeaseRequest{Limit: mustDriverLimit(t, l), Identifier: id, Lease: "probe", Now: t0})
	require.NoError(t, err)
	return out.InFlight
}

// Split mode: a lease goes to the serving backend only, and a lease taken
// before its identifier moved is released where it was taken.
func TestSplitLeasesFollowTheSide(t *testing.T) {
	ctx := context.Background()
	src := mustStatic(t, 0)
	oldB, newB := memorybackend.New(), memorybackend.New()
	th := testkit.Throttler(t, mustRollout(t, oldB, newB, src), throttler.WithClock(throttlertest.NewManualClock(t0)))
	l := leaseLimit(t, 1)
	lease, err := th.Acquire(ctx, l, "u")
	require.NoError(t, err)
	require.True(t, lease.Acquired)
	assert.EqualValues(t, 1, inFlight(t, oldB, l, "u"))
	assert.EqualValues(t, 0, inFlight(t, newB, l, "u"))

	require.NoError(t, src.Set(100))
	moved, err := th.Acquire(ctx, l, "u")
	require.NoError(t, err)
	assert.True(t, moved.Acquired, "split mode: a moved identifier starts afresh")
	require.NoError(t, lease.Release(ctx))
	assert.EqualValues(t, 0, inFlight(t, oldB, l, "u"), "released on the backend that held it")
	assert.EqualValues(t, 1, inFlight(t, newB, l, "u"))
}

// Mirror mode: both backends hold every lease, so a move keeps the count,
// and a release frees both.
func TestMirrorLeasesKeepTheCountAcrossAMove(t *testing.T) {
	ctx := context.Background()
	src := mustStatic(t, 0)
	oldB, newB := memorybackend.New(), memorybackend.New()
	rb := mustRollout(t, oldB, newB, src, WithMode(MirrorMode))
	th := testkit.Throttler(t, rb, throttler.WithClock(throttlertest.NewManualClock(t0)))
	l := leaseLimit(t, 1)
	lease, err := th.Acquire(ctx, l, "u")
	require.NoError(t, err)
	require.True(t, lease.Acquired)
	assert.EqualValues(t, 1, inFlight(t, newB, l, "u"))
	assert.EqualValues(t, 1, rb.Stats().Mirrored)

	require.NoError(t, src.Set(100))
	refused, err := th.Acquire(ctx, l, "u")
	require.NoError(t, err)
	assert.False(t, refused.Acquired, "the new backend counts the lease taken before the move")
	require.NoError(t, lease.Release(ctx))
	assert.EqualValues(t, 0, inFlight(t, oldB, l, "u"))
	assert.EqualValues(t, 0, inFlight(t, newB, l, "u"))

	// A secondary already full refuses: a shortfall, not a refusal.
	_, err = newB.Acquire(ctx, driver.LeaseRequest{Limit: mustDriverLimit(t, l), Identifier: "v", Lease: "other", Now: t0})
	require.NoError(t, err)
	require.NoError(t, src.Set(0))
	got, err := th.Acquire(ctx, l, "v")
	require.NoError(t, err)
	assert.True(t, got.Acquired)
	assert.EqualValues(t, 1, rb.Stats().MirrorShortfalls)
}

func mustDriverLimit(t *testing.T, l *throttler.ConcurrencyLimit) *driver.ConcurrencyLimit {
	t.Helper()
	dl, err := driver.NewConcurrencyLimit(l.Name(), l.Max(), l.LeaseTTL())
	require.NoError(t, err)
	return dl
}

// A serving backend without leases is unsupported; a secondary without
// them is skipped.
func TestLeasesWithoutLeaser(t *testing.T) {
	ctx := context.Background()
	l := leaseLimit(t, 1)
	rb := mustRollout(t, decideOnly{memorybackend.New()}, memorybackend.New(), mustStatic(t, 0), WithMode(MirrorMode))
	_, err := testkit.Throttler(t, rb).Acquire(ctx, l, "u")
	assert.ErrorIs(t, err, errors.ErrUnsupported)

	rb = mustRollout(t, memorybackend.New(), decideOnly{memorybackend.New()}, mustStatic(t, 0), WithMode(MirrorMode))
	lease, err := testkit.Throttler(t, rb).Acquire(ctx, l, "u")
	require.NoError(t, err)
	assert.True(t, lease.Acquired)
	assert.NoError(t, lease.Release(ctx))
	assert.Zero(t, rb.Stats().SecondaryErrors)
}
