package throttler_test

import (
	"context"
	"strconv"
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

// counting counts the Decide calls that reach the memory backend.
type counting struct {
	*memorybackend.Backend
	decides atomic.Int64
}

func (c *counting) Decide(ctx context.Context, r driver.Request) (driver.Outcome, error) {
	c.decides.Add(1)
	return c.Backend.Decide(ctx, r)
}

func TestDenyCacheAnswersWithoutTheBackend(t *testing.T) {
	ctx := context.Background()
	clock := throttlertest.NewManualClock(t0)
	b := &counting{Backend: memorybackend.New()}
	th := testkit.Throttler(t, b, throttler.WithClock(clock), throttler.WithDenyCache(100, time.Hour))
	p := policy(t, "2/min")
	for i := 0; i < 2; i++ {
		r, err := th.Allow(ctx, p, "u")
		require.NoError(t, err)
		require.True(t, r.Allowed)
	}
	first, err := th.Allow(ctx, p, "u")
	require.NoError(t, err)
	require.False(t, first.Allowed)
	assert.False(t, first.Cached, "the first denial comes from the store")
	calls := b.decides.Load()

	clock.Advance(20 * time.Second)
	r, err := th.Allow(ctx, p, "u")
	require.NoError(t, err)
	assert.False(t, r.Allowed)
	assert.True(t, r.Cached)
	assert.Equal(t, calls, b.decides.Load(), "no backend call")
	assert.Equal(t, first.ResetAt, r.ResetAt, "the same window end")
	assert.Equal(t, first.RetryAfter-20*time.Second, r.RetryAfter)
	assert.Equal(t, first.Limits()[0].RetryAfter-20*time.Second, r.Limits()[0].RetryAfter)
	assert.Zero(t, r.Remaining)

	// A smaller cost than the cached one is not known to be denied.
	clock.Advance(time.Second)
	r, err = th.AllowN(ctx, p, "u", 0)
	require.NoError(t, err)
	assert.False(t, r.Cached)

	// When the window has closed, the store answers again.
	clock.Advance(40 * time.Second)
	r, err = th.Allow(ctx, p, "u")
	require.NoError(t, err)
	assert.True(t, r.Allowed)
	assert.False(t, r.Cached)
}

func TestDenyCacheStalenessBoundAndRefund(t *testing.T) {
	ctx := context.Background()
	clock := throttlertest.NewManualClock(t0)
	b := &counting{Backend: memorybackend.New()}
	th := testkit.Throttler(t, b, throttler.WithClock(clock), throttler.WithDenyCache(100, 5*time.Second))
	p := policy(t, "1/h")
	_, err := th.Allow(ctx, p, "u")
	require.NoError(t, err)
	r, err := th.Allow(ctx, p, "u")
	require.NoError(t, err)
	require.False(t, r.Allowed)

	clock.Advance(4 * time.Second)
	r, err = th.Allow(ctx, p, "u")
	require.NoError(t, err)
	assert.True(t, r.Cached, "within the staleness bound")
	clock.Advance(time.Second)
	r, err = th.Allow(ctx, p, "u")
	require.NoError(t, err)
	assert.False(t, r.Cached, "past the staleness bound the store is asked")
	assert.False(t, r.Allowed)

	// A local refund clears the entry at once.
	_, err = th.Refund(ctx, p, "u", 1)
	require.NoError(t, err)
	r, err = th.Allow(ctx, p, "u")
	require.NoError(t, err)
	assert.True(t, r.Allowed)
	assert.False(t, r.Cached)
}

func TestDenyCacheIsBounded(t *testing.T) {
	ctx := context.Background()
	clock := throttlertest.NewManualClock(t0)
	b := &counting{Backend: memorybackend.New()}
	th := testkit.Throttler(t, b, throttler.WithClock(clock), throttler.WithDenyCache(32, time.Hour))
	p := policy(t, "1/h")
	const n = 1000
	for i := 0; i < n; i++ {
		id := strconv.Itoa(i)
		_, err := th.Allow(ctx, p, id)
		require.NoError(t, err)
		_, err = th.Allow(ctx, p, id)
		require.NoError(t, err)
	}
	before := b.decides.Load()
	cached := 0
	for i := n - 1; i >= 0; i-- { // the most recent denials first
		r, err := th.Allow(ctx, p, strconv.Itoa(i))
		require.NoError(t, err)
		require.False(t, r.Allowed, "cached or not, every answer is a denial")
		if r.Cached {
			cached++
		}
	}
	assert.LessOrEqual(t, cached, 32, "at most the bound is remembered")
	assert.Positive(t, cached)
	assert.Equal(t, int64(n-cached), b.decides.Load()-before)
}

func TestDenyCacheRejectsBadOptions(t *testing.T) {
	for _, opt := range []throttler.Option{throttler.WithDenyCache(0, time.Second), throttler.WithDenyCache(1, 0)} {
		_, err := throttler.New(memorybackend.New(), opt)
		assert.ErrorIs(t, err, throttler.ErrInvalidOption)
	}
}
