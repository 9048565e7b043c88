package throttler_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// decideOnly hides every optional interface of a backend but Peeker, so the
// throttler takes by peeking and deciding.
type decideOnly struct{ b *memorybackend.Backend }

func (d decideOnly) Decide(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	return d.b.Decide(ctx, req)
}

func (d decideOnly) Peek(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	return d.b.Peek(ctx, req)
}

// TestAllowUpToOnEveryPath: the same takes through a Taker and through the
// peek-and-decide fallback grant the same units.
func TestAllowUpToOnEveryPath(t *testing.T) {
	for name, b := range map[string]driver.Backend{"taker": memorybackend.New(), "fallback": decideOnly{memorybackend.New()}} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			mc, clock := testkit.Clock()
			th := testkit.Throttler(t, b, clock)
			p := policy(t, "5/s, 8/min")
			var got []int64
			for _, n := range []int64{10, 10, 2} {
				r, err := th.AllowUpTo(ctx, p, "batch", n)
				require.NoError(t, err)
				got = append(got, r.Granted)
				assert.Equal(t, r.Granted > 0, r.Allowed)
				mc.Advance(1100 * 1e6) // 1.1 s
			}
			assert.Equal(t, []int64{5, 3, 0}, got)
		})
	}
}

// TestAllowUpToBadInputAndFailureModes: n < 1 is ErrInvalidCost; a failed
// backend grants min(n, capacity) when failing open and nothing when
// failing closed.
func TestAllowUpToBadInputAndFailureModes(t *testing.T) {
	ctx := context.Background()
	_, clock := testkit.Clock()
	th := testkit.Throttler(t, memorybackend.New(), clock)
	p := policy(t, "5/min")
	for _, n := range []int64{0, -1} {
		_, err := th.AllowUpTo(ctx, p, "x", n)
		assert.ErrorIs(t, err, throttler.ErrInvalidCost)
	}
	open := testkit.Throttler(t, failing{}, clock, throttler.WithLogger(nil))
	r, err := open.AllowUpTo(ctx, p, "x", 9)
	require.NoError(t, err)
	assert.True(t, r.Degraded && r.Allowed)
	assert.EqualValues(t, 5, r.Granted)
	closed := testkit.Throttler(t, failing{}, clock, throttler.WithLogger(nil), throttler.WithFailureMode(throttler.FailClosed))
	r, err = closed.AllowUpTo(ctx, p, "x", 9)
	require.NoError(t, err)
	assert.True(t, r.Degraded && !r.Allowed)
	assert.EqualValues(t, 0, r.Granted)
	local := testkit.Throttler(t, failing{}, clock, throttler.WithLogger(nil),
		throttler.WithFailureMode(throttler.FailLocal), throttler.WithLocalFallback(memorybackend.New(), 2))
	r, err = local.AllowUpTo(ctx, p, "x", 9)
	require.NoError(t, err)
	assert.True(t, r.Degraded && r.Local && r.Allowed)
	assert.EqualValues(t, 3, r.Granted, "this process's share of 5/min over 2 processes is 3")
}

// TestAllowUpToDenialIsCached: with a deny cache, a take that got nothing
// is remembered and the next take is answered from the cache.
func TestAllowUpToDenialIsCached(t *testing.T) {
	ctx := context.Background()
	_, clock := testkit.Clock()
	th := testkit.Throttler(t, memorybackend.New(), clock, throttler.WithDenyCache(10, 60e9))
	p := policy(t, "2/min")
	r, err := th.AllowUpTo(ctx, p, "x", 5)
	require.NoError(t, err)
	require.EqualValues(t, 2, r.Granted)
	r, err = th.AllowUpTo(ctx, p, "x", 5)
	require.NoError(t, err)
	require.False(t, r.Allowed)
	assert.False(t, r.Cached)
	r, err = th.AllowUpTo(ctx, p, "x", 5)
	require.NoError(t, err)
	assert.True(t, r.Cached)
	assert.EqualValues(t, 0, r.Granted)
}
