package errorstyle

import (
	"context"
	"errors"
	"maps"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	memcachedbackend "github.com/throttlekit/throttlekit/backend/memcached"
	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	redisgroups "github.com/throttlekit/throttlekit/backend/redis/groups"
	shardedbackend "github.com/throttlekit/throttlekit/backend/sharded"
	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/rollout/unleashflag"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// refusedAddr returns a loopback address nothing listens on: a port that
// was just free.
func refusedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// TestOnePrefixPerMessage: every message starts with "throttlekit: " and
// says it once, per line (errors.Join puts one error on each line),
// however many packages the error went through.
func TestOnePrefixPerMessage(t *testing.T) {
	ctx := context.Background()
	addr := refusedAddr(t)
	errs := map[string]error{}

	// A store's failure through decorators and the throttler.
	mc, err := memcachedbackend.NewClient(50*time.Millisecond, addr)
	require.NoError(t, err)
	mcB, err := memcachedbackend.New(mc)
	require.NoError(t, err)
	rc := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = rc.Close() })
	rB, err := redisbackend.New(rc)
	require.NoError(t, err)
	sharded, err := shardedbackend.New([]shardedbackend.Shard{{Name: "a", Primary: mcB}, {Name: "b", Primary: rB}})
	require.NoError(t, err)
	src, err := rollout.NewStaticSource(0)
	require.NoError(t, err)
	ro, err := rollout.New(sharded, memorybackend.New(), src)
	require.NoError(t, err)
	p, err := throttler.ParsePolicy("api", "10/s")
	require.NoError(t, err)
	for name, b := range map[string]driver.Backend{"memcached": mcB, "redis": rB, "sharded": sharded, "rollout": ro} {
		th, err := throttler.New(b, throttler.WithLogger(nil))
		require.NoError(t, err)
		for i := range 2 { // identifiers on both shards
			r, err := th.Allow(ctx, p, []string{"u1", "u2", "u3", "u4"}[i])
			require.NoError(t, err)
			require.True(t, r.Degraded)
			errs[name+" decide "+string(rune('0'+i))] = r.Err
		}
		_, errs[name+" refund"] = th.Refund(ctx, p, "u1", 1)
		errs[name+" reset"] = th.Reset(ctx, p, "u1")
		errs[name+" ping"] = th.Ping(ctx)
	}

	// Input and configuration, through the packages that wrap them.
	_, errs["policy"] = throttler.ParsePolicy("api", "10/s, ten/min")
	_, errs["policy option"] = throttler.ParsePolicy("api", "10/s", throttler.WithClock(nil))
	_, errs["fail local"] = throttler.New(memorybackend.New(), throttler.WithFailureMode(throttler.FailLocal))
	_, errs["memory bound"] = throttler.New(memorybackend.New(memorybackend.WithMaxIdentifiers(-1)))
	boundless, err := rollout.New(memorybackend.New(memorybackend.WithMaxIdentifiers(-1)), memorybackend.New(), src)
	require.NoError(t, err)
	_, errs["memory bound in rollout"] = throttler.New(boundless)
	_, errs["memcached servers"] = memcachedbackend.NewClient(time.Second, "127.0.0.1:")
	slowClient, err := memcachedbackend.NewClient(time.Second, "127.0.0.1:11211")
	require.NoError(t, err)
	slow, err := memcachedbackend.New(slowClient)
	require.NoError(t, err)
	slowShards, err := shardedbackend.New([]shardedbackend.Shard{{Name: "a", Primary: slow}})
	require.NoError(t, err)
	_, errs["memcached timeout in sharded"] = throttler.New(slowShards)
	_, errs["sharded"] = shardedbackend.New([]shardedbackend.Shard{{Name: "a b", Primary: memorybackend.New()}})
	_, errs["groups config"] = redisgroups.Parse("a=10.0.0.1:6379")
	_, errs["groups option"] = redisgroups.Open("a=redis://"+addr, redisgroups.WithBackendOptions(nil))
	_, errs["rollout"] = rollout.New(nil, memorybackend.New(), src)
	_, errs["unleash"] = unleashflag.New("toggle", unleashflag.WithServer("http://127.0.0.1:1/", "app"))

	for _, name := range slices.Sorted(maps.Keys(errs)) {
		err := errs[name]
		require.Error(t, err, name)
		t.Logf("%s: %v", name, err)
		for _, line := range strings.Split(err.Error(), "\n") {
			assert.True(t, strings.HasPrefix(line, "throttlekit: "), "%s: %q does not start with the prefix", name, line)
			assert.Equal(t, 1, strings.Count(line, "throttlekit:"), "%s: %q", name, line)
		}
	}
	// The causes stay reachable through the shortened messages.
	assert.ErrorIs(t, errs["rollout decide 0"], throttler.ErrBackend)
	assert.ErrorIs(t, errs["memory bound in rollout"], throttler.ErrInvalidOption)
	var opErr *net.OpError
	assert.True(t, errors.As(errs["sharded decide 0"], &opErr) || errors.As(errs["sharded decide 1"], &opErr), "%v", errs["sharded decide 0"])
}
