package legacybackend_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	legacybackend "github.com/throttlekit/throttlekit/backend/legacy"
	"github.com/throttlekit/throttlekit/internal/handwritten"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// A Deciding Redis reads the server's absolute expiry, so these tests
// decide at the wall clock's now, unlike the read-only ones (t0).

// decidingRedis returns a Deciding Redis over c whose counters are
// prefix+identifier, with windows of window.
func decidingRedis(tb testing.TB, c goredis.UniversalClient, prefix string, window time.Duration, opts ...legacybackend.Option) *legacybackend.Redis {
	tb.Helper()
	return newRedis(tb, c, append([]legacybackend.Option{legacybackend.Deciding(), legacybackend.WithWindow(window), legacybackend.WithKeyFunc(prefixed(prefix))}, opts...)...)
}

// oldRedisCode returns the hand-written Redis limiter over the same
// counters.
func oldRedisCode(c goredis.Cmdable, prefix string, limit int64, window time.Duration) *handwritten.RedisLimiter {
	return &handwritten.RedisLimiter{Client: c, Limit: limit, Window: window, Key: func(id string) string { return prefix + id }}
}

// expireTime returns the key's PEXPIRETIME.
func expireTime(tb testing.TB, c goredis.UniversalClient, key string) int64 {
	tb.Helper()
	ms, err := c.Do(context.Background(), "pexpiretime", key).Int64()
	require.NoError(tb, err)
	return ms
}

// rawRedis returns the value Redis holds under key, "" when missing.
func rawRedis(tb testing.TB, c goredis.Cmdable, key string) string {
	tb.Helper()
	v, err := c.Get(context.Background(), key).Result()
	if errors.Is(err, goredis.Nil) {
		return ""
	}
	require.NoError(tb, err)
	return v
}

// The old code and a Deciding Redis take turns on one counter: every
// request is counted once, denied ones included, in one window, and every
// answer of the new code carries the key's absolute expiry, however late
// it is read, where the old code's reset moves with its TTL's rounding.
func TestRedisDecidingCountsAsTheOldCode(t *testing.T) {
	c := redisClient(t)
	prefix := freshPrefix()
	const window = time.Minute
	b := decidingRedis(t, c, prefix, window)
	old := oldRedisCode(c, prefix, 3, window)
	p := policy(t, "api", limit(t, "", driver.FixedWindow, 3, window))
	key := prefix + "id"

	before := time.Now()
	out := decide(t, b, p, "id", time.Now(), 1)
	end := expireTime(t, c, key)
	require.True(t, out.Allowed)
	require.Equal(t, []driver.State{{Used: 1, End: end}}, out.States)
	require.Equal(t, []driver.State{{}}, out.Prior)
	require.GreaterOrEqual(t, end, before.Add(window).UnixMilli(), "PEXPIRE of the window when the counter opened")
	require.LessOrEqual(t, end, time.Now().Add(window).UnixMilli())

	for i, step := range []struct {
		byOld   bool
		allowed bool
		count   int64
	}{
		{true, true, 2},
		{false, true, 3},
		{true, false, 4},
		{false, false, 5},
		{false, false, 6},
	} {
		now := time.Now()
		if step.byOld {
			d, err := old.Allow(context.Background(), now, "id")
			require.NoError(t, err)
			require.Equal(t, step.allowed, d.Allowed, "step %d", i)
			require.Equal(t, step.count, d.Count, "step %d", i)
			require.InDelta(t, end, d.Reset*1000, 2000, "step %d: the old code's reset is now plus a TTL in seconds", i)
		} else {
			out := decide(t, b, p, "id", now, 1)
			require.Equal(t, step.allowed, out.Allowed, "step %d", i)
			require.Equal(t, []driver.State{{Used: step.count, End: end}}, out.States, "step %d: the same end, exactly", i)
		}
	}
	require.Equal(t, "6", rawRedis(t, c, key))
	require.Equal(t, end, expireTime(t, c, key), "the expiry is set once, when the window opens")

	// A peek reads the same end, and changes nothing.
	out, err := b.Peek(ctx(t), request(p, "id", time.Now()))
	require.NoError(t, err)
	require.Equal(t, []driver.State{{Used: 6, End: end}}, out.States)
	require.False(t, out.Allowed)

	// A cost above one is counted whole.
	out = decide(t, b, p, "id", time.Now(), 4)
	require.Equal(t, []driver.State{{Used: 10, End: end}}, out.States)

	st := b.Stats()
	require.Equal(t, uint64(5), st.Decided)
	require.Equal(t, uint64(1), st.Opened)
	require.Equal(t, uint64(0), st.Seeded)
}

// A window the old code opened is read at its absolute end, the same for
// every decision and peek; when it has ended, the next request opens the
// next one, whoever makes it.
func TestRedisDecidingWindowsRollOver(t *testing.T) {
	c := redisClient(t)
	prefix := freshPrefix()
	const window = time.Minute
	b := decidingRedis(t, c, prefix, window)
	old := oldRedisCode(c, prefix, 5, window)
	p := policy(t, "api", limit(t, "", driver.FixedWindow, 5, window))
	key := prefix + "id"

	_, err := old.Allow(context.Background(), time.Now(), "id")
	require.NoError(t, err)
	end := expireTime(t, c, key)
	for i := range 3 {
		out := decide(t, b, p, "id", time.Now(), 1)
		require.Equal(t, []driver.State{{Used: int64(i + 2), End: end}}, out.States)
	}

	// The window ends (the key expires): the new code opens the next one,
	// with the window's TTL, and the old code counts in it.
	require.NoError(t, c.PExpire(context.Background(), key, time.Millisecond).Err())
	gone := time.Now().Add(5 * time.Second)
	for rawRedis(t, c, key) != "" {
		require.True(t, time.Now().Before(gone), "the key did not expire")
		time.Sleep(time.Millisecond)
	}
	before := time.Now()
	out := decide(t, b, p, "id", time.Now(), 1)
	next := expireTime(t, c, key)
	require.GreaterOrEqual(t, next, before.Add(window).UnixMilli())
	require.Equal(t, []driver.State{{Used: 1, End: next}}, out.States)
	d, err := old.Allow(context.Background(), time.Now(), "id")
	require.NoError(t, err)
	require.Equal(t, int64(2), d.Count)
	require.Equal(t, next, expireTime(t, c, key), "the old code sets no expiry on a counter it did not create")

	// A process whose clock runs ahead of the server's finds the window
	// ended before the server does: it opens the next one, from the
	// server's clock, rather than count in a window it would report
	// closed.
	require.NoError(t, c.PExpire(context.Background(), key, 2*time.Second).Err())
	ahead := time.UnixMilli(expireTime(t, c, key)).Add(time.Second)
	out = decide(t, b, p, "id", ahead, 1)
	require.Equal(t, []driver.State{{}}, out.Prior)
	reopened := expireTime(t, c, key)
	require.Less(t, reopened, ahead.Add(window).UnixMilli())
	require.Equal(t, []driver.State{{Used: 1, End: reopened}}, out.States)
	require.Equal(t, uint64(2), b.Stats().Opened)
}

// A counter without a TTL (the old code's EXPIRE lost, or not yet sent)
// is given one when the new code counts in it: the window's, or
// WithNoTTLWindow's.
func TestRedisDecidingCounterWithoutTTL(t *testing.T) {
	c := redisClient(t)
	bg := context.Background()
	p := policy(t, "api", limit(t, "", driver.FixedWindow, 10, time.Minute))
	for _, tc := range []struct {
		name string
		opts []legacybackend.Option
		ttl  time.Duration
	}{
		{"window", nil, time.Minute},
		{"WithNoTTLWindow", []legacybackend.Option{legacybackend.WithNoTTLWindow(10 * time.Second)}, 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := freshPrefix()
			b := decidingRedis(t, c, prefix, time.Minute, tc.opts...)
			require.NoError(t, c.Set(bg, prefix+"id", "4", 0).Err())
			now := time.Now()
			out, err := b.Peek(ctx(t), request(p, "id", now))
			require.NoError(t, err)
			require.Equal(t, []driver.State{{Used: 4, End: now.Add(tc.ttl).UnixMilli()}}, out.States, "read as the TTL a decision gives it")
			out = decide(t, b, p, "id", time.Now(), 1)
			end := expireTime(t, c, prefix+"id")
			require.Equal(t, []driver.State{{Used: 5, End: end}}, out.States)
			require.InDelta(t, time.Now().Add(tc.ttl).UnixMilli(), end, float64(time.Second.Milliseconds()))
		})
	}
}

// Seed merges by driver.Merge's rule in the legacy counter: the same
// window's count raised, another window opened with the given end exactly
// (PXAT), a closed one ignored; then the cost is counted.
func TestRedisDecidingSeed(t *testing.T) {
	c := redisClient(t)
	const window = time.Minute
	p := policy(t, "api", limit(t, "", driver.FixedWindow, 5, window))
	seed := func(t *testing.T, b *legacybackend.Redis, now time.Time, cost int64, given driver.State) driver.Outcome {
		t.Helper()
		req := request(p, "id", now)
		req.Cost = cost
		out, err := b.Seed(ctx(t), req, []driver.State{given})
		require.NoError(t, err)
		return out
	}

	t.Run("into nothing", func(t *testing.T) {
		prefix := freshPrefix()
		b := decidingRedis(t, c, prefix, window)
		now := time.Now()
		end := now.Add(30*time.Second).UnixMilli() + 7 // not a whole second
		out := seed(t, b, now, 0, driver.State{Used: 3, End: end})
		require.Equal(t, []driver.State{{}}, out.Prior)
		require.Equal(t, []driver.State{{Used: 3, End: end}}, out.States)
		require.True(t, out.Allowed)
		require.Equal(t, end, expireTime(t, c, prefix+"id"), "the given end, to the millisecond")
		// The old code counts on in it, and leaves its expiry alone.
		d, err := oldRedisCode(c, prefix, 5, window).Allow(context.Background(), time.Now(), "id")
		require.NoError(t, err)
		require.Equal(t, int64(4), d.Count)
		require.Equal(t, end, expireTime(t, c, prefix+"id"))
		require.Equal(t, uint64(1), b.Stats().Seeded)
	})

	t.Run("same window", func(t *testing.T) {
		prefix := freshPrefix()
		b := decidingRedis(t, c, prefix, window)
		now := time.Now()
		end := now.Add(30 * time.Second).UnixMilli()
		seed(t, b, now, 0, driver.State{Used: 3, End: end})
		out := seed(t, b, now, 0, driver.State{Used: 2, End: end})
		require.Equal(t, []driver.State{{Used: 3, End: end}}, out.States, "a smaller count changes nothing")
		out = seed(t, b, now, 1, driver.State{Used: 4, End: end})
		require.Equal(t, []driver.State{{Used: 3, End: end}}, out.Prior)
		require.Equal(t, []driver.State{{Used: 5, End: end}}, out.States, "raised, then the cost counted")
		require.True(t, out.Allowed)
		out = seed(t, b, now, 1, driver.State{})
		require.False(t, out.Allowed)
		require.Equal(t, "6", rawRedis(t, c, prefix+"id"), "a denied cost is counted, as the old code counts it")
		require.Equal(t, end, expireTime(t, c, prefix+"id"))
		require.Equal(t, uint64(2), b.Stats().Seeded)
	})

	t.Run("held window kept", func(t *testing.T) {
		prefix := freshPrefix()
		b := decidingRedis(t, c, prefix, window)
		out := decide(t, b, p, "id", time.Now(), 1)
		held := out.States[0].End
		out = seed(t, b, time.Now(), 0, driver.State{Used: 4, End: held - 5000})
		require.Equal(t, []driver.State{{Used: 4, End: held}}, out.States, "the larger count, in the window held")
		require.Equal(t, held, expireTime(t, c, prefix+"id"))
	})

	t.Run("closed or empty window ignored", func(t *testing.T) {
		prefix := freshPrefix()
		b := decidingRedis(t, c, prefix, window)
		now := time.Now()
		out := seed(t, b, now, 0, driver.State{Used: 3, End: now.UnixMilli()})
		require.Equal(t, []driver.State{{}}, out.States)
		out = seed(t, b, now, 0, driver.State{Used: 0, End: now.Add(time.Second).UnixMilli()})
		require.Equal(t, "", rawRedis(t, c, prefix+"id"), "an empty window is written only with a cost to count in it")
		require.Equal(t, uint64(0), b.Stats().Seeded)
		end := now.Add(10 * time.Second).UnixMilli()
		out = seed(t, b, now, 2, driver.State{Used: 0, End: end})
		require.Equal(t, []driver.State{{Used: 2, End: end}}, out.States)
		require.Equal(t, end, expireTime(t, c, prefix+"id"))
	})

	t.Run("read-only", func(t *testing.T) {
		b := newRedis(t, c, legacybackend.WithWindow(window))
		_, err := b.Seed(ctx(t), request(p, "id", time.Now()), []driver.State{{Used: 1, End: time.Now().Add(time.Second).UnixMilli()}})
		require.ErrorIs(t, err, errors.ErrUnsupported)
	})

	t.Run("invalid states", func(t *testing.T) {
		b := decidingRedis(t, c, freshPrefix(), window)
		_, err := b.Seed(ctx(t), request(p, "id", time.Now()), nil)
		require.ErrorIs(t, err, driver.ErrInvalidState)
		_, err = b.Seed(ctx(t), request(p, "id", time.Now()), []driver.State{{Used: -1}})
		require.ErrorIs(t, err, driver.ErrInvalidState)
	})
}

// Old and new code racing on one counter from many goroutines: every
// request is counted once, at most Max are allowed, and every new answer
// carries the one end the counter has.
func TestRedisDecidingConcurrent(t *testing.T) {
	c := redisClient(t)
	prefix := freshPrefix()
	const window = time.Minute
	p := policy(t, "api", limit(t, "", driver.FixedWindow, 10, window))
	const procs, each = 8, 6
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		allowed int
		ends    = map[int64]int{}
	)
	for i := range procs {
		b := decidingRedis(t, redisClient(t), prefix, window)
		old := oldRedisCode(redisClient(t), prefix, 10, window)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				if i%2 == 0 {
					d, err := old.Allow(context.Background(), time.Now(), "id")
					require.NoError(t, err)
					mu.Lock()
					if d.Allowed {
						allowed++
					}
					mu.Unlock()
					continue
				}
				out := decide(t, b, p, "id", time.Now(), 1)
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
	require.Equal(t, 10, allowed)
	require.Equal(t, "48", rawRedis(t, c, prefix+"id"))
	end := expireTime(t, c, prefix+"id")
	for e := range ends {
		// A new process that ran before the old code's EXPIRE landed gave
		// the counter its TTL, and the old code's EXPIRE then set it again,
		// a moment later: the old code's own race between INCR and EXPIRE.
		require.InDelta(t, end, e, 1000)
	}
}

// A Deciding Redis decides only a policy the legacy counter holds whole,
// needs the window it opens with, and reports values it cannot count in.
func TestRedisDecidingRefusals(t *testing.T) {
	c := redisClient(t)
	prefix := freshPrefix()
	b := decidingRedis(t, c, prefix, time.Minute)
	for _, p := range []*driver.Policy{
		policy(t, "two", limit(t, "", driver.FixedWindow, 5, time.Minute), limit(t, "", driver.FixedWindow, 50, time.Hour)),
		policy(t, "hourly", limit(t, "", driver.FixedWindow, 50, time.Hour)),
	} {
		req := request(p, "id", time.Now())
		req.Cost = 1
		_, err := b.Decide(ctx(t), req)
		require.ErrorIs(t, err, errors.ErrUnsupported, p.Name)
		_, err = b.Seed(ctx(t), req, make([]driver.State, len(p.Limits)))
		require.ErrorIs(t, err, errors.ErrUnsupported, p.Name)
	}
	require.Equal(t, "", rawRedis(t, c, prefix+"id"), "nothing written")

	p := policy(t, "api", limit(t, "", driver.FixedWindow, 5, time.Minute))
	bg := context.Background()
	require.NoError(t, c.Set(bg, prefix+"text", "x", 0).Err())
	require.NoError(t, c.HSet(bg, prefix+"hash", "f", "1").Err())
	for _, id := range []string{"text", "hash"} {
		req := request(p, id, time.Now())
		req.Cost = 1
		_, err := b.Decide(ctx(t), req)
		require.ErrorIs(t, err, driver.ErrBadReply, id)
		_, err = b.Peek(ctx(t), request(p, id, time.Now()))
		require.ErrorIs(t, err, driver.ErrBadReply, id)
	}
	require.Equal(t, "x", rawRedis(t, c, prefix+"text"), "nothing written")
	req := request(p, "id", time.Now())
	req.Cost = -1
	_, err := b.Decide(ctx(t), req)
	require.ErrorIs(t, err, driver.ErrInvalidOption)

	for name, opts := range map[string][]legacybackend.Option{
		"Deciding without WithWindow": {legacybackend.Deciding()},
		"WithResetRounding":           {legacybackend.Deciding(), legacybackend.WithWindow(time.Minute), legacybackend.WithResetRounding(legacybackend.RoundDown)},
	} {
		_, err := legacybackend.NewRedis(c, opts...)
		require.ErrorIs(t, err, driver.ErrInvalidOption, name)
	}
}
