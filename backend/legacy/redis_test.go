package legacybackend_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	legacybackend "github.com/throttlekit/throttlekit/backend/legacy"
	"github.com/throttlekit/throttlekit/internal/localserver"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// legacyIncr counts one request the way a hand-written Redis limiter does:
// INCR, and EXPIRE when the INCR created the key.
func legacyIncr(tb testing.TB, c goredis.Cmdable, key string, window time.Duration) {
	tb.Helper()
	n, err := c.Incr(context.Background(), key).Result()
	require.NoError(tb, err)
	if n == 1 {
		require.NoError(tb, c.Expire(context.Background(), key, window).Err())
	}
}

// pttl returns the key's remaining TTL in milliseconds.
func pttl(tb testing.TB, c goredis.Cmdable, key string) int64 {
	tb.Helper()
	d, err := c.PTTL(context.Background(), key).Result()
	require.NoError(tb, err)
	require.Positive(tb, d)
	return d.Milliseconds()
}

func newRedis(tb testing.TB, c goredis.UniversalClient, opts ...legacybackend.Option) *legacybackend.Redis {
	tb.Helper()
	b, err := legacybackend.NewRedis(c, opts...)
	require.NoError(tb, err)
	return b
}

// requireWindow checks that out holds, at limit i only, a window of used
// units ending between now + after and now + before: the key's PTTL read
// after and before the peek. The server's clock moves between the reads,
// so only these bounds are exact.
func requireWindow(tb testing.TB, p *driver.Policy, out driver.Outcome, i int, used int64, now time.Time, before, after int64) {
	tb.Helper()
	require.Len(tb, out.States, len(p.Limits))
	end := out.States[i].End
	require.GreaterOrEqual(tb, end, now.UnixMilli()+after)
	require.LessOrEqual(tb, end, now.UnixMilli()+before)
	require.Equal(tb, only(p, i, driver.State{Used: used, End: end}), out.States)
}

func TestRedisPeekReadsIncrExpire(t *testing.T) {
	c := redisClient(t)
	prefix := freshPrefix()
	b := newRedis(t, c, legacybackend.WithKeyFunc(prefixed(prefix)), legacybackend.WithWindow(time.Hour))
	p := apiPolicy(t)
	key := prefix + "user:42"
	for range 4 {
		legacyIncr(t, c, key, time.Hour)
	}

	before := pttl(t, c, key)
	require.LessOrEqual(t, before, time.Hour.Milliseconds())
	out, err := b.Peek(ctx(t), request(p, "user:42", t0))
	require.NoError(t, err)
	after := pttl(t, c, key)
	requireWindow(t, p, out, 2, 4, t0, before, after)
	require.True(t, out.Allowed)

	// Decide with cost 0 is the same peek, with the end taken from its
	// own now.
	later := t0.Add(time.Minute)
	before = pttl(t, c, key)
	out, err = b.Decide(ctx(t), request(p, "user:42", later))
	require.NoError(t, err)
	after = pttl(t, c, key)
	requireWindow(t, p, out, 2, 4, later, before, after)

	// An identifier the old code never counted.
	out, err = b.Peek(ctx(t), request(p, "user:43", t0))
	require.NoError(t, err)
	require.Equal(t, make([]driver.State, 3), out.States)
	require.Equal(t, legacybackend.Stats{Reads: 3, Found: 2}, b.Stats())
}

func TestRedisPExpireKeepsMilliseconds(t *testing.T) {
	c := redisClient(t)
	prefix := freshPrefix()
	b := newRedis(t, c, legacybackend.WithKeyFunc(prefixed(prefix)))
	p := policy(t, "p", limit(t, "", driver.FixedWindow, 10, 90*time.Second))
	require.NoError(t, c.Set(context.Background(), prefix+"id", "3", 0).Err())
	require.NoError(t, c.PExpire(context.Background(), prefix+"id", 90*time.Second+7*time.Millisecond).Err())
	before := pttl(t, c, prefix+"id")
	out, err := b.Peek(ctx(t), request(p, "id", t0))
	require.NoError(t, err)
	requireWindow(t, p, out, 0, 3, t0, before, pttl(t, c, prefix+"id"))
}

func TestRedisValues(t *testing.T) {
	c := redisClient(t)
	bg := context.Background()
	p := apiPolicy(t)
	cases := []struct {
		name  string
		write func(key string) error
		opts  []legacybackend.Option
		want  driver.State
		bad   bool
	}{
		{name: "missing", write: func(string) error { return nil }},
		{name: "no TTL", write: func(k string) error { return c.Incr(bg, k).Err() }},
		{name: "no TTL as a window", write: func(k string) error { return c.IncrBy(bg, k, 5).Err() },
			opts: []legacybackend.Option{legacybackend.WithNoTTLWindow(time.Minute)},
			want: driver.State{Used: 5, End: t0.Add(time.Minute).UnixMilli()}},
		{name: "count zero", write: func(k string) error { return c.Set(bg, k, "0", time.Hour).Err() }},
		{name: "negative count", write: func(k string) error {
			return errors.Join(c.DecrBy(bg, k, 2).Err(), c.Expire(bg, k, time.Hour).Err())
		}},
		{name: "count beyond MaxQuota", write: func(k string) error { return c.Set(bg, k, "9223372036854775807", 0).Err() },
			opts: []legacybackend.Option{legacybackend.WithNoTTLWindow(time.Minute)},
			want: driver.State{Used: driver.MaxQuota, End: t0.Add(time.Minute).UnixMilli()}},
		{name: "count beyond int64", write: func(k string) error { return c.Set(bg, k, "99999999999999999999", 0).Err() },
			opts: []legacybackend.Option{legacybackend.WithNoTTLWindow(time.Minute)},
			want: driver.State{Used: driver.MaxQuota, End: t0.Add(time.Minute).UnixMilli()}},
		{name: "not a number", write: func(k string) error { return c.Set(bg, k, "seven", time.Hour).Err() }, bad: true},
		{name: "not a number without TTL", write: func(k string) error { return c.Set(bg, k, "seven", 0).Err() }, bad: true},
		{name: "float counter", write: func(k string) error {
			return errors.Join(c.IncrByFloat(bg, k, 1.5).Err(), c.Expire(bg, k, time.Hour).Err())
		}, bad: true},
		{name: "empty string", write: func(k string) error { return c.Set(bg, k, "", time.Hour).Err() }, bad: true},
		{name: "hash", write: func(k string) error { return c.HSet(bg, k, "count", 3).Err() }, bad: true},
		{name: "list", write: func(k string) error { return c.RPush(bg, k, "3").Err() }, bad: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			prefix := freshPrefix()
			b := newRedis(t, c, append([]legacybackend.Option{legacybackend.WithKeyFunc(prefixed(prefix))}, tc.opts...)...)
			require.NoError(t, tc.write(prefix+"id"))
			out, err := b.Peek(ctx(t), request(p, "id", t0))
			if tc.bad {
				require.ErrorIs(t, err, driver.ErrBadReply)
				require.Equal(t, uint64(1), b.Stats().Malformed)
				return
			}
			require.NoError(t, err)
			require.Equal(t, only(p, 1, tc.want), out.States, "no WithWindow: the first fixed window")
		})
	}
}

// A TTL that ends after driver.MaxUnixMilli at the request's now cannot be
// a window any store holds.
func TestRedisTTLBeyondMaxTime(t *testing.T) {
	c := redisClient(t)
	prefix := freshPrefix()
	b := newRedis(t, c, legacybackend.WithKeyFunc(prefixed(prefix)))
	p := policy(t, "p", limit(t, "", driver.FixedWindow, 10, time.Hour))
	legacyIncr(t, c, prefix+"id", time.Hour)
	now := time.UnixMilli(driver.MaxUnixMilli - time.Minute.Milliseconds())
	_, err := b.Peek(ctx(t), request(p, "id", now))
	require.ErrorIs(t, err, driver.ErrBadReply)
}

func TestRedisWindowMatcher(t *testing.T) {
	c := redisClient(t)
	prefix := freshPrefix()
	legacyIncr(t, c, prefix+"id", time.Minute)
	p := policy(t, "p",
		limit(t, "", driver.FixedWindow, 10, time.Second),
		limit(t, "", driver.FixedWindow, 1000, time.Minute),
		limit(t, "", driver.FixedWindow, 5000, time.Hour))
	for _, tc := range []struct {
		name  string
		opts  []legacybackend.Option
		index int
	}{
		{"first fixed window", nil, 0},
		{"WithWindow", []legacybackend.Option{legacybackend.WithWindow(time.Minute)}, 1},
		{"WithMatcher", []legacybackend.Option{legacybackend.WithWindow(time.Minute), legacybackend.WithMatcher(legacybackend.MatchWindow(time.Hour))}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newRedis(t, c, append([]legacybackend.Option{legacybackend.WithKeyFunc(prefixed(prefix))}, tc.opts...)...)
			before := pttl(t, c, prefix+"id")
			out, err := b.Peek(ctx(t), request(p, "id", t0))
			require.NoError(t, err)
			requireWindow(t, p, out, tc.index, 1, t0, before, pttl(t, c, prefix+"id"))
		})
	}
	b := newRedis(t, c, legacybackend.WithKeyFunc(prefixed(prefix)), legacybackend.WithWindow(2*time.Minute))
	out, err := b.Peek(ctx(t), request(p, "id", t0))
	require.NoError(t, err)
	require.Equal(t, make([]driver.State, 3), out.States)
	require.Equal(t, legacybackend.Stats{Unmatched: 1}, b.Stats(), "no limit of the window: no round trip")
}

func TestRedisRefusesToDecide(t *testing.T) {
	c := redisClient(t)
	prefix := freshPrefix()
	b := newRedis(t, c, legacybackend.WithKeyFunc(prefixed(prefix)))
	p := apiPolicy(t)
	legacyIncr(t, c, prefix+"id", time.Hour)
	for _, cost := range []int64{1, 5, -1} {
		req := request(p, "id", t0)
		req.Cost = cost
		out, err := b.Decide(ctx(t), req)
		require.ErrorIs(t, err, errors.ErrUnsupported)
		require.ErrorContains(t, err, "read-only legacy store")
		require.Equal(t, driver.Outcome{}, out)
	}
	require.Equal(t, legacybackend.Stats{}, b.Stats())
	v, err := c.Get(context.Background(), prefix+"id").Result()
	require.NoError(t, err)
	require.Equal(t, "1", v)
}

// The backend sends the server nothing but reads: the server's command
// statistics, reset before, list only what a peek and a ping use.
func TestRedisNeverWrites(t *testing.T) {
	server := localserver.RedisT(t, localserver.RedisOptions{})
	c := goredis.NewClient(&goredis.Options{Addr: server.Addr(), ReadTimeout: testTimeout, WriteTimeout: testTimeout})
	t.Cleanup(func() { _ = c.Close() })
	bg := context.Background()
	legacyIncr(t, c, "api:id", time.Hour)
	require.NoError(t, c.Set(bg, "api:bad", "x", 0).Err())
	require.NoError(t, c.ConfigResetStat(bg).Err())

	b := newRedis(t, c)
	p := apiPolicy(t)
	for _, id := range []string{"id", "bad", "missing"} {
		for _, cost := range []int64{0, 1} {
			req := request(p, id, t0)
			req.Cost = cost
			_, _ = b.Decide(ctx(t), req)
			_, _ = b.Peek(ctx(t), req)
		}
	}
	require.NoError(t, b.Ping(ctx(t)))
	info, err := c.Info(bg, "commandstats").Result()
	require.NoError(t, err)
	var used []string
	for _, line := range strings.Split(info, "\n") {
		if name, _, ok := strings.Cut(line, ":"); ok && strings.HasPrefix(name, "cmdstat_") {
			used = append(used, strings.TrimPrefix(name, "cmdstat_"))
		}
	}
	// "config" is the test's own reset, "info" this read; "hello" and
	// "client|setinfo" would be go-redis opening a connection.
	require.Subset(t, []string{"multi", "exec", "get", "pttl", "ping", "config|resetstat", "info", "hello", "client|setinfo"}, used, info)
	require.Contains(t, used, "get")
}

func TestRedisCluster(t *testing.T) {
	cluster := localserver.RedisClusterT(t, 3, 0)
	c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cluster.Addrs(), ReadTimeout: testTimeout, WriteTimeout: testTimeout})
	t.Cleanup(func() { _ = c.Close() })
	b := newRedis(t, c, legacybackend.WithWindow(time.Hour))
	require.NoError(t, b.Ping(ctx(t)))
	p := apiPolicy(t)
	// Identifiers spread over every primary's slots.
	for i := range 30 {
		id := "user:" + string(rune('a'+i%26)) + strings.Repeat("x", i)
		key := legacybackend.DefaultKey(p.Name, id)
		for range i%4 + 1 {
			legacyIncr(t, c, key, time.Hour)
		}
		before := pttl(t, c, key)
		out, err := b.Peek(ctx(t), request(p, id, t0))
		require.NoError(t, err)
		requireWindow(t, p, out, 2, int64(i%4+1), t0, before, pttl(t, c, key))
	}
}

func TestRedisPingAndContext(t *testing.T) {
	server := localserver.RedisT(t, localserver.RedisOptions{})
	c := goredis.NewClient(&goredis.Options{Addr: server.Addr(), ReadTimeout: testTimeout, WriteTimeout: testTimeout, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	b := newRedis(t, c)
	require.NoError(t, b.Ping(ctx(t)))

	done, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := b.Peek(done, request(apiPolicy(t), "id", t0))
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, b.Ping(done), context.Canceled)

	require.NoError(t, server.Stop())
	require.Error(t, b.Ping(ctx(t)))
	_, err = b.Peek(ctx(t), request(apiPolicy(t), "id", t0))
	require.Error(t, err)
	require.NotErrorIs(t, err, driver.ErrBadReply)
}

func TestNewRedisErrors(t *testing.T) {
	c := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = c.Close() })
	var nilClient *goredis.Client
	for name, build := range map[string]func() (*legacybackend.Redis, error){
		"nil client":       func() (*legacybackend.Redis, error) { return legacybackend.NewRedis(nil) },
		"typed nil client": func() (*legacybackend.Redis, error) { return legacybackend.NewRedis(nilClient) },
		"nil option":       func() (*legacybackend.Redis, error) { return legacybackend.NewRedis(c, nil) },
		"nil key function": func() (*legacybackend.Redis, error) { return legacybackend.NewRedis(c, legacybackend.WithKeyFunc(nil)) },
		"nil matcher":      func() (*legacybackend.Redis, error) { return legacybackend.NewRedis(c, legacybackend.WithMatcher(nil)) },
		"WithResetMillis": func() (*legacybackend.Redis, error) {
			return legacybackend.NewRedis(c, legacybackend.WithResetMillis())
		},
		"zero WithWindow": func() (*legacybackend.Redis, error) { return legacybackend.NewRedis(c, legacybackend.WithWindow(0)) },
		"fractional WithWindow": func() (*legacybackend.Redis, error) {
			return legacybackend.NewRedis(c, legacybackend.WithWindow(time.Millisecond+1))
		},
		"negative WithNoTTLWindow": func() (*legacybackend.Redis, error) {
			return legacybackend.NewRedis(c, legacybackend.WithNoTTLWindow(-time.Minute))
		},
	} {
		t.Run(name, func(t *testing.T) {
			b, err := build()
			require.ErrorIs(t, err, driver.ErrInvalidOption)
			require.Nil(t, b)
		})
	}
}

func TestRedisNotBuilt(t *testing.T) {
	p := apiPolicy(t)
	for name, b := range map[string]*legacybackend.Redis{"nil": nil, "zero": {}} {
		t.Run(name, func(t *testing.T) {
			_, err := b.Peek(context.Background(), request(p, "id", t0))
			require.ErrorIs(t, err, driver.ErrNotInitialized)
			_, err = b.Decide(context.Background(), request(p, "id", t0))
			require.ErrorIs(t, err, driver.ErrNotInitialized)
			require.ErrorIs(t, b.Ping(context.Background()), driver.ErrNotInitialized)
			require.Equal(t, legacybackend.Stats{}, b.Stats())
		})
	}
}
