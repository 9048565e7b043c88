package driver_test

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// TestMergeRule walks the rule of driver.Merge case by case, on a manual
// timeline: now is 100 s after the epoch.
func TestMergeRule(t *testing.T) {
	now := time.UnixMilli(100_000)
	nowUs := now.UnixMicro()
	fixed := limit(t, "f", driver.FixedWindow, 10, time.Minute, 0)
	aligned := limit(t, "a", driver.AlignedWindow, 10, time.Minute, 0)
	gcra := limit(t, "g", driver.GCRA, 10, time.Minute, 0)
	sliding := limit(t, "s", driver.SlidingWindow, 10, time.Minute, 0)
	cases := []struct {
		name                string
		l                   driver.Limit
		held, given, merged driver.State
		changed             bool
	}{
		{"fixed: nothing held takes given", fixed, driver.State{}, driver.State{Used: 4, End: 130_000}, driver.State{Used: 4, End: 130_000}, true},
		{"fixed: closed held takes given", fixed, driver.State{Used: 9, End: 100_000}, driver.State{Used: 4, End: 130_000}, driver.State{Used: 4, End: 130_000}, true},
		{"fixed: closed given ignored", fixed, driver.State{Used: 2, End: 140_000}, driver.State{Used: 8, End: 100_000}, driver.State{Used: 2, End: 140_000}, false},
		{"fixed: same window keeps the larger count", fixed, driver.State{Used: 6, End: 130_000}, driver.State{Used: 4, End: 130_000}, driver.State{Used: 6, End: 130_000}, false},
		{"fixed: same window takes a larger given", fixed, driver.State{Used: 3, End: 130_000}, driver.State{Used: 4, End: 130_000}, driver.State{Used: 4, End: 130_000}, true},
		{"fixed: another open window keeps the held End, the larger count", fixed, driver.State{Used: 1, End: 150_000}, driver.State{Used: 4, End: 130_000}, driver.State{Used: 4, End: 150_000}, true},
		{"fixed: a later open window keeps the held End", fixed, driver.State{Used: 1, End: 130_000}, driver.State{Used: 4, End: 150_000}, driver.State{Used: 4, End: 130_000}, true},
		{"fixed: another open window with a smaller count changes nothing", fixed, driver.State{Used: 6, End: 150_000}, driver.State{Used: 4, End: 130_000}, driver.State{Used: 6, End: 150_000}, false},
		{"aligned: the next window keeps the held one", aligned, driver.State{Used: 2, End: 120_000}, driver.State{Used: 7, End: 180_000}, driver.State{Used: 7, End: 120_000}, true},
		{"aligned: closed held takes the given window", aligned, driver.State{Used: 2, End: 60_000}, driver.State{Used: 7, End: 120_000}, driver.State{Used: 7, End: 120_000}, true},
		{"gcra: later TAT wins", gcra, driver.State{End: nowUs + 5e6}, driver.State{End: nowUs + 9e6}, driver.State{End: nowUs + 9e6}, true},
		{"gcra: earlier given ignored", gcra, driver.State{End: nowUs + 9e6}, driver.State{End: nowUs + 5e6}, driver.State{End: nowUs + 9e6}, false},
		{"gcra: past TAT ignored", gcra, driver.State{}, driver.State{End: nowUs}, driver.State{}, false},
		{"sliding: previous window given becomes canonical", sliding, driver.State{}, driver.State{Used: 7, End: 60_000}, driver.State{Used: 0, End: 120_000, Prev: 7}, true},
		{"sliding: same window takes each larger count", sliding, driver.State{Used: 2, End: 120_000, Prev: 9}, driver.State{Used: 5, End: 120_000, Prev: 3}, driver.State{Used: 5, End: 120_000, Prev: 9}, true},
		{"sliding: older than the previous window ignored", sliding, driver.State{}, driver.State{Used: 7, End: 0}, driver.State{}, false},
		{"sliding: a later window from a clock ahead wins", sliding, driver.State{Used: 5, End: 120_000, Prev: 1}, driver.State{Used: 1, End: 180_000, Prev: 5}, driver.State{Used: 1, End: 180_000, Prev: 5}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := driver.NewPolicy("p", tc.l)
			require.NoError(t, err)
			held := []driver.State{tc.held}
			assert.Equal(t, tc.changed, driver.Merge(p, now, held, []driver.State{tc.given}))
			assert.Equal(t, driver.InForce(&p.Limits[0], tc.merged, now), driver.InForce(&p.Limits[0], held[0], now))
			// Merging the same state again changes nothing.
			assert.False(t, driver.Merge(p, now, held, []driver.State{tc.given}))
		})
	}
}

// TestMergeNeverLowersAStore: whatever two stores hold, merging one into
// the other leaves the receiver no emptier than either of them for every
// fixed window and GCRA limit, and for a sliding limit whose window the
// given state shares; exactly as full as the given one when it held
// nothing; and a fixed window the receiver holds open keeps its End:
// random states against the rule's promises.
func TestMergeNeverLowersAStore(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	p, err := driver.NewPolicy("p",
		limit(t, "f", driver.FixedWindow, 10, time.Minute, 0),
		limit(t, "a", driver.AlignedWindow, 10, time.Minute, 0),
		limit(t, "g", driver.GCRA, 10, time.Minute, 0),
		limit(t, "s", driver.SlidingWindow, 10, time.Minute, 0))
	require.NoError(t, err)
	differentEnds := 0 // fixed windows open on both sides with another End
	for range 20_000 {
		now := time.UnixMilli(1_000_000 + rng.Int64N(300_000))
		a, b := make([]driver.State, 4), make([]driver.State, 4)
		for i := 0; i < 2; i++ {
			for _, st := range [][]driver.State{a, b} {
				if rng.IntN(4) == 0 {
					continue
				}
				at := now.Add(-time.Duration(rng.Int64N(150_000)) * time.Millisecond)
				driver.Decide(p, at, 1+rng.Int64N(4), st)
			}
		}
		merged := append([]driver.State(nil), a...)
		driver.Merge(p, now, merged, b)
		for i := range p.Limits {
			l := &p.Limits[i]
			before := driver.Evaluate(l, a[i], now, 0, true)
			given := driver.Evaluate(l, b[i], now, 0, true)
			after := driver.Evaluate(l, merged[i], now, 0, true)
			if driver.InForce(l, a[i], now) == (driver.State{}) {
				assert.Equal(t, given.Remaining, after.Remaining, "%s: nothing held takes the given state", l.Name)
			}
			held, got := driver.InForce(l, a[i], now), driver.InForce(l, b[i], now)
			if l.Algorithm != driver.SlidingWindow || held.End == got.End {
				assert.LessOrEqual(t, after.Remaining, min(before.Remaining, given.Remaining), "%s: the merge keeps the fuller count", l.Name)
			}
			fixedWindow := l.Algorithm == driver.FixedWindow || l.Algorithm == driver.AlignedWindow
			if fixedWindow && held != (driver.State{}) {
				assert.Equal(t, held.End, driver.InForce(l, merged[i], now).End, "%s: an open window held keeps its End", l.Name)
				if got != (driver.State{}) && got.End != held.End {
					differentEnds++
				}
			}
		}
	}
	assert.Greater(t, differentEnds, 1000, "too few fixed windows open on both sides with different ends to check the rule")
}

func TestCheckGiven(t *testing.T) {
	p, err := driver.NewPolicy("p", limit(t, "f", driver.FixedWindow, 10, time.Minute, 0))
	require.NoError(t, err)
	assert.NoError(t, driver.CheckGiven(p, []driver.State{{Used: 1, End: 5}}))
	assert.ErrorIs(t, driver.CheckGiven(p, nil), driver.ErrInvalidState)
	assert.ErrorIs(t, driver.CheckGiven(p, []driver.State{{Used: -1}}), driver.ErrInvalidState)
}

func TestHorizon(t *testing.T) {
	p, err := driver.NewPolicy("p",
		limit(t, "f", driver.FixedWindow, 10, time.Minute, 0),
		limit(t, "s", driver.SlidingWindow, 10, time.Hour, 0),
		limit(t, "g", driver.GCRA, 10, time.Minute, 20))
	require.NoError(t, err)
	assert.Equal(t, 2*time.Hour, driver.Horizon(p))
	p, err = driver.NewPolicy("p", limit(t, "g", driver.GCRA, 10, time.Minute, 20))
	require.NoError(t, err)
	assert.Equal(t, 2*time.Minute, driver.Horizon(p), "a burst above Max lasts longer than the window")
}
