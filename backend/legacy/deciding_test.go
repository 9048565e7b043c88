package legacybackend_test

import (
	"bytes"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"

	legacybackend "github.com/throttlekit/throttlekit/backend/legacy"
	"github.com/throttlekit/throttlekit/internal/handwritten"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// deciding returns a Deciding Memcached over c whose counters are
// prefix+identifier, with windows of window.
func deciding(tb testing.TB, c *memcache.Client, prefix string, window time.Duration, opts ...legacybackend.Option) *legacybackend.Memcached {
	tb.Helper()
	return newMemcached(tb, c, window, append([]legacybackend.Option{legacybackend.Deciding(), legacybackend.WithKeyFunc(prefixed(prefix))}, opts...)...)
}

// oldCode returns the hand-written limiter over the same counters.
func oldCode(c *memcache.Client, prefix string, limit int64, window time.Duration) *handwritten.Limiter {
	return &handwritten.Limiter{Client: c, Limit: limit, Window: window, Key: func(id string) string { return prefix + id }}
}

// raw returns the value memcached holds under key, "" when missing.
func raw(tb testing.TB, c *memcache.Client, key string) string {
	tb.Helper()
	it, err := c.Get(key)
	if errors.Is(err, memcache.ErrCacheMiss) {
		return ""
	}
	require.NoError(tb, err)
	return string(it.Value)
}

// decide decides cost units of p for id at now on b.
func decide(tb testing.TB, b driver.Backend, p *driver.Policy, id string, now time.Time, cost int64) driver.Outcome {
	tb.Helper()
	req := request(p, id, now)
	req.Cost = cost
	out, err := b.Decide(ctx(tb), req)
	require.NoError(tb, err)
	return out
}

// The old code and a Deciding backend take turns on one counter: every
// request is counted once, denied ones included, in one window with one
// end, and a window either of them opens has the end the other would have
// written.
func TestDecidingCountsAsTheOldCode(t *testing.T) {
	c := memcachedClient(t)
	prefix := freshPrefix()
	const window = 10 * time.Second
	// The old code opens a window at the very second the one before ended,
	// which rounding up and rounding down end alike: the rounding check
	// may read it as rounded down (see "Rounding"), and is kept quiet.
	b := deciding(t, c, prefix, window, legacybackend.WithLogger(nil))
	old := oldCode(c, prefix, 3, window)
	p := policy(t, "api", limit(t, "", driver.FixedWindow, 3, window))
	start := t0.Add(300 * time.Millisecond)
	end := start.Add(window).Truncate(time.Second).Add(time.Second) // rounded up, as the old code does

	type step struct {
		at      time.Duration // after start
		byOld   bool
		allowed bool
		count   int64
		end     time.Time
	}
	next := end.Add(window) // opened at end, a whole second: no rounding
	for i, s := range []step{
		{0, false, true, 1, end},
		{time.Second, true, true, 2, end},
		{2 * time.Second, false, true, 3, end},
		{3 * time.Second, true, false, 4, end},
		{4 * time.Second, false, false, 5, end},
		{end.Sub(start), false, true, 1, next},
		{end.Sub(start) + time.Second, true, true, 2, next},
		{next.Sub(start), true, true, 1, next.Add(window)},
		{next.Sub(start) + 500*time.Millisecond, false, true, 2, next.Add(window)},
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
	require.Equal(t, uint64(5), st.Decided)
	require.Equal(t, uint64(2), st.Opened)
	require.Equal(t, uint64(0), st.Contended)
}

// With WithResetMillis a window ends in whole milliseconds, and a cost
// above one is counted whole, denied or not.
func TestDecidingResetMillisAndCost(t *testing.T) {
	c := memcachedClient(t)
	prefix := freshPrefix()
	b := deciding(t, c, prefix, time.Minute, legacybackend.WithResetMillis())
	p := policy(t, "api", limit(t, "", driver.FixedWindow, 10, time.Minute))
	now := t0.Add(1234567 * time.Nanosecond) // a fraction of a millisecond: rounded up
	end := t0.Add(time.Minute + 2*time.Millisecond).UnixMilli()

	out := decide(t, b, p, "id", now, 4)
	require.True(t, out.Allowed)
	require.Equal(t, []driver.State{{Used: 4, End: end}}, out.States)
	require.Equal(t, strconv.FormatInt(end, 10), raw(t, c, prefix+"id"+legacybackend.ResetSuffix))
	out = decide(t, b, p, "id", now, 7)
	require.False(t, out.Allowed)
	require.Equal(t, []driver.State{{Used: 11, End: end}}, out.States)
	out = decide(t, b, p, "id", now, 1)
	require.False(t, out.Allowed, "the denied units were counted, as the old code counts a denied request")

	// A peek changes nothing.
	out = decide(t, b, p, "id", now, 0)
	require.False(t, out.Allowed)
	require.Equal(t, []driver.State{{Used: 12, End: end}}, out.States)
	require.Equal(t, "12", raw(t, c, prefix+"id"))
}

// Processes that find the same window ended open one window between them:
// the add or CAS that opens it lets one writer through, the others count
// in it. Every request is counted and no more than Max are allowed.
func TestDecidingConcurrentOpen(t *testing.T) {
	c := memcachedClient(t)
	const window = 10 * time.Second
	p := policy(t, "api", limit(t, "", driver.FixedWindow, 5, window))
	for round, setup := range []func(prefix string){
		func(string) {},
		func(prefix string) { // an ended window left behind
			setRaw(t, c, prefix+"id", "9")
			setRaw(t, c, prefix+"id"+legacybackend.ResetSuffix, strconv.FormatInt(t0.Unix(), 10))
		},
	} {
		prefix := freshPrefix()
		setup(prefix)
		const procs, each = 8, 5
		backends := make([]*legacybackend.Memcached, procs)
		for i := range backends {
			backends[i] = deciding(t, memcachedClient(t), prefix, window)
		}
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			allowed int
			ends    = map[int64]int{}
		)
		for _, b := range backends {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range each {
					out := decide(t, b, p, "id", t0, 1)
					mu.Lock()
					if out.Allowed {
						allowed++
					}
					ends[out.States[0].End]++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		var opened, decided uint64
		for _, b := range backends {
			opened += b.Stats().Opened
			decided += b.Stats().Decided
		}
		require.Equal(t, 5, allowed, "round %d", round)
		require.Equal(t, uint64(1), opened, "round %d", round)
		require.Equal(t, uint64(procs*each), decided, "round %d", round)
		require.Equal(t, map[int64]int{t0.Add(window).UnixMilli(): procs * each}, ends, "round %d", round)
		require.Equal(t, strconv.Itoa(procs*each), raw(t, c, prefix+"id"), "round %d", round)
	}
}

// Seed writes what driver.Merge keeps, in the legacy format, so that the
// old code counts on in the window it was given.
func TestDecidingSeed(t *testing.T) {
	c := memcachedClient(t)
	const window = 10 * time.Second
	p := policy(t, "api", limit(t, "", driver.FixedWindow, 5, window))
	whole := t0.Add(7 * time.Second).UnixMilli() // a whole second
	odd := whole - 250                           // not one

	seed := func(t *testing.T, b *legacybackend.Memcached, cost int64, given driver.State) driver.Outcome {
		t.Helper()
		req := request(p, "id", t0)
		req.Cost = cost
		out, err := b.Seed(ctx(t), req, []driver.State{given})
		require.NoError(t, err)
		return out
	}

	t.Run("into nothing", func(t *testing.T) {
		prefix := freshPrefix()
		b := deciding(t, c, prefix, window)
		out := seed(t, b, 0, driver.State{Used: 3, End: whole})
		require.Equal(t, []driver.State{{}}, out.Prior)
		require.Equal(t, []driver.State{{Used: 3, End: whole}}, out.States)
		require.True(t, out.Allowed)
		// The old code counts on in it.
		d, err := oldCode(c, prefix, 5, window).Allow(t0.Add(time.Second), "id")
		require.NoError(t, err)
		require.Equal(t, handwritten.Decision{Allowed: true, Count: 4, Reset: whole / 1000}, d)
		require.Equal(t, uint64(1), b.Stats().Seeded)
	})

	t.Run("same window", func(t *testing.T) {
		prefix := freshPrefix()
		b := deciding(t, c, prefix, window)
		seed(t, b, 0, driver.State{Used: 3, End: whole})
		out := seed(t, b, 0, driver.State{Used: 2, End: whole})
		require.Equal(t, []driver.State{{Used: 3, End: whole}}, out.States, "a smaller count changes nothing")
		out = seed(t, b, 1, driver.State{Used: 4, End: whole})
		require.Equal(t, []driver.State{{Used: 3, End: whole}}, out.Prior)
		require.Equal(t, []driver.State{{Used: 5, End: whole}}, out.States, "raised, then the cost counted")
		require.True(t, out.Allowed)
		out = seed(t, b, 1, driver.State{})
		require.False(t, out.Allowed)
		require.Equal(t, "6", raw(t, c, prefix+"id"))
		require.Equal(t, uint64(2), b.Stats().Seeded)
	})

	t.Run("closed window ignored", func(t *testing.T) {
		prefix := freshPrefix()
		b := deciding(t, c, prefix, window)
		out := seed(t, b, 0, driver.State{Used: 3, End: t0.UnixMilli()})
		require.Equal(t, []driver.State{{}}, out.States)
		require.Equal(t, "", raw(t, c, prefix+"id"))
		require.Equal(t, uint64(0), b.Stats().Seeded)
	})

	t.Run("end off the second", func(t *testing.T) {
		prefix := freshPrefix()
		b := deciding(t, c, prefix, window)
		seed(t, b, 0, driver.State{Used: 2, End: odd})
		require.Equal(t, strconv.FormatInt(whole/1000, 10), raw(t, c, prefix+"id"+legacybackend.ResetSuffix), "rounded up for the old code")
		require.Equal(t, strconv.FormatInt(odd, 10), raw(t, c, prefix+"id"+legacybackend.EndSuffix))
		out, err := b.Peek(ctx(t), request(p, "id", t0))
		require.NoError(t, err)
		require.Equal(t, []driver.State{{Used: 2, End: odd}}, out.States, "read back exactly")
		out = decide(t, b, p, "id", t0, 1)
		require.Equal(t, []driver.State{{Used: 3, End: odd}}, out.States)

		// Once the old code opens a window of its own, the exact end no
		// longer matches the reset key and is ignored.
		later := time.UnixMilli(whole).Add(time.Second)
		d, err := oldCode(c, prefix, 5, window).Allow(later, "id")
		require.NoError(t, err)
		require.Equal(t, int64(1), d.Count)
		out, err = b.Peek(ctx(t), request(p, "id", later))
		require.NoError(t, err)
		require.Equal(t, []driver.State{{Used: 1, End: d.Reset * 1000}}, out.States)
	})

	t.Run("read-only", func(t *testing.T) {
		b := newMemcached(t, c, window)
		_, err := b.Seed(ctx(t), request(p, "id", t0), []driver.State{{Used: 1, End: whole}})
		require.ErrorIs(t, err, errors.ErrUnsupported)
	})

	t.Run("invalid states", func(t *testing.T) {
		b := deciding(t, c, freshPrefix(), window)
		_, err := b.Seed(ctx(t), request(p, "id", t0), nil)
		require.ErrorIs(t, err, driver.ErrInvalidState)
		_, err = b.Seed(ctx(t), request(p, "id", t0), []driver.State{{Used: -1}})
		require.ErrorIs(t, err, driver.ErrInvalidState)
	})
}

// A Deciding backend decides only a policy that the legacy counter holds
// whole: one limit, of the legacy window.
func TestDecidingRefusesOtherPolicies(t *testing.T) {
	c := memcachedClient(t)
	prefix := freshPrefix()
	b := deciding(t, c, prefix, time.Minute)
	for _, p := range []*driver.Policy{
		policy(t, "two", limit(t, "", driver.FixedWindow, 5, time.Minute), limit(t, "", driver.FixedWindow, 50, time.Hour)),
		policy(t, "hourly", limit(t, "", driver.FixedWindow, 50, time.Hour)),
	} {
		req := request(p, "id", t0)
		req.Cost = 1
		_, err := b.Decide(ctx(t), req)
		require.ErrorIs(t, err, errors.ErrUnsupported, p.Name)
		require.ErrorContains(t, err, p.Name)
		_, err = b.Seed(ctx(t), req, make([]driver.State, len(p.Limits)))
		require.ErrorIs(t, err, errors.ErrUnsupported, p.Name)
	}
	require.Equal(t, "", raw(t, c, prefix+"id"), "nothing written")
	require.Equal(t, uint64(2), b.Stats().Unmatched, "the hourly policy, twice")

	_, err := legacybackend.NewRedis(redisClient(t), legacybackend.Deciding())
	require.ErrorIs(t, err, driver.ErrInvalidOption)
}

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A legacy window given wrong (an hour, in front of a per-minute limiter)
// matches no limit: the backend says so once per policy in the log, and
// counts every such call in Stats.Unmatched.
func TestUnmatchedPolicyWarnsOnce(t *testing.T) {
	c := memcachedClient(t)
	prefix := freshPrefix()
	legacyHit(t, c, prefix+"id", t0, time.Minute)
	perMinute := policy(t, "api", limit(t, "", driver.FixedWindow, 60, time.Minute))
	search := policy(t, "search", limit(t, "", driver.FixedWindow, 10, time.Minute), limit(t, "", driver.GCRA, 5, time.Second))

	var logged syncBuffer
	b := newMemcached(t, c, time.Hour, legacybackend.WithKeyFunc(prefixed(prefix)),
		legacybackend.WithLogger(slog.New(slog.NewTextHandler(&logged, nil))))
	b.SetLogger(nil) // WithLogger wins
	for range 3 {
		out, err := b.Peek(ctx(t), request(perMinute, "id", t0))
		require.NoError(t, err)
		require.Equal(t, []driver.State{{}}, out.States)
	}
	_, err := b.Peek(ctx(t), request(search, "id", t0))
	require.NoError(t, err)
	require.Equal(t, legacybackend.Stats{Unmatched: 4}, b.Stats(), "no round trip, every call counted")
	lines := strings.Split(strings.TrimSpace(logged.String()), "\n")
	require.Len(t, lines, 2, logged.String())
	require.Contains(t, lines[0], "level=WARN")
	require.Contains(t, lines[0], "policy=api")
	require.Contains(t, lines[0], "legacy_window=1h0m0s")
	require.Contains(t, lines[0], "fixed_windows=[1m0s]")
	require.Contains(t, lines[1], "policy=search")

	// Without WithLogger, SetLogger (throttler.WithLogger) chooses.
	var viaSetter syncBuffer
	r := newRedis(t, redisClient(t), legacybackend.WithWindow(time.Hour))
	r.SetLogger(slog.New(slog.NewTextHandler(&viaSetter, nil)))
	_, err = r.Peek(ctx(t), request(perMinute, "id", t0))
	require.NoError(t, err)
	require.Contains(t, viaSetter.String(), "policy=api")
	require.Equal(t, uint64(1), r.Stats().Unmatched)

	// The right window matches: nothing logged, nothing counted.
	var quiet syncBuffer
	ok := newMemcached(t, c, time.Minute, legacybackend.WithKeyFunc(prefixed(prefix)),
		legacybackend.WithLogger(slog.New(slog.NewTextHandler(&quiet, nil))))
	out, err := ok.Peek(ctx(t), request(perMinute, "id", t0))
	require.NoError(t, err)
	require.Equal(t, int64(1), out.States[0].Used)
	require.Empty(t, quiet.String())
	require.Equal(t, legacybackend.Stats{Reads: 1, Found: 1}, ok.Stats())
}
