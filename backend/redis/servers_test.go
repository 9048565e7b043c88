package redisbackend_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/internal/localserver"
)

// The servers below are started at most once per test binary, on first use,
// and closed by TestMain. Tests share them and keep apart by key prefix
// (newPrefix); a test that stops or reconfigures a server starts its own.

// sharedServer starts a server once and remembers the outcome.
type sharedServer[T any] struct {
	once  sync.Once
	value T
	err   error
	close func() error
}

func (s *sharedServer[T]) get(tb testing.TB, what string, start func() (T, func() error, error)) T {
	localserver.SkipIfShort(tb)
	tb.Helper()
	s.once.Do(func() { s.value, s.close, s.err = start() })
	if s.err != nil {
		if errors.Is(s.err, localserver.ErrBinaryNotFound) && !localserver.RequireServers() {
			tb.Skipf("skipping: %s: %v", what, s.err)
		}
		tb.Fatalf("%s: %v", what, s.err)
	}
	return s.value
}

func (s *sharedServer[T]) shutdown() {
	if s.close != nil {
		_ = s.close()
	}
}

// primaryReplica is a standalone primary with one replica.
type primaryReplica struct {
	primary, replica *localserver.Redis
}

var (
	standaloneServer sharedServer[primaryReplica]
	clusterServer    sharedServer[*localserver.RedisCluster]
)

func TestMain(m *testing.M) {
	code := m.Run()
	standaloneServer.shutdown()
	clusterServer.shutdown()
	os.Exit(code)
}

// standalone returns the shared standalone primary and its replica.
func standalone(tb testing.TB) primaryReplica {
	return standaloneServer.get(tb, "starting redis-server and a replica", func() (primaryReplica, func() error, error) {
		primary, err := localserver.StartRedis(localserver.RedisOptions{})
		if err != nil {
			return primaryReplica{}, nil, err
		}
		replica, err := localserver.StartRedisReplica(primary, localserver.RedisOptions{})
		if err != nil {
			return primaryReplica{}, nil, errors.Join(err, primary.Close())
		}
		return primaryReplica{primary, replica}, func() error { return errors.Join(replica.Close(), primary.Close()) }, nil
	})
}

// cluster returns the shared Redis Cluster: 3 primaries with a replica each.
func cluster(tb testing.TB) *localserver.RedisCluster {
	return clusterServer.get(tb, "starting a redis cluster", func() (*localserver.RedisCluster, func() error, error) {
		c, err := localserver.StartRedisCluster(3, 1)
		if err != nil {
			return nil, nil, err
		}
		if err := listReplicas(c); err != nil {
			return nil, nil, errors.Join(err, c.Close())
		}
		return c, c.Close, nil
	})
}

// listReplicas waits until every node's CLUSTER SLOTS lists a replica for
// every slot range, which is where go-redis learns where read-only commands
// may go. Redis leaves out a replica whose replication offset is still 0, as
// it is on a fresh cluster until its primary has written something, so this
// first writes a key to every primary.
func listReplicas(c *localserver.RedisCluster) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cc := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: c.Addrs()})
	defer cc.Close()
	for i := range 30 { // 30 hash tags cover the 3 primaries' ranges
		if err := cc.Set(ctx, fmt.Sprintf("warm-up{%d}", i), "1", time.Minute).Err(); err != nil {
			return err
		}
	}
	for _, addr := range c.Addrs() {
		node := goredis.NewClient(&goredis.Options{Addr: addr})
		defer node.Close()
		for {
			// go-redis builds its slot map from CLUSTER SLOTS, so that is
			// what must list the replicas before the tests start.
			//lint:ignore SA1019 CLUSTER SHARDS lists replicas that CLUSTER SLOTS, and so go-redis, does not see yet
			slots, err := node.ClusterSlots(ctx).Result()
			if err != nil {
				return fmt.Errorf("%s: CLUSTER SLOTS: %w", addr, err)
			}
			listed := len(slots) > 0
			for _, s := range slots {
				listed = listed && len(s.Nodes) == 2
			}
			if listed {
				break
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("%s: CLUSTER SLOTS lists no replica: %v", addr, slots)
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return nil
}

// ownRedis starts a standalone server for one test that stops or
// reconfigures it.
func ownRedis(tb testing.TB) *localserver.Redis {
	return localserver.RedisT(tb, localserver.RedisOptions{})
}

var prefixes atomic.Int64

// newPrefix returns a key prefix no other test or subtest of this binary
// uses.
func newPrefix() string {
	return fmt.Sprintf("tk%d-%d:", os.Getpid(), prefixes.Add(1))
}

func newClient(tb testing.TB, addr string) *goredis.Client {
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

func newClusterClient(tb testing.TB, c *localserver.RedisCluster, readOnly bool) *goredis.ClusterClient {
	cc := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: c.Addrs(), ReadOnly: readOnly})
	tb.Cleanup(func() { _ = cc.Close() })
	return cc
}

func newAutoPipeliner(tb testing.TB, c *goredis.Client) *goredis.AutoPipeliner {
	ap, err := c.AutoPipeline()
	require.NoError(tb, err)
	return ap
}

// commandCalls returns how many times a server ran command (lower case, as
// INFO commandstats names it), from INFO commandstats.
func commandCalls(tb testing.TB, addr, command string) int64 {
	tb.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: addr})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := c.InfoMap(ctx, "commandstats").Result()
	require.NoError(tb, err)
	stats := info["Commandstats"]["cmdstat_"+command]
	var calls int64
	if stats != "" {
		_, err := fmt.Sscanf(stats, "calls=%d", &calls)
		require.NoError(tb, err, "cmdstat_%s=%s", command, stats)
	}
	return calls
}
