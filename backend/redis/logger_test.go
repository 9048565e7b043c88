package redisbackend_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	shardedbackend "github.com/throttlekit/throttlekit/backend/sharded"
	"github.com/throttlekit/throttlekit/internal/localserver"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// The eviction-policy warning goes to the logger of throttler.WithLogger,
// through every decorator between the throttler and the Redis backend, and
// nowhere once a throttler was given WithLogger(nil).
func TestEvictionWarningGoesToTheThrottlersLogger(t *testing.T) {
	ctx := context.Background()
	server := localserver.RedisT(t, localserver.RedisOptions{Args: []string{"--maxmemory-policy", "allkeys-lru"}})
	newBackend := func() *redisbackend.Backend {
		c := goredis.NewClient(&goredis.Options{Addr: server.Addr(), ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		return mustBackend(t, c, redisbackend.WithPrefix(newPrefix()))
	}

	t.Run("through rollout and sharded", func(t *testing.T) {
		shards, err := shardedbackend.New([]shardedbackend.Shard{{Name: "a", Primary: newBackend()}})
		require.NoError(t, err)
		src, err := rollout.NewStaticSource(100)
		require.NoError(t, err)
		ro, err := rollout.New(memorybackend.New(), shards, src)
		require.NoError(t, err)
		var _ driver.LoggerSetter = ro
		logs, logger := testkit.NewLogs()
		th := testkit.Throttler(t, ro, throttler.WithLogger(logger), throttler.WithCallTimeout(time.Second))
		require.NoError(t, th.Ping(ctx))
		assert.Equal(t, 1, logs.Count(slog.LevelWarn, "not noeviction"), "the warning reached WithLogger's logger")
	})

	t.Run("a nil logger discards", func(t *testing.T) {
		b := newBackend()
		_ = testkit.Throttler(t, b, throttler.WithLogger(nil))
		require.NoError(t, b.Ping(ctx)) // logs nothing, and does not panic
		logs, logger := testkit.NewLogs()
		b.SetLogger(logger) // a later throttler's logger wins, but the check ran once
		require.NoError(t, b.Ping(ctx))
		assert.Zero(t, logs.Count(slog.LevelDebug, ""), "the policy is checked on the first Ping only")
	})

	t.Run("the layout-2 view passes it on", func(t *testing.T) {
		b := newBackend()
		logs, logger := testkit.NewLogs()
		ls, ok := b.Layout2().(driver.LoggerSetter)
		require.True(t, ok)
		ls.SetLogger(logger)
		require.NoError(t, b.Ping(ctx))
		assert.Equal(t, 1, logs.Count(slog.LevelWarn, "not noeviction"))
	})
}
