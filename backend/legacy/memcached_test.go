package legacybackend_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"

	legacybackend "github.com/throttlekit/throttlekit/backend/legacy"
	"github.com/throttlekit/throttlekit/internal/localserver"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// legacyHit counts one request the way GitHub's old limiter did: INCR the
// counter; when it does not exist yet, create it at 1 and store the end of
// its window, window after now, in Unix seconds.
func legacyHit(tb testing.TB, c *memcache.Client, key string, now time.Time, window time.Duration) {
	tb.Helper()
	_, err := c.Increment(key, 1)
	if errors.Is(err, memcache.ErrCacheMiss) {
		require.NoError(tb, c.Add(&memcache.Item{Key: key, Value: []byte("1")}))
		resetAt := now.Add(window).Unix()
		require.NoError(tb, c.Set(&memcache.Item{Key: key + legacybackend.ResetSuffix, Value: []byte(strconv.FormatInt(resetAt, 10))}))
		return
	}
	require.NoError(tb, err)
}

// setRaw stores value under key, as a legacy program (or a broken one)
// might.
func setRaw(tb testing.TB, c *memcache.Client, key, value string) {
	tb.Helper()
	require.NoError(tb, c.Set(&memcache.Item{Key: key, Value: []byte(value)}))
}

func newMemcached(tb testing.TB, c *memcache.Client, window time.Duration, opts ...legacybackend.Option) *legacybackend.Memcached {
	tb.Helper()
	b, err := legacybackend.NewMemcached(c, window, opts...)
	require.NoError(tb, err)
	return b
}

func TestMemcachedPeekReadsLegacyWindow(t *testing.T) {
	c := memcachedClient(t)
	prefix := freshPrefix()
	b := newMemcached(t, c, time.Hour, legacybackend.WithKeyFunc(prefixed(prefix)))
	p := apiPolicy(t)

	// The old code opened the window 10 minutes before t0 and counted 3.
	opened := t0.Add(-10 * time.Minute)
	for range 3 {
		legacyHit(t, c, prefix+"user:42", opened, time.Hour)
	}
	want := only(p, 2, driver.State{Used: 3, End: opened.Add(time.Hour).Unix() * 1000})

	out, err := b.Peek(ctx(t), request(p, "user:42", t0))
	require.NoError(t, err)
	require.Equal(t, want, out.States)
	require.True(t, out.Allowed)

	// Decide with cost 0 is the same peek.
	out, err = b.Decide(ctx(t), request(p, "user:42", t0))
	require.NoError(t, err)
	require.Equal(t, want, out.States)

	// The same window read later: same end, the count the old code added.
	legacyHit(t, c, prefix+"user:42", t0, time.Hour)
	out, err = b.Peek(ctx(t), request(p, "user:42", t0.Add(49*time.Minute)))
	require.NoError(t, err)
	require.Equal(t, only(p, 2, driver.State{Used: 4, End: want[2].End}), out.States)

	// At its end the window has closed, whatever memcached still holds.
	out, err = b.Peek(ctx(t), request(p, "user:42", opened.Add(time.Hour)))
	require.NoError(t, err)
	require.Equal(t, make([]driver.State, 3), out.States)

	// An identifier the old code never counted.
	out, err = b.Peek(ctx(t), request(p, "user:43", t0))
	require.NoError(t, err)
	require.Equal(t, make([]driver.State, 3), out.States)

	require.Equal(t, legacybackend.Stats{Reads: 5, Found: 3}, b.Stats())
}

func TestMemcachedValues(t *testing.T) {
	c := memcachedClient(t)
	nowSec := t0.Unix()
	sec := func(s int64) string { return strconv.FormatInt(s, 10) }
	missing := "\x00missing" // not stored
	cases := []struct {
		name           string
		millis         bool
		counter, reset string
		want           driver.State
		bad            bool
	}{
		{name: "open window", counter: "7", reset: sec(nowSec + 60), want: driver.State{Used: 7, End: (nowSec + 60) * 1000}},
		{name: "ends one second after now", counter: "1", reset: sec(nowSec + 1), want: driver.State{Used: 1, End: (nowSec + 1) * 1000}},
		{name: "ends at now", counter: "7", reset: sec(nowSec)},
		{name: "ended", counter: "7", reset: sec(nowSec - 3600)},
		{name: "before the epoch", counter: "7", reset: "-5"},
		{name: "count zero", counter: "0", reset: sec(nowSec + 60)},
		{name: "negative count", counter: "-3", reset: sec(nowSec + 60)},
		{name: "counter missing", counter: missing, reset: sec(nowSec + 60)},
		{name: "reset missing", counter: "7", reset: missing},
		{name: "both missing", counter: missing, reset: missing},
		{name: "count beyond MaxQuota", counter: "18446744073709551615", reset: sec(nowSec + 60), want: driver.State{Used: driver.MaxQuota, End: (nowSec + 60) * 1000}},
		{name: "padded values", counter: "12  ", reset: " " + sec(nowSec+60), want: driver.State{Used: 12, End: (nowSec + 60) * 1000}},
		{name: "milliseconds", millis: true, counter: "2", reset: sec(t0.UnixMilli() + 1234), want: driver.State{Used: 2, End: t0.UnixMilli() + 1234}},
		{name: "milliseconds ended", millis: true, counter: "2", reset: sec(t0.UnixMilli())},
		{name: "milliseconds read as seconds", counter: "2", reset: sec(t0.UnixMilli() + 1234), bad: true},
		{name: "seconds past 2200", counter: "2", reset: sec(driver.MaxUnixMilli/1000 + 1), bad: true},
		{name: "milliseconds past 2200", millis: true, counter: "2", reset: sec(driver.MaxUnixMilli + 1), bad: true},
		{name: "count not a number", counter: "seven", reset: sec(nowSec + 60), bad: true},
		{name: "count a fraction", counter: "7.5", reset: sec(nowSec + 60), bad: true},
		{name: "reset not a number", counter: "7", reset: "soon", bad: true},
		{name: "reset a fraction", counter: "7", reset: sec(nowSec) + ".5", bad: true},
		{name: "malformed reset, counter missing", counter: missing, reset: "soon", bad: true},
		{name: "malformed counter, reset missing", counter: "x", reset: missing, bad: true},
		{name: "empty counter", counter: "", reset: sec(nowSec + 60), bad: true},
	}
	p := apiPolicy(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			prefix := freshPrefix()
			opts := []legacybackend.Option{legacybackend.WithKeyFunc(prefixed(prefix))}
			if tc.millis {
				opts = append(opts, legacybackend.WithResetMillis())
			}
			b := newMemcached(t, c, time.Hour, opts...)
			key := prefix + "id"
			if tc.counter != missing {
				setRaw(t, c, key, tc.counter)
			}
			if tc.reset != missing {
				setRaw(t, c, key+legacybackend.ResetSuffix, tc.reset)
			}
			out, err := b.Peek(ctx(t), request(p, "id", t0))
			if tc.bad {
				require.ErrorIs(t, err, driver.ErrBadReply)
				require.Equal(t, uint64(1), b.Stats().Malformed)
				return
			}
			require.NoError(t, err)
			require.Equal(t, only(p, 2, tc.want), out.States)
		})
	}
}

// memcached pads a value that decr shortened with spaces ("10" becomes
// "9 "): the count must still read.
func TestMemcachedDecrementedCounter(t *testing.T) {
	c := memcachedClient(t)
	prefix := freshPrefix()
	b := newMemcached(t, c, time.Minute, legacybackend.WithKeyFunc(prefixed(prefix)))
	p := policy(t, "p", limit(t, "", driver.FixedWindow, 100, time.Minute))
	key := prefix + "id"
	setRaw(t, c, key, "10")
	setRaw(t, c, key+legacybackend.ResetSuffix, strconv.FormatInt(t0.Unix()+30, 10))
	n, err := c.Decrement(key, 1)
	require.NoError(t, err)
	require.Equal(t, uint64(9), n)
	it, err := c.Get(key)
	require.NoError(t, err)
	require.Equal(t, "9 ", string(it.Value), "memcached pads in place")

	out, err := b.Peek(ctx(t), request(p, "id", t0))
	require.NoError(t, err)
	require.Equal(t, []driver.State{{Used: 9, End: (t0.Unix() + 30) * 1000}}, out.States)
}

func TestMemcachedRefusesToDecide(t *testing.T) {
	c := memcachedClient(t)
	prefix := freshPrefix()
	b := newMemcached(t, c, time.Hour, legacybackend.WithKeyFunc(prefixed(prefix)))
	p := apiPolicy(t)
	legacyHit(t, c, prefix+"id", t0, time.Hour)

	for _, cost := range []int64{1, 5, -1} {
		req := request(p, "id", t0)
		req.Cost = cost
		out, err := b.Decide(ctx(t), req)
		require.ErrorIs(t, err, errors.ErrUnsupported)
		require.ErrorContains(t, err, "read-only legacy store")
		require.Equal(t, driver.Outcome{}, out)
	}
	// Nothing was read, nothing written.
	require.Equal(t, legacybackend.Stats{}, b.Stats())
	it, err := c.Get(prefix + "id")
	require.NoError(t, err)
	require.Equal(t, "1", string(it.Value))
}

func TestMemcachedKeys(t *testing.T) {
	c := memcachedClient(t)
	p := apiPolicy(t)

	t.Run("default key", func(t *testing.T) {
		b := newMemcached(t, c, time.Hour)
		id := freshPrefix() + "user 42" // a space, escaped by DefaultKey
		key := legacybackend.DefaultKey("api", id)
		require.Equal(t, "api:"+strings.ReplaceAll(strings.ReplaceAll(id, ":", "%3A"), " ", "%20"), key)
		require.Equal(t, "my%20api:user%3A42", legacybackend.DefaultKey("my api", "user:42"))
		legacyHit(t, c, key, t0, time.Hour)
		out, err := b.Peek(ctx(t), request(p, id, t0))
		require.NoError(t, err)
		require.Equal(t, only(p, 2, driver.State{Used: 1, End: t0.Add(time.Hour).UnixMilli()}), out.States)
	})

	t.Run("long identifier hashed", func(t *testing.T) {
		b := newMemcached(t, c, time.Hour)
		id := freshPrefix() + strings.Repeat("\xff", driver.MaxIdentifierLen-20)
		key := legacybackend.DefaultKey("api", id)
		require.Len(t, key, 65)
		require.True(t, strings.HasPrefix(key, "#"))
		require.NotEqual(t, key, legacybackend.DefaultKey("api", id[:len(id)-1]))
		legacyHit(t, c, key, t0, time.Hour)
		out, err := b.Peek(ctx(t), request(p, id, t0))
		require.NoError(t, err)
		require.Equal(t, only(p, 2, driver.State{Used: 1, End: t0.Add(time.Hour).UnixMilli()}), out.States)
	})

	t.Run("empty key reads nothing", func(t *testing.T) {
		b := newMemcached(t, c, time.Hour, legacybackend.WithKeyFunc(func(string, string) string { return "" }))
		out, err := b.Peek(ctx(t), request(p, "id", t0))
		require.NoError(t, err)
		require.Equal(t, make([]driver.State, 3), out.States)
		require.Equal(t, legacybackend.Stats{}, b.Stats())
	})

	for name, key := range map[string]string{
		"space":        "user 42",
		"control byte": "user\n42",
		"DEL":          "user\x7f",
		"too long":     strings.Repeat("k", legacybackend.MaxKeyLen-len(legacybackend.ResetSuffix)+1),
	} {
		t.Run("illegal key/"+name, func(t *testing.T) {
			b := newMemcached(t, c, time.Hour, legacybackend.WithKeyFunc(func(string, string) string { return key }))
			_, err := b.Peek(ctx(t), request(p, "id", t0))
			require.ErrorIs(t, err, driver.ErrInvalidOption)
			require.Equal(t, legacybackend.Stats{}, b.Stats())
		})
	}

	t.Run("longest legal key", func(t *testing.T) {
		key := freshPrefix() + strings.Repeat("k", legacybackend.MaxKeyLen-len(legacybackend.ResetSuffix)-18)
		require.Len(t, key+legacybackend.ResetSuffix, legacybackend.MaxKeyLen)
		b := newMemcached(t, c, time.Hour, legacybackend.WithKeyFunc(func(string, string) string { return key }))
		legacyHit(t, c, key, t0, time.Hour)
		out, err := b.Peek(ctx(t), request(p, "id", t0))
		require.NoError(t, err)
		require.Equal(t, only(p, 2, driver.State{Used: 1, End: t0.Add(time.Hour).UnixMilli()}), out.States)
	})
}

func TestMemcachedMatcher(t *testing.T) {
	c := memcachedClient(t)
	prefix := freshPrefix()
	legacyHit(t, c, prefix+"id", t0, time.Minute)
	end := t0.Add(time.Minute).Unix() * 1000

	t.Run("first fixed window of the legacy window", func(t *testing.T) {
		b := newMemcached(t, c, time.Minute, legacybackend.WithKeyFunc(prefixed(prefix)))
		p := policy(t, "p",
			limit(t, "", driver.SlidingWindow, 10, time.Minute),
			limit(t, "", driver.AlignedWindow, 10, time.Minute),
			limit(t, "burst", driver.FixedWindow, 10, time.Second),
			limit(t, "a", driver.FixedWindow, 20, time.Minute),
			limit(t, "b", driver.FixedWindow, 30, time.Minute))
		out, err := b.Peek(ctx(t), request(p, "id", t0))
		require.NoError(t, err)
		require.Equal(t, only(p, 3, driver.State{Used: 1, End: end}), out.States)
	})

	t.Run("no limit of the legacy window", func(t *testing.T) {
		b := newMemcached(t, c, time.Minute, legacybackend.WithKeyFunc(prefixed(prefix)))
		p := policy(t, "p",
			limit(t, "", driver.FixedWindow, 10, time.Second),
			limit(t, "", driver.GCRA, 10, time.Minute))
		out, err := b.Peek(ctx(t), request(p, "id", t0))
		require.NoError(t, err)
		require.Equal(t, make([]driver.State, 2), out.States)
		require.Equal(t, legacybackend.Stats{Unmatched: 1}, b.Stats(), "no round trip")
	})

	t.Run("custom matcher", func(t *testing.T) {
		b := newMemcached(t, c, time.Minute, legacybackend.WithKeyFunc(prefixed(prefix)),
			legacybackend.WithMatcher(func(p *driver.Policy, l *driver.Limit) bool {
				return p.Name == "search" && l.Name == "b"
			}))
		limits := []driver.Limit{
			limit(t, "a", driver.FixedWindow, 20, time.Minute),
			limit(t, "b", driver.FixedWindow, 30, time.Minute),
		}
		search := policy(t, "search", limits...)
		out, err := b.Peek(ctx(t), request(search, "id", t0))
		require.NoError(t, err)
		require.Equal(t, only(search, 1, driver.State{Used: 1, End: end}), out.States)
		other := policy(t, "other", limits...)
		out, err = b.Peek(ctx(t), request(other, "id", t0))
		require.NoError(t, err)
		require.Equal(t, make([]driver.State, 2), out.States)
	})

	t.Run("matcher never sees other algorithms", func(t *testing.T) {
		b := newMemcached(t, c, time.Minute, legacybackend.WithKeyFunc(prefixed(prefix)),
			legacybackend.WithMatcher(func(*driver.Policy, *driver.Limit) bool { return true }))
		p := policy(t, "p",
			limit(t, "", driver.GCRA, 10, time.Minute),
			limit(t, "", driver.FixedWindow, 10, time.Hour))
		out, err := b.Peek(ctx(t), request(p, "id", t0))
		require.NoError(t, err)
		require.Equal(t, only(p, 1, driver.State{Used: 1, End: end}), out.States)
	})
}

func TestMemcachedPing(t *testing.T) {
	server := localserver.MemcachedT(t, localserver.MemcachedOptions{})
	c := memcache.New(server.Addr())
	c.Timeout = testTimeout
	t.Cleanup(func() { _ = c.Close() })
	b := newMemcached(t, c, time.Hour)
	require.NoError(t, b.Ping(ctx(t)))

	require.NoError(t, server.Stop())
	require.Error(t, b.Ping(ctx(t)))
	_, err := b.Peek(ctx(t), request(apiPolicy(t), "id", t0))
	require.Error(t, err)
	require.NotErrorIs(t, err, driver.ErrBadReply)
}

func TestMemcachedContext(t *testing.T) {
	c := memcachedClient(t)
	b := newMemcached(t, c, time.Hour)
	done, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := b.Peek(done, request(apiPolicy(t), "id", t0))
	require.ErrorIs(t, err, context.Canceled)
	require.ErrorIs(t, b.Ping(done), context.Canceled)
	require.Equal(t, legacybackend.Stats{}, b.Stats())
}

func TestNewMemcachedErrors(t *testing.T) {
	c := memcache.New("127.0.0.1:1")
	for name, build := range map[string]func() (*legacybackend.Memcached, error){
		"nil client":    func() (*legacybackend.Memcached, error) { return legacybackend.NewMemcached(nil, time.Hour) },
		"zero window":   func() (*legacybackend.Memcached, error) { return legacybackend.NewMemcached(c, 0) },
		"fractional ms": func() (*legacybackend.Memcached, error) { return legacybackend.NewMemcached(c, 1500*time.Microsecond) },
		"window too long": func() (*legacybackend.Memcached, error) {
			return legacybackend.NewMemcached(c, driver.MaxWindow+time.Millisecond)
		},
		"nil option": func() (*legacybackend.Memcached, error) { return legacybackend.NewMemcached(c, time.Hour, nil) },
		"nil key function": func() (*legacybackend.Memcached, error) {
			return legacybackend.NewMemcached(c, time.Hour, legacybackend.WithKeyFunc(nil))
		},
		"nil matcher": func() (*legacybackend.Memcached, error) {
			return legacybackend.NewMemcached(c, time.Hour, legacybackend.WithMatcher(nil))
		},
		"WithWindow": func() (*legacybackend.Memcached, error) {
			return legacybackend.NewMemcached(c, time.Hour, legacybackend.WithWindow(time.Hour))
		},
		"WithNoTTLWindow": func() (*legacybackend.Memcached, error) {
			return legacybackend.NewMemcached(c, time.Hour, legacybackend.WithNoTTLWindow(time.Hour))
		},
	} {
		t.Run(name, func(t *testing.T) {
			b, err := build()
			require.ErrorIs(t, err, driver.ErrInvalidOption)
			require.Nil(t, b)
		})
	}
}

func TestMemcachedNotBuilt(t *testing.T) {
	p := apiPolicy(t)
	for name, b := range map[string]*legacybackend.Memcached{"nil": nil, "zero": {}} {
		t.Run(name, func(t *testing.T) {
			_, err := b.Peek(context.Background(), request(p, "id", t0))
			require.ErrorIs(t, err, driver.ErrNotInitialized)
			req := request(p, "id", t0)
			req.Cost = 1
			_, err = b.Decide(context.Background(), req)
			require.ErrorIs(t, err, driver.ErrNotInitialized)
			require.ErrorIs(t, b.Ping(context.Background()), driver.ErrNotInitialized)
			require.Equal(t, legacybackend.Stats{}, b.Stats())
		})
	}
	b, err := legacybackend.NewMemcached(memcache.New("127.0.0.1:1"), time.Hour)
	require.NoError(t, err)
	_, err = b.Peek(context.Background(), driver.Request{Identifier: "id", Now: t0})
	require.ErrorIs(t, err, driver.ErrInvalidPolicy)
}
