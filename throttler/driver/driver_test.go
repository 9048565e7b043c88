package driver_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

func limit(t *testing.T, name string, alg driver.Algorithm, max int64, window time.Duration, burst int64) driver.Limit {
	t.Helper()
	l, err := driver.NewLimit(name, alg, max, window, burst)
	require.NoError(t, err)
	return l
}

func TestLimitKeysNeverCollide(t *testing.T) {
	p, err := driver.NewPolicy("p",
		limit(t, "a:b", driver.FixedWindow, 1, time.Second, 0),
		limit(t, "a", driver.AlignedWindow, 1, time.Second, 0),
		limit(t, "a:fixed", driver.FixedWindow, 1, time.Minute, 0),
		limit(t, "x", driver.GCRA, 1, time.Second, 2),
		limit(t, "y", driver.GCRA, 1, time.Second, 3),
	)
	require.NoError(t, err)
	seen := map[string]bool{}
	for _, l := range p.Limits {
		assert.False(t, seen[l.Key], l.Key)
		seen[l.Key] = true
		assert.False(t, strings.ContainsAny(l.Key, "{} \n"), l.Key)
	}
	assert.Equal(t, int64(1), p.Capacity)
}

// TestKeysAreStable pins the storage keys of layout 2 and, through KeyV1,
// of layout 1: stores in production hold state under them, so they change
// only with KeyLayout and a documented upgrade.
func TestKeysAreStable(t *testing.T) {
	require.Equal(t, 2, driver.KeyLayout)
	unnamed := limit(t, "", driver.FixedWindow, 10, time.Second, 0)
	assert.Equal(t, ":fixed:1000", unnamed.Key)
	assert.Equal(t, "10/s", unnamed.Name)
	assert.Equal(t, "hour:aligned:3600000", limit(t, "hour", driver.AlignedWindow, 5, time.Hour, 0).Key)
	assert.Equal(t, "g:gcra:60000:20", limit(t, "g", driver.GCRA, 10, time.Minute, 20).Key)
	assert.Equal(t, "g:gcra:60000", limit(t, "g", driver.GCRA, 10, time.Minute, 0).Key)
	assert.Equal(t, ":gcra:60000", limit(t, "", driver.GCRA, 10, time.Minute, 0).Key)

	v1 := func(name string, alg driver.Algorithm, max int64, w time.Duration, burst int64) string {
		l := limit(t, name, alg, max, w, burst)
		return driver.KeyV1(&l)
	}
	assert.Equal(t, "10%2Fs:fixed:1000", v1("", driver.FixedWindow, 10, time.Second, 0))
	assert.Equal(t, "hour:aligned:3600000", v1("hour", driver.AlignedWindow, 5, time.Hour, 0))
	assert.Equal(t, "g:gcra:60000:20", v1("g", driver.GCRA, 10, time.Minute, 20))
	assert.Equal(t, "g:gcra:60000:10", v1("g", driver.GCRA, 10, time.Minute, 0))
}

// TestMaxIsNotIdentity: a limit's key never holds Max, named or not, for
// every algorithm; two unnamed limits of one window and algorithm cannot
// share a policy.
func TestMaxIsNotIdentity(t *testing.T) {
	for _, alg := range []driver.Algorithm{driver.FixedWindow, driver.AlignedWindow, driver.GCRA, driver.SlidingWindow} {
		for _, name := range []string{"", "n"} {
			a, b := limit(t, name, alg, 2, time.Minute, 0), limit(t, name, alg, 3, time.Minute, 0)
			assert.Equal(t, a.Key, b.Key, "%v %q", alg, name)
		}
	}
	assert.Equal(t, ":fixed:1000", limit(t, "10/s", driver.FixedWindow, 10, time.Second, 0).Key,
		"a limit named after its own notation is unnamed, so a policy rebuilt from another's limits keeps their keys")
	_, err := driver.NewPolicy("p", limit(t, "", driver.FixedWindow, 10, time.Second, 0), limit(t, "", driver.FixedWindow, 20, time.Second, 0))
	assert.ErrorIs(t, err, driver.ErrInvalidPolicy)
	_, err = driver.NewPolicy("p", limit(t, "", driver.FixedWindow, 10, time.Second, 0), limit(t, "b", driver.FixedWindow, 20, time.Second, 0))
	assert.NoError(t, err)
}

func TestEscapeKey(t *testing.T) {
	assert.Equal(t, "user-42_a.b", driver.EscapeKey("user-42_a.b"))
	assert.Equal(t, "%7Ba%7D%20%00%0A%25%3A", driver.EscapeKey("{a} \x00\n%:"))
	assert.Equal(t, "%FF%FE", driver.EscapeKey("\xff\xfe"))
	// Injective: the escape of '%' keeps "%41" apart from "A".
	assert.NotEqual(t, driver.EscapeKey("%41"), driver.EscapeKey("A"))
	assert.Equal(t, "x%7By", string(driver.AppendEscapedKey([]byte("x"), "{y")))
}

func TestDecideInPlace(t *testing.T) {
	p, err := driver.NewPolicy("p", limit(t, "", driver.FixedWindow, 2, time.Minute, 0), limit(t, "", driver.GCRA, 10, time.Second, 0))
	require.NoError(t, err)
	now := time.UnixMilli(1_000_000)
	states := make([]driver.State, 2)
	require.True(t, driver.Decide(p, now, 2, states))
	assert.Equal(t, driver.State{Used: 2, End: 1_060_000}, states[0])
	assert.Equal(t, int64(1_000_000_000+200_000), states[1].End)
	before := append([]driver.State(nil), states...)
	assert.False(t, driver.Decide(p, now, 1, states), "the window is full")
	assert.Equal(t, before, states, "a denial changes nothing")
	assert.False(t, driver.Decide(p, now, 1, states[:1]), "a states slice of the wrong length is denied")
	driver.Refund(p, now, 1, states)
	assert.Equal(t, int64(1), states[0].Used)
	assert.Equal(t, int64(1_000_000_000+100_000), states[1].End)
	st := driver.Evaluate(&p.Limits[0], states[0], now, 0, true)
	assert.Equal(t, driver.Status{Allowed: true, Limit: 2, Remaining: 1, Used: 1, ResetAt: time.UnixMilli(1_060_000)}, st)
	assert.Equal(t, int64(1), driver.Headroom(p, now, states))
}

func TestWindowEnd(t *testing.T) {
	aligned := limit(t, "", driver.AlignedWindow, 1, time.Minute, 0)
	anchored := limit(t, "", driver.FixedWindow, 1, time.Minute, 0)
	assert.Equal(t, int64(120_000), driver.WindowEnd(&aligned, 60_000))
	assert.Equal(t, int64(120_000), driver.WindowEnd(&aligned, 119_999))
	assert.Equal(t, int64(120_001), driver.WindowEnd(&anchored, 60_001))
}

func TestNewPolicyRejectsHandBuiltLimits(t *testing.T) {
	_, err := driver.NewPolicy("p", driver.Limit{Name: "x", Max: 1, Window: time.Second})
	assert.ErrorIs(t, err, driver.ErrInvalidPolicy)
	assert.False(t, (*driver.Policy)(nil).Valid())
	assert.False(t, (&driver.Policy{}).Valid())
}
