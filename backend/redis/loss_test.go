package redisbackend_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/internal/localserver"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// These tests measure what Redis itself can lose, for the package
// documentation: each logs its figure and asserts the direction of it.

// spend makes n decisions for id and returns how many were allowed.
func spend(t *testing.T, th *throttler.Throttler, p *throttler.Policy, id string, n int) int {
	t.Helper()
	allowed := 0
	for range n {
		r, err := th.Allow(context.Background(), p, id)
		require.NoError(t, err)
		require.False(t, r.Degraded, "%v", r.Err)
		if r.Allowed {
			allowed++
		}
	}
	return allowed
}

// used returns the Used of p's first limit for id, by a peek.
func used(t *testing.T, th *throttler.Throttler, p *throttler.Policy, id string) int64 {
	t.Helper()
	r, err := th.Peek(context.Background(), p, id)
	require.NoError(t, err)
	require.False(t, r.Degraded, "%v", r.Err)
	return r.Limits()[0].Used
}

// A failover to a replica that had fallen behind loses the writes it had
// not received. Replication is cut, the primary takes 50 more units and is
// killed, and the replica, promoted, counts only the units it had before
// the cut.
func TestLaggingReplicaFailoverLosesUnreplicatedUnits(t *testing.T) {
	ctx := context.Background()
	primary := ownRedis(t)
	replica := localserver.RedisReplicaT(t, primary, localserver.RedisOptions{})
	prefix := newPrefix()
	pc := newClient(t, primary.Addr())
	th := quiet(t, mustBackend(t, pc, redisbackend.WithPrefix(prefix)), throttlertest.NewManualClock(t0))
	p := mustPolicy(t, "lag", "1000/h")
	require.Equal(t, 100, spend(t, th, p, "user", 100))
	require.NoError(t, replica.WaitReplicaSynced(10*time.Second))

	// The cut: the replica is pointed at an address where nothing
	// listens, as a network partition would leave it. It keeps its data
	// and receives nothing more. (SIGSTOP is not a cut: the kernel keeps
	// receiving the stream, and the replica reads it once resumed.)
	rc := newClient(t, replica.Addr())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	nowhere := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close()) // nothing listens there now
	require.NoError(t, rc.Do(ctx, "REPLICAOF", "127.0.0.1", nowhere).Err())
	const after = 50
	require.Equal(t, after, spend(t, th, p, "user", after))
	primary.Kill()
	require.NoError(t, rc.Do(ctx, "REPLICAOF", "NO", "ONE").Err())

	promoted := quiet(t, mustBackend(t, rc, redisbackend.WithPrefix(prefix)), throttlertest.NewManualClock(t0))
	kept := used(t, promoted, p, "user")
	lost := 100 + after - kept
	t.Logf("failover from a replica cut off before the last %d decisions: %d of %d units kept, %d lost", after, kept, 100+after, lost)
	assert.Equal(t, int64(after), lost, "the promoted replica lost exactly the writes it never received")
}

// A restart without persistence (no RDB, no AOF: the test servers' setting)
// resets every window.
func TestRestartWithoutPersistenceResetsEveryWindow(t *testing.T) {
	server := ownRedis(t)
	c := goredis.NewClient(&goredis.Options{Addr: server.Addr(), MaxRetries: 5})
	t.Cleanup(func() { _ = c.Close() })
	th := quiet(t, mustBackend(t, c, redisbackend.WithPrefix(newPrefix())), throttlertest.NewManualClock(t0))
	p := mustPolicy(t, "restart", "1000/h")
	const ids, each = 10, 4
	for i := range ids {
		spend(t, th, p, fmt.Sprint("user:", i), each)
	}
	require.NoError(t, server.Stop())
	require.NoError(t, server.Start())
	var left int64
	for i := range ids {
		left += used(t, th, p, fmt.Sprint("user:", i))
	}
	t.Logf("restart without persistence: %d of %d units spent in %d windows remain", left, ids*each, ids)
	assert.Zero(t, left, "every window was reset")
}

// With allkeys-lru and too little memory, a flood of new identifiers evicts
// live windows, and an identifier that had spent its quota is admitted
// again. With noeviction, the flood's decisions fail instead (and follow
// their failure mode), and the spent quota stays spent.
func TestEvictionPolicy(t *testing.T) {
	for _, policy := range []string{"allkeys-lru", "noeviction"} {
		t.Run(policy, func(t *testing.T) {
			ctx := context.Background()
			server := localserver.RedisT(t, localserver.RedisOptions{
				Args: []string{"--maxmemory", "2mb", "--maxmemory-policy", policy}})
			c := goredis.NewClient(&goredis.Options{Addr: server.Addr(), ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = c.Close() })
			logs, logger := testkit.NewLogs()
			prev := slog.Default()
			slog.SetDefault(logger)
			b := mustBackend(t, c, redisbackend.WithPrefix(newPrefix()), redisbackend.WithBatching(0))
			require.NoError(t, b.Ping(ctx))
			slog.SetDefault(prev)
			got, err := b.MaxmemoryPolicy(ctx)
			require.NoError(t, err)
			assert.Equal(t, policy, got)
			warned := logs.Count(slog.LevelWarn, "not noeviction")
			th := testkit.Throttler(t, b, throttler.WithLogger(nil), throttler.WithCallTimeout(time.Second),
				throttler.WithClock(throttlertest.NewManualClock(t0)))
			p := mustPolicy(t, "evict", "5/h", throttler.WithFailureMode(throttler.FailClosed))
			require.Equal(t, 5, spend(t, th, p, "victim", 6), "the victim spends its quota")

			// The flood: new identifiers, 8 goroutines, until the victim's
			// keys are gone or a decision fails, bounded in count.
			var flooded, failed atomic.Int64
			var victimGone atomic.Bool
			victimKey := b.Key(testkit.Compile(t, p), "victim")
			var wg sync.WaitGroup
			for g := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 50_000 && failed.Load() == 0 && !victimGone.Load(); i++ {
						r, err := th.Allow(ctx, p, fmt.Sprintf("flood:%d:%d", g, i))
						if err != nil || r.Degraded {
							failed.Add(1)
							return
						}
						if n := flooded.Add(1); n%500 == 0 {
							if exists, err := c.Exists(ctx, victimKey).Result(); err == nil && exists == 0 {
								victimGone.Store(true)
							}
						}
					}
				}()
			}
			wg.Wait()
			r, err := th.Allow(ctx, p, "victim")
			require.NoError(t, err)
			switch policy {
			case "allkeys-lru":
				t.Logf("allkeys-lru: %d new identifiers evicted the spent window; the victim is admitted again: %v", flooded.Load(), r.Allowed)
				assert.True(t, victimGone.Load(), "the flood evicted the victim's window")
				assert.True(t, r.Allowed, "an evicted window re-admits a spent quota")
				assert.Equal(t, 1, warned, "the backend warns about the policy")
			case "noeviction":
				t.Logf("noeviction: after %d new identifiers decisions failed (OOM) instead; the victim: allowed %v, degraded %v", flooded.Load(), r.Allowed, r.Degraded)
				assert.Positive(t, failed.Load(), "out of memory, decisions fail")
				assert.False(t, victimGone.Load())
				assert.False(t, r.Allowed, "the spent quota stays spent")
				assert.Zero(t, warned, "noeviction is not warned about")
			}
		})
	}
}
