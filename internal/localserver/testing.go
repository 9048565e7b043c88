package localserver

import (
	"errors"
	"os"
	"testing"
)

// RequireServers reports whether missing server binaries must fail tests
// instead of skipping them: true when the environment variable CI is
// non-empty or THROTTLEKIT_REQUIRE_SERVERS is "1".
func RequireServers() bool {
	return os.Getenv("CI") != "" || os.Getenv("THROTTLEKIT_REQUIRE_SERVERS") == "1"
}

// failStart reports a start error to tb: a missing binary skips the test
// unless [RequireServers]; anything else fails it.
// SkipIfShort skips tb under go test -short: short mode runs the unit
// tests alone, with no server, even where RequireServers holds.
func SkipIfShort(tb testing.TB) {
	tb.Helper()
	if testing.Short() {
		tb.Skip("needs real servers; skipped under -short")
	}
}

func failStart(tb testing.TB, what string, err error) {
	tb.Helper()
	if errors.Is(err, ErrBinaryNotFound) && !RequireServers() {
		tb.Skipf("skipping: %s: %v (set CI or THROTTLEKIT_REQUIRE_SERVERS=1 to fail instead)", what, err)
		return
	}
	tb.Fatalf("%s: %v", what, err)
}

// RedisT starts a standalone Redis for a test (see [StartRedis]) and closes
// it when the test ends. A missing redis-server skips the test, or fails it
// when [RequireServers] is true; other errors fail it.
func RedisT(tb testing.TB, opts RedisOptions) *Redis {
	tb.Helper()
	SkipIfShort(tb)
	r, err := StartRedis(opts)
	if err != nil {
		failStart(tb, "starting redis-server", err)
		return nil
	}
	tb.Cleanup(func() { closeT(tb, r.Close) })
	return r
}

// RedisReplicaT starts a replica of primary for a test (see
// [StartRedisReplica]) and closes it when the test ends. Errors are handled
// as in [RedisT].
func RedisReplicaT(tb testing.TB, primary *Redis, opts RedisOptions) *Redis {
	tb.Helper()
	SkipIfShort(tb)
	r, err := StartRedisReplica(primary, opts)
	if err != nil {
		failStart(tb, "starting redis-server replica", err)
		return nil
	}
	tb.Cleanup(func() { closeT(tb, r.Close) })
	return r
}

// RedisSentinelT starts a Sentinel monitoring primary under masterName for
// a test (see [StartRedisSentinel]) and closes it when the test ends. Errors
// are handled as in [RedisT].
func RedisSentinelT(tb testing.TB, primary *Redis, masterName string, opts RedisOptions) *RedisSentinel {
	tb.Helper()
	SkipIfShort(tb)
	s, err := StartRedisSentinel(primary, masterName, opts)
	if err != nil {
		failStart(tb, "starting redis sentinel", err)
		return nil
	}
	tb.Cleanup(func() { closeT(tb, s.Close) })
	return s
}

// RedisClusterT starts a Redis Cluster for a test (see [StartRedisCluster])
// and closes it when the test ends. A missing redis-server or redis-cli
// skips the test, or fails it when [RequireServers] is true; other errors
// fail it.
func RedisClusterT(tb testing.TB, primaries, replicasPerPrimary int) *RedisCluster {
	tb.Helper()
	SkipIfShort(tb)
	c, err := StartRedisCluster(primaries, replicasPerPrimary)
	if err != nil {
		failStart(tb, "starting redis cluster", err)
		return nil
	}
	tb.Cleanup(func() { closeT(tb, c.Close) })
	return c
}

// MemcachedT starts a memcached for a test (see [StartMemcached]) and closes
// it when the test ends. Errors are handled as in [RedisT].
func MemcachedT(tb testing.TB, opts MemcachedOptions) *Memcached {
	tb.Helper()
	SkipIfShort(tb)
	m, err := StartMemcached(opts)
	if err != nil {
		failStart(tb, "starting memcached", err)
		return nil
	}
	tb.Cleanup(func() { closeT(tb, m.Close) })
	return m
}

// closeT runs a Close function from a test cleanup and reports its error.
func closeT(tb testing.TB, closeFn func() error) {
	tb.Helper()
	if err := closeFn(); err != nil {
		tb.Errorf("localserver cleanup: %v", err)
	}
}

// UnleashT starts an Unleash server with its database for a test (see
// [StartUnleash]) and closes both when the test ends. A missing node,
// PostgreSQL or unleash-server package skips the test, or fails it when
// [RequireServers] is true; other errors fail it.
func UnleashT(tb testing.TB) *Unleash {
	tb.Helper()
	SkipIfShort(tb)
	u, err := StartUnleash()
	if err != nil {
		failStart(tb, "starting unleash-server", err)
		return nil
	}
	tb.Cleanup(func() { _ = u.Close() })
	return u
}
