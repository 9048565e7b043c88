package handwritten_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/internal/handwritten"
	"github.com/throttlekit/throttlekit/internal/localserver"
)

func prefix() string { return fmt.Sprintf("t%016x:", rand.Uint64()) }

// The Redis limiter counts with INCR, gives a new counter the window with
// EXPIRE, counts denied requests, and reports now plus the TTL.
func TestRedisLimiter(t *testing.T) {
	server := localserver.RedisT(t, localserver.RedisOptions{})
	c := goredis.NewClient(&goredis.Options{Addr: server.Addr(), ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second})
	t.Cleanup(func() { _ = c.Close() })
	bg := context.Background()
	p := prefix()
	l := &handwritten.RedisLimiter{Client: c, Limit: 2, Window: time.Minute, Key: func(id string) string { return p + id }}

	for i, allowed := range []bool{true, true, false, false} {
		now := time.Now()
		d, err := l.Allow(bg, now, "id")
		require.NoError(t, err)
		require.Equal(t, allowed, d.Allowed, "request %d", i)
		require.Equal(t, int64(i+1), d.Count, "request %d", i)
		// TTL is 59 or 60 seconds, rounded by Redis.
		require.InDelta(t, now.Unix()+60, d.Reset, 1, "request %d", i)
	}
	ttl, err := c.PTTL(bg, p+"id").Result()
	require.NoError(t, err)
	require.InDelta(t, time.Minute, ttl, float64(5*time.Second), "EXPIRE once, when the counter was created")

	// A counter without a TTL is reported as a window from now, and
	// left so: the old code only gives a TTL to a counter it creates.
	require.NoError(t, c.Set(bg, p+"stuck", "7", 0).Err())
	now := time.Now()
	d, err := l.Allow(bg, now, "stuck")
	require.NoError(t, err)
	require.Equal(t, handwritten.Decision{Allowed: false, Count: 8, Reset: now.Unix() + 60}, d)
	ttl, err = c.TTL(bg, p+"stuck").Result()
	require.NoError(t, err)
	require.Equal(t, time.Duration(-1), ttl)
}

// The memcached limiter rounds a window's end up to the second, or down
// with RoundDown.
func TestLimiterRounding(t *testing.T) {
	server := localserver.MemcachedT(t, localserver.MemcachedOptions{})
	c := memcache.New(server.Addr())
	c.Timeout = 5 * time.Second
	t.Cleanup(func() { _ = c.Close() })
	now := time.Unix(1_900_000_000, 300_000_000)
	for _, tc := range []struct {
		roundDown bool
		reset     int64
	}{
		{false, 1_900_000_011},
		{true, 1_900_000_010},
	} {
		p := prefix()
		l := &handwritten.Limiter{Client: c, Limit: 1, Window: 10 * time.Second, Key: func(id string) string { return p + id }, RoundDown: tc.roundDown}
		d, err := l.Allow(now, "id")
		require.NoError(t, err)
		require.Equal(t, handwritten.Decision{Allowed: true, Count: 1, Reset: tc.reset}, d)
		it, err := c.Get(p + "id" + handwritten.ResetSuffix)
		require.NoError(t, err)
		require.Equal(t, fmt.Sprint(tc.reset), string(it.Value))
		// The window is open until its end, and no longer.
		d, err = l.Allow(time.Unix(tc.reset, 0).Add(-time.Millisecond), "id")
		require.NoError(t, err)
		require.Equal(t, handwritten.Decision{Allowed: false, Count: 2, Reset: tc.reset}, d)
		d, err = l.Allow(time.Unix(tc.reset, 0), "id")
		require.NoError(t, err)
		require.Equal(t, int64(1), d.Count)
	}
}
