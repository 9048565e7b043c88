package legacybackend_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/internal/localserver"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// The shared servers are started once per test binary, on first use, and
// closed by TestMain. Tests keep apart by key prefix (freshPrefix); a test
// that stops a server starts its own.
var (
	sharedMemcached struct {
		once   sync.Once
		server *localserver.Memcached
		err    error
	}
	sharedRedis struct {
		once   sync.Once
		server *localserver.Redis
		err    error
	}
)

func TestMain(m *testing.M) {
	code := m.Run()
	if s := sharedMemcached.server; s != nil {
		if err := s.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "closing memcached:", err)
		}
	}
	if s := sharedRedis.server; s != nil {
		if err := s.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "closing redis-server:", err)
		}
	}
	os.Exit(code)
}

// skipOrFail reports a server that could not start: a missing binary
// skips the test unless localserver.RequireServers says otherwise.
func skipOrFail(tb testing.TB, what string, err error) {
	tb.Helper()
	if errors.Is(err, localserver.ErrBinaryNotFound) && !localserver.RequireServers() {
		tb.Skipf("skipping: %s not installed: %v", what, err)
	}
	tb.Fatalf("starting %s: %v", what, err)
}

// testTimeout bounds each round trip: generous, so that a slow -race run
// never fails on time.
const testTimeout = 5 * time.Second

// memcachedClient returns a client of the shared memcached.
func memcachedClient(tb testing.TB) *memcache.Client {
	tb.Helper()
	localserver.SkipIfShort(tb)
	sharedMemcached.once.Do(func() {
		sharedMemcached.server, sharedMemcached.err = localserver.StartMemcached(localserver.MemcachedOptions{})
	})
	if sharedMemcached.err != nil {
		skipOrFail(tb, "memcached", sharedMemcached.err)
	}
	c := memcache.New(sharedMemcached.server.Addr())
	c.Timeout = testTimeout
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// redisServer returns the shared standalone redis-server.
func redisServer(tb testing.TB) *localserver.Redis {
	tb.Helper()
	localserver.SkipIfShort(tb)
	sharedRedis.once.Do(func() {
		sharedRedis.server, sharedRedis.err = localserver.StartRedis(localserver.RedisOptions{})
	})
	if sharedRedis.err != nil {
		skipOrFail(tb, "redis-server", sharedRedis.err)
	}
	return sharedRedis.server
}

// redisClient returns a client of the shared redis-server.
func redisClient(tb testing.TB) *goredis.Client {
	tb.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: redisServer(tb).Addr(), ReadTimeout: testTimeout, WriteTimeout: testTimeout})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

// freshPrefix returns a key prefix no other test uses.
func freshPrefix() string { return fmt.Sprintf("t%016x:", rand.Uint64()) }

// prefixed is a key function as a legacy deployment might have: its own
// prefix, then the identifier; the policy is not part of the key.
func prefixed(prefix string) func(policy, identifier string) string {
	return func(_, identifier string) string { return prefix + identifier }
}

// limit returns a limit built by driver.NewLimit.
func limit(tb testing.TB, name string, alg driver.Algorithm, max int64, window time.Duration) driver.Limit {
	tb.Helper()
	l, err := driver.NewLimit(name, alg, max, window, 0)
	require.NoError(tb, err)
	return l
}

// policy returns a policy built by driver.NewPolicy.
func policy(tb testing.TB, name string, limits ...driver.Limit) *driver.Policy {
	tb.Helper()
	p, err := driver.NewPolicy(name, limits...)
	require.NoError(tb, err)
	return p
}

// apiPolicy has a GCRA limit and two fixed windows, the legacy hour last:
// the legacy state must land on limit 2 only.
func apiPolicy(tb testing.TB) *driver.Policy {
	return policy(tb, "api",
		limit(tb, "", driver.GCRA, 100, time.Hour),
		limit(tb, "", driver.FixedWindow, 10, time.Second),
		limit(tb, "", driver.FixedWindow, 5000, time.Hour))
}

// t0 is the clock reading the tests decide with: far from the wall clock
// on purpose, since the backends must use the request's time only.
var t0 = time.UnixMilli(1_900_000_000_000).UTC()

// request returns a peek of p for identifier at now.
func request(p *driver.Policy, identifier string, now time.Time) driver.Request {
	return driver.Request{Policy: p, Identifier: identifier, Now: now}
}

// ctx returns a context bounded by testTimeout.
func ctx(tb testing.TB) context.Context {
	c, cancel := context.WithTimeout(context.Background(), testTimeout)
	tb.Cleanup(cancel)
	return c
}

// only returns the states of p with s at index i and zero elsewhere.
func only(p *driver.Policy, i int, s driver.State) []driver.State {
	states := make([]driver.State, len(p.Limits))
	states[i] = s
	return states
}
