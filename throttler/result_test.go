package throttler_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
)

// The per-limit figures, computed on demand, are the same through Limits,
// LimitAt and NumLimits, for a policy held in place (up to four limits) and
// for a larger one; Limits gives the caller a slice of its own.
func TestResultLimitFigures(t *testing.T) {
	clock, withClock := testkit.Clock()
	th := testkit.Throttler(t, memorybackend.New(), withClock)
	ctx := context.Background()
	for _, spec := range []string{"5/s, 100/min gcra", "5/s, 100/min gcra, 1000/h sliding, 20/2s aligned, 3000/day"} {
		p := testkit.Policy(t, "figures", spec)
		for range 3 {
			_, err := th.Allow(ctx, p, "u")
			require.NoError(t, err)
		}
		clock.Advance(100 * 1e6)
		r, err := th.AllowN(ctx, p, "u", 2)
		require.NoError(t, err)
		n := len(p.Limits())
		require.Equal(t, n, r.NumLimits(), spec)
		limits := r.Limits()
		require.Len(t, limits, n, spec)
		for i, l := range limits {
			assert.Equal(t, l, r.LimitAt(i), "%s: limit %d", spec, i)
			assert.Equal(t, p.Limits()[i].Name, l.Name)
		}
		assert.EqualValues(t, 5, limits[0].Used, "%s: the second's window holds every unit", spec)
		assert.Equal(t, r.Binding, limits[0].Name, "the tightest limit binds")
		assert.Equal(t, r.Remaining, limits[0].Remaining)
		assert.Zero(t, r.LimitAt(-1))
		assert.Zero(t, r.LimitAt(n))
		limits[0].Used = 99
		assert.EqualValues(t, 5, r.Limits()[0].Used, "%s: Limits returns a copy", spec)

		denied, err := th.Allow(ctx, p, "u")
		require.NoError(t, err)
		require.False(t, denied.Allowed)
		assert.False(t, denied.LimitAt(0).Allowed)
		assert.Equal(t, denied.RetryAfter, denied.LimitAt(0).RetryAfter)
	}
}

// SetLimits gives a Result built outside a throttler its figures, copied;
// a Result without any reports none.
func TestResultSetLimits(t *testing.T) {
	var r throttler.Result
	assert.Zero(t, r.NumLimits())
	assert.Nil(t, r.Limits())
	given := []throttler.LimitResult{{Name: "a", Used: 1}, {Name: "b", Used: 2}}
	r.SetLimits(given)
	given[0].Used = 7
	require.Equal(t, 2, r.NumLimits())
	assert.Equal(t, []throttler.LimitResult{{Name: "a", Used: 1}, {Name: "b", Used: 2}}, r.Limits())
	assert.Equal(t, "b", r.LimitAt(1).Name)
	r.SetLimits(nil)
	assert.Zero(t, r.NumLimits())
}

// A denial answered from the deny cache keeps the figures of the denial it
// remembers, every denying limit's RetryAfter counted down since.
func TestResultCachedDenialFigures(t *testing.T) {
	clock, withClock := testkit.Clock()
	th := testkit.Throttler(t, memorybackend.New(), withClock, throttler.WithDenyCache(100, 10*1e9))
	ctx := context.Background()
	p := testkit.Policy(t, "cached", "2/min, 100/h")
	for range 2 {
		_, err := th.Allow(ctx, p, "u")
		require.NoError(t, err)
	}
	first, err := th.Allow(ctx, p, "u")
	require.NoError(t, err)
	require.False(t, first.Allowed)
	clock.Advance(1e9)
	again, err := th.Allow(ctx, p, "u")
	require.NoError(t, err)
	require.True(t, again.Cached)
	assert.Equal(t, first.LimitAt(0).RetryAfter-1e9, again.LimitAt(0).RetryAfter)
	assert.Equal(t, first.LimitAt(1), again.LimitAt(1), "an allowing limit's figures are the denial's")
	assert.Equal(t, again.RetryAfter, again.LimitAt(0).RetryAfter)
}
