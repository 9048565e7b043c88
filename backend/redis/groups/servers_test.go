package redisgroups

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	shardedbackend "github.com/throttlekit/throttlekit/backend/sharded"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/internal/localserver"
)

// The three shards below, each a primary with one replica, are started once
// per test binary, on first use, and closed by TestMain. Tests keep apart by
// key prefix (newPrefix). No test here runs in parallel, because
// TestStoppedShardDegradesOnlyItsIdentifiers stops and restarts a primary.

var shardNames = []string{"a", "b", "c"}

// testShards are the shared servers and a client for each.
type testShards struct {
	primaries, replicas            []*localserver.Redis
	primaryClients, replicaClients []*goredis.Client
}

var (
	sharedOnce    sync.Once
	sharedShards  *testShards
	sharedErr     error
	prefixCounter atomic.Int64
)

func TestMain(m *testing.M) {
	code := m.Run()
	if sharedShards != nil {
		sharedShards.close()
	}
	os.Exit(code)
}

// servers returns the shared shards, starting them on first use. A missing
// redis-server skips the test unless localserver.RequireServers says to
// fail.
func servers(tb testing.TB) *testShards {
	localserver.SkipIfShort(tb)
	tb.Helper()
	sharedOnce.Do(func() { sharedShards, sharedErr = startShards() })
	if sharedErr != nil {
		if errors.Is(sharedErr, localserver.ErrBinaryNotFound) && !localserver.RequireServers() {
			tb.Skipf("skipping: %v", sharedErr)
		}
		tb.Fatalf("starting three primaries with a replica each: %v", sharedErr)
	}
	return sharedShards
}

func startShards() (*testShards, error) {
	ts := &testShards{}
	for range shardNames {
		p, err := localserver.StartRedis(localserver.RedisOptions{})
		if err != nil {
			ts.close()
			return nil, err
		}
		ts.primaries = append(ts.primaries, p)
		r, err := localserver.StartRedisReplica(p, localserver.RedisOptions{})
		if err != nil {
			ts.close()
			return nil, err
		}
		ts.replicas = append(ts.replicas, r)
		ts.primaryClients = append(ts.primaryClients, goredis.NewClient(&goredis.Options{Addr: p.Addr()}))
		ts.replicaClients = append(ts.replicaClients, goredis.NewClient(&goredis.Options{Addr: r.Addr()}))
	}
	return ts, nil
}

func (ts *testShards) close() {
	for _, c := range append(ts.primaryClients, ts.replicaClients...) {
		_ = c.Close()
	}
	for _, s := range append(ts.replicas, ts.primaries...) {
		_ = s.Close()
	}
}

// index returns the position of the shard named name.
func (ts *testShards) index(tb testing.TB, name string) int {
	for i, n := range shardNames {
		if n == name {
			return i
		}
	}
	tb.Fatalf("no shard %q", name)
	return -1
}

// config returns the configuration string of the shared shards, each URL
// followed by params (go-redis options, without the '?').
func (ts *testShards) config(params string) string {
	entries := make([]string, len(shardNames))
	for i, name := range shardNames {
		entries[i] = fmt.Sprintf("%s=redis://%s?replica=redis://%s", name, ts.primaries[i].Addr(), ts.replicas[i].Addr())
		if params != "" {
			entries[i] += "&" + params
		}
	}
	return strings.Join(entries, ",")
}

// waitReplicas waits until every replica holds what its primary holds.
func (ts *testShards) waitReplicas(tb testing.TB) {
	tb.Helper()
	for _, r := range ts.replicas {
		require.NoError(tb, r.WaitReplicaSynced(15*time.Second))
	}
}

// newPrefix returns a key prefix no other test of this binary uses.
func newPrefix() string {
	return "sharded-test-" + strconv.FormatInt(prefixCounter.Add(1), 10) + ":"
}

// openShared opens the shared shards through OpenRedis, the configuration
// string path, with a fresh prefix.
func openShared(tb testing.TB, ts *testShards, params string) (*shardedbackend.Backend, string) {
	tb.Helper()
	prefix := newPrefix()
	b, err := Open(ts.config(params), WithBackendOptions(redisbackend.WithPrefix(prefix)))
	require.NoError(tb, err)
	tb.Cleanup(func() { require.NoError(tb, b.Close()) })
	return b, prefix
}

// info returns the fields of one INFO section.
func info(ctx context.Context, c *goredis.Client, section string) (map[string]string, error) {
	text, err := c.Info(ctx, section).Result()
	if err != nil {
		return nil, err
	}
	fields := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[k] = v
		}
	}
	return fields, nil
}

// scriptCalls returns how many script calls (EVAL, EVALSHA and their
// read-only forms) reached a server, from INFO commandstats: those it ran,
// successfully or not (calls), and those it rejected before running them.
func scriptCalls(tb testing.TB, c *goredis.Client) (readOnly, readWrite int64) {
	tb.Helper()
	fields, err := info(context.Background(), c, "commandstats")
	require.NoError(tb, err)
	count := func(cmd string) int64 {
		var n int64
		for _, part := range strings.Split(fields["cmdstat_"+cmd], ",") {
			k, v, _ := strings.Cut(part, "=")
			if k == "calls" || k == "rejected_calls" {
				x, _ := strconv.ParseInt(v, 10, 64)
				n += x
			}
		}
		return n
	}
	return count("evalsha_ro") + count("eval_ro"), count("evalsha") + count("eval")
}
