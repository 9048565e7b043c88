package legacybackend_test

import (
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	legacybackend "github.com/throttlekit/throttlekit/backend/legacy"
	"github.com/throttlekit/throttlekit/internal/handwritten"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// With WithResetRounding(RoundDown) a Deciding Memcached opens windows
// that end where old code writing now.Unix() + window ends them, and the
// two take turns on one counter as in TestDecidingCountsAsTheOldCode.
func TestDecidingRoundsDown(t *testing.T) {
	c := memcachedClient(t)
	prefix := freshPrefix()
	const window = 10 * time.Second
	b := deciding(t, c, prefix, window, legacybackend.WithResetRounding(legacybackend.RoundDown))
	old := oldCode(c, prefix, 3, window)
	old.RoundDown = true
	p := policy(t, "api", limit(t, "", driver.FixedWindow, 3, window))
	start := t0.Add(300 * time.Millisecond)
	end := t0.Add(window) // start + window, rounded down (t0 is a whole second)
	next := end.Add(window)
	last := next.Add(window)

	type step struct {
		at      time.Duration // after start
		byOld   bool
		allowed bool
		count   int64
		end     time.Time
	}
	for i, s := range []step{
		{0, false, true, 1, end},
		{time.Second, true, true, 2, end},
		{2 * time.Second, false, true, 3, end},
		{3 * time.Second, true, false, 4, end},
		{end.Sub(start) + 400*time.Millisecond, false, true, 1, next},
		{end.Sub(start) + 900*time.Millisecond, true, true, 2, next},
		{next.Sub(start) + 700*time.Millisecond, true, true, 1, last},
		{next.Sub(start) + 800*time.Millisecond, false, true, 2, last},
	} {
		now := start.Add(s.at)
		if s.byOld {
			d, err := old.Allow(now, "id")
			require.NoError(t, err)
			require.Equal(t, handwritten.Decision{Allowed: s.allowed, Count: s.count, Reset: s.end.Unix()}, d, "step %d", i)
		} else {
			out := decide(t, b, p, "id", now, 1)
			require.Equal(t, s.allowed, out.Allowed, "step %d", i)
			require.Equal(t, []driver.State{{Used: s.count, End: s.end.UnixMilli()}}, out.States, "step %d", i)
		}
		require.Equal(t, strconv.FormatInt(s.count, 10), raw(t, c, prefix+"id"), "step %d", i)
		require.Equal(t, strconv.FormatInt(s.end.Unix(), 10), raw(t, c, prefix+"id"+legacybackend.ResetSuffix), "step %d", i)
	}
	st := b.Stats()
	require.Equal(t, uint64(4), st.Decided)
	require.Equal(t, uint64(2), st.Opened)
	require.Zero(t, st.RoundingMismatched)
}

// The rounding check: windows the old code opens, read by a Deciding
// Memcached in the second after the window it saw before ended, tell how
// the old code rounds. A rounding other than the one configured is counted
// in every such window and logged once; the right one is counted as
// checked, and nothing is logged.
func TestRoundingMismatchWarnsOnce(t *testing.T) {
	c := memcachedClient(t)
	const window = 10 * time.Second
	p := policy(t, "api", limit(t, "", driver.FixedWindow, 100, window))
	for _, tc := range []struct {
		name       string
		configured legacybackend.ResetRounding
		oldDown    bool
		mismatch   string // the rounding the log reports, "" for none
	}{
		{"old code rounds down, RoundUp configured", legacybackend.RoundUp, true, "RoundDown"},
		{"old code rounds up, RoundDown configured", legacybackend.RoundDown, false, "RoundUp"},
		{"old code rounds down, RoundDown configured", legacybackend.RoundDown, true, ""},
		{"old code rounds up, RoundUp configured", legacybackend.RoundUp, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := freshPrefix()
			var logged syncBuffer
			b := deciding(t, c, prefix, window, legacybackend.WithResetRounding(tc.configured),
				legacybackend.WithLogger(slog.New(slog.NewTextHandler(&logged, nil))))
			old := oldCode(c, prefix, 100, window)
			old.RoundDown = tc.oldDown

			// The old code opens a window; the new code counts in it.
			d, err := old.Allow(t0.Add(300*time.Millisecond), "id")
			require.NoError(t, err)
			decide(t, b, p, "id", t0.Add(301*time.Millisecond), 1)
			// Three times: the old code opens the next window a millisecond
			// after the last one ended, and the new code counts in it at
			// once. A read that took the better part of a second (a very
			// loaded machine) tells nothing and is left out, so the test
			// asks for one window checked at least.
			const windows = 3
			for range windows {
				opened := time.Unix(d.Reset, 0).Add(time.Millisecond)
				d, err = old.Allow(opened, "id")
				require.NoError(t, err)
				require.Equal(t, int64(1), d.Count, "the old code opened a window")
				decide(t, b, p, "id", opened, 1)
			}
			st := b.Stats()
			require.GreaterOrEqual(t, st.RoundingChecked, uint64(1))
			require.LessOrEqual(t, st.RoundingChecked, uint64(windows))
			lines := strings.Split(strings.TrimSpace(logged.String()), "\n")
			if tc.mismatch == "" {
				require.Zero(t, st.RoundingMismatched)
				require.Empty(t, logged.String())
				return
			}
			require.Equal(t, st.RoundingChecked, st.RoundingMismatched)
			require.Len(t, lines, 1, "logged once: %s", logged.String())
			require.Contains(t, lines[0], "level=WARN")
			require.Contains(t, lines[0], "configured="+tc.configured.String())
			require.Contains(t, lines[0], "seen="+tc.mismatch)
		})
	}
}

// A memcached rounding check configured in milliseconds finds old code
// writing seconds.
func TestRoundingMillisFindsSeconds(t *testing.T) {
	c := memcachedClient(t)
	const window = 10 * time.Second
	p := policy(t, "api", limit(t, "", driver.FixedWindow, 100, window))
	prefix := freshPrefix()
	var logged syncBuffer
	b := deciding(t, c, prefix, window, legacybackend.WithResetRounding(legacybackend.Millis),
		legacybackend.WithLogger(slog.New(slog.NewTextHandler(&logged, nil))))
	_, err := oldCode(c, prefix, 100, window).Allow(t0.Add(300*time.Millisecond), "id")
	require.NoError(t, err)
	decide(t, b, p, "id", t0.Add(400*time.Millisecond), 1)
	require.Equal(t, uint64(1), b.Stats().RoundingMismatched)
	require.Contains(t, logged.String(), "seen=\"Unix seconds\"")

	// A window in milliseconds, as configured: checked, not mismatched.
	other := freshPrefix()
	right := deciding(t, c, other, window, legacybackend.WithResetMillis())
	setRaw(t, c, other+"id", "1")
	setRaw(t, c, other+"id"+legacybackend.ResetSuffix, strconv.FormatInt(t0.Add(window).UnixMilli(), 10))
	decide(t, right, p, "id", t0.Add(time.Millisecond), 1)
	require.Equal(t, legacybackend.Stats{Reads: 1, Decided: 1, RoundingChecked: 1}, right.Stats())
}

func TestResetRoundingOption(t *testing.T) {
	require.Equal(t, "RoundUp", legacybackend.RoundUp.String())
	require.Equal(t, "RoundDown", legacybackend.RoundDown.String())
	require.Equal(t, "Millis", legacybackend.Millis.String())
	require.Equal(t, "ResetRounding(9)", legacybackend.ResetRounding(9).String())

	mc := memcachedClient(t)
	for name, opts := range map[string][]legacybackend.Option{
		"zero":         {legacybackend.WithResetRounding(0)},
		"unknown":      {legacybackend.WithResetRounding(9)},
		"disagreement": {legacybackend.WithResetMillis(), legacybackend.WithResetRounding(legacybackend.RoundDown)},
	} {
		_, err := legacybackend.NewMemcached(mc, time.Minute, opts...)
		require.ErrorIs(t, err, driver.ErrInvalidOption, name)
	}
	_, err := legacybackend.NewEnvoyRedis(redisClient(t), legacybackend.WithResetRounding(legacybackend.RoundUp))
	require.ErrorIs(t, err, driver.ErrInvalidOption)
	_, err = legacybackend.NewMemcached(mc, 500*time.Millisecond, legacybackend.WithResetRounding(legacybackend.RoundDown))
	require.ErrorIs(t, err, driver.ErrInvalidOption, "a window rounded down could end before it opens")

	// Millis reads and writes milliseconds, as WithResetMillis does.
	prefix := freshPrefix()
	b := deciding(t, mc, prefix, time.Minute, legacybackend.WithResetMillis(), legacybackend.WithResetRounding(legacybackend.Millis))
	p := policy(t, "api", limit(t, "", driver.FixedWindow, 10, time.Minute))
	out := decide(t, b, p, "id", t0.Add(1500*time.Microsecond), 1)
	end := t0.Add(time.Minute + 2*time.Millisecond).UnixMilli()
	require.Equal(t, []driver.State{{Used: 1, End: end}}, out.States)
	require.Equal(t, strconv.FormatInt(end, 10), raw(t, mc, prefix+"id"+legacybackend.ResetSuffix))
}
