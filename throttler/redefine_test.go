package throttler_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
)

// Raising Max keeps the open window (docs/SPEC.md, Policies redefined 1)
// for every algorithm, named limit or not: 2 units spent under "2/min",
// then the policy redefined as "3/min" on the same store. Under the key
// layout 1 an unnamed limit's key held its notation, Max included, and a
// GCRA limit's its capacity, so every unnamed case below started afresh
// (remaining 3).
func TestRaisingMaxKeepsTheWindow(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		name     string
		old, new string
		// remaining is what the redefined policy shows: the window's 2
		// spent units count against the new Max. For GCRA the state is a
		// theoretical arrival time 2 × 30 s = 60 s ahead, which at the new
		// rate (one unit per 20 s, burst 3 = 60 s) leaves nothing until
		// 20 s have passed; with the burst kept at 2 (40 s), until 40 s.
		remaining int64
		// after20s is whether one more unit is allowed 20 s later.
		after20s bool
	}{
		{"fixed", "2/min", "3/min", 1, true},
		{"aligned", "2/min aligned", "3/min aligned", 1, true},
		{"sliding", "2/min sliding", "3/min sliding", 1, true},
		{"gcra without burst", "2/min gcra", "3/min gcra", 0, true},
		{"gcra with burst", "2/min gcra burst=2", "3/min gcra burst=2", 0, false},
		{"named", "2/min name=per-minute", "3/min name=per-minute", 1, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			clock, withClock := testkit.Clock()
			th := testkit.Throttler(t, memorybackend.New(), withClock)
			old := testkit.Policy(t, "api", c.old)
			var spent throttler.Result
			for range 2 {
				var err error
				spent, err = th.Allow(ctx, old, "u")
				require.NoError(t, err)
				require.True(t, spent.Allowed)
			}
			require.Zero(t, spent.Remaining)

			raised := testkit.Policy(t, "api", c.new)
			got, err := th.Peek(ctx, raised, "u")
			require.NoError(t, err)
			assert.Equal(t, c.remaining, got.Remaining, "remaining under %q", c.new)
			assert.Equal(t, spent.ResetAt, got.ResetAt, "the window's end, or the GCRA bucket's refill, is kept")

			// A policy of another name shows what a fresh window would.
			fresh, err := th.Peek(ctx, testkit.Policy(t, "other", c.new), "u")
			require.NoError(t, err)
			assert.Equal(t, fresh.Limit, fresh.Remaining)
			assert.Greater(t, fresh.Remaining, got.Remaining)

			clock.Advance(20 * time.Second)
			got, err = th.Allow(ctx, raised, "u")
			require.NoError(t, err)
			assert.Equal(t, c.after20s, got.Allowed)
			if got.Limits()[0].Algorithm != throttler.GCRA {
				assert.Equal(t, spent.ResetAt, got.ResetAt, "the third unit lands in the same window")
			}
			denied, err := th.Allow(ctx, raised, "u")
			require.NoError(t, err)
			assert.False(t, denied.Allowed, "3 units in the window at most")
		})
	}
}

// Lowering Max keeps the window too: the units spent count against the
// lower quota at once.
func TestLoweringMaxKeepsTheWindow(t *testing.T) {
	ctx := context.Background()
	_, withClock := testkit.Clock()
	th := testkit.Throttler(t, memorybackend.New(), withClock)
	for range 2 {
		r, err := th.Allow(ctx, testkit.Policy(t, "api", "5/min"), "u")
		require.NoError(t, err)
		require.True(t, r.Allowed)
	}
	r, err := th.Allow(ctx, testkit.Policy(t, "api", "2/min"), "u")
	require.NoError(t, err)
	assert.False(t, r.Allowed)
}

// A policy rebuilt from another's Limits, whose unnamed limits come back
// named by their notation, keeps their keys whatever their new Max: the
// notation names nothing. The throttler's per-process shares are built
// that way.
func TestPolicyRebuiltFromLimitsKeepsTheWindow(t *testing.T) {
	ctx := context.Background()
	_, withClock := testkit.Clock()
	th := testkit.Throttler(t, memorybackend.New(), withClock)
	p := testkit.Policy(t, "api", "2/min, 100/h gcra")
	for range 2 {
		r, err := th.Allow(ctx, p, "u")
		require.NoError(t, err)
		require.True(t, r.Allowed)
	}
	limits := p.Limits()
	require.Equal(t, "2/min", limits[0].Name, "shown by its notation")
	limits[0].Max = 3
	rebuilt, err := throttler.NewPolicy("api", limits)
	require.NoError(t, err)
	got, err := th.Peek(ctx, rebuilt, "u")
	require.NoError(t, err)
	assert.EqualValues(t, 1, got.Limits()[0].Remaining)
	assert.EqualValues(t, 98, got.Limits()[1].Remaining)

	// A literal named after a notation, even another limit's, names
	// nothing either.
	literal, err := throttler.NewPolicy("api", []throttler.Limit{{Name: "7/s", Max: 3, Window: time.Minute}})
	require.NoError(t, err)
	got, err = th.Peek(ctx, literal, "u")
	require.NoError(t, err)
	assert.EqualValues(t, 1, got.Remaining)
}

// Naming a limit gives it an identity of its own: the unnamed limit's
// window is not its, and two limits of one window and algorithm can live
// in one policy only when named apart.
func TestNamedLimitsHaveTheirOwnWindows(t *testing.T) {
	ctx := context.Background()
	_, withClock := testkit.Clock()
	th := testkit.Throttler(t, memorybackend.New(), withClock)
	for range 2 {
		_, err := th.Allow(ctx, testkit.Policy(t, "api", "2/min"), "u")
		require.NoError(t, err)
	}
	got, err := th.Peek(ctx, testkit.Policy(t, "api", "2/min name=m"), "u")
	require.NoError(t, err)
	assert.EqualValues(t, 2, got.Remaining)

	both := testkit.Policy(t, "api", "2/min, 3/min name=m")
	r, err := th.Allow(ctx, both, "u")
	require.NoError(t, err)
	assert.False(t, r.Allowed)
	assert.Equal(t, "2/min", r.Binding)
	assert.EqualValues(t, 3, r.Limits()[1].Remaining, "a denial spends nothing")
}

// Two unnamed limits of one window and algorithm would share one key:
// the policy is rejected, and names fix it.
func TestUnnamedLimitsOfOneIdentityAreRejected(t *testing.T) {
	for _, spec := range []string{"10/s, 20/s", "10/s gcra, 20/s gcra", "1/min sliding, 5/min sliding", "2/h aligned, 3/60min aligned"} {
		_, err := throttler.ParsePolicy("api", spec)
		assert.ErrorIs(t, err, throttler.ErrInvalidPolicy, spec)
	}
	_, err := throttler.NewPolicy("api", []throttler.Limit{throttler.PerSecond(10), {Name: "20/s", Max: 20, Window: time.Second}})
	assert.ErrorIs(t, err, throttler.ErrInvalidPolicy, "a notation names nothing")
	for _, spec := range []string{
		"10/s, 20/s name=wide", "10/s name=a, 20/s name=b", "10/s, 20/s gcra", "10/s, 20/2s",
		"10/s gcra, 20/s gcra burst=40", "10/s gcra burst=20, 20/s gcra burst=40",
	} {
		_, err := throttler.ParsePolicy("api", spec)
		assert.NoError(t, err, spec)
	}
}

func TestParseLimitName(t *testing.T) {
	for _, c := range []struct {
		in   string
		want throttler.Limit
	}{
		{"10/s name=burst", throttler.PerSecond(10).Named("burst")},
		{"10/s NAME=Burst", throttler.PerSecond(10).Named("Burst")},
		{"name=x 10/s", throttler.Limit{}},
		{"10/s gcra name=smooth burst=20", throttler.Limit{Name: "smooth", Max: 10, Window: time.Second, Algorithm: throttler.GCRA, Burst: 20}},
		{"5/min sliding name=a=b", throttler.Limit{Name: "a=b", Max: 5, Window: time.Minute, Algorithm: throttler.SlidingWindow}},
		{"5/min name=per-user/min", throttler.PerMinute(5).Named("per-user/min")},
	} {
		got, err := throttler.ParseLimit(c.in)
		if c.want == (throttler.Limit{}) {
			assert.ErrorIs(t, err, throttler.ErrInvalidLimit, c.in)
			continue
		}
		require.NoError(t, err, c.in)
		assert.Equal(t, c.want, got, c.in)
	}
	p := testkit.Policy(t, "api", "10/s name=burst, 1000/h")
	assert.Equal(t, []string{"burst", "1000/h"}, []string{p.Limits()[0].Name, p.Limits()[1].Name})
	assert.Equal(t, "api: 10/s name=burst, 1000/h", p.String())

	for in, why := range map[string]string{
		"10/s name=":             "name must not be empty",
		"10/s name=a name=b":     `option "name" given twice`,
		"10/s name=a name=a":     `option "name" given twice`,
		"10/s name=a,b":          `name a,b holds a comma`,
		"10/s name=10/s":         `name "10/s" is a limit notation`,
		"10/s name=5/MIN":        `name "5/MIN" is a limit notation`,
		"10/s name":              `unknown option "name"`,
		"10/s burst=5 name=x":    "burst applies only to gcra",
		"10/s gcra name=x gcra":  `option "gcra" given twice`,
		"0/s name=x":             `max "0" must be a positive whole number`,
		"10/s aligned name=x,":   "holds a comma",
		"1/400d name=ok 1/1d":    "unknown option",
		"10/s name=x sliding=on": "unknown option",
	} {
		_, err := throttler.ParseLimit(in)
		require.ErrorIs(t, err, throttler.ErrInvalidLimit, in)
		assert.Contains(t, err.Error(), why, in)
	}
	// ParsePolicy splits on commas first: a comma never reaches a name.
	_, err := throttler.ParsePolicy("api", "10/s name=a,b")
	assert.ErrorIs(t, err, throttler.ErrInvalidLimit)
	_, err = throttler.ParsePolicy("api", "10/s name=a, 20/s name=a")
	assert.ErrorIs(t, err, throttler.ErrInvalidPolicy, "two limits named a")
}
