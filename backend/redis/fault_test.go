package redis_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/throttler"
)

// hangBound is a generous bound on a call that must not hang: far above the
// per-call timeout, far below go-redis's own retry and dial timeouts.
const hangBound = 5 * time.Second

// With the server stopped, every decision ends within the per-call timeout
// and the policy's failure mode decides it; once the server is back on the
// same port, the backend recovers by itself.
func TestServerDownAppliesFailureMode(t *testing.T) {
	for _, kind := range []struct {
		name   string
		client func(t *testing.T, addr string) redis.Client
	}{
		{"plain", func(t *testing.T, addr string) redis.Client { return newClient(t, addr) }},
		{"autopipeline", func(t *testing.T, addr string) redis.Client { return newAutoPipeliner(t, newClient(t, addr)) }},
	} {
		t.Run(kind.name, func(t *testing.T) {
			ctx := context.Background()
			server := ownRedis(t)
			b := mustBackend(t, kind.client(t, server.Addr()))
			clock := throttler.NewManualClock(t0)
			th := throttler.New(b, throttler.WithClock(clock), throttler.WithObserver(throttler.NopObserver{}))
			open := mustPolicy(t, "open", "10/min")
			closed := mustPolicy(t, "closed", "10/min", throttler.WithFailureMode(throttler.FailClosed))

			for _, p := range []*throttler.Policy{open, closed} {
				r, err := th.Allow(ctx, p, "user")
				require.NoError(t, err)
				require.False(t, r.Degraded, "%v", r.Err)
			}

			require.NoError(t, server.Stop())
			for i := range 2 {
				for _, p := range []*throttler.Policy{open, closed} {
					start := time.Now()
					r, err := th.Allow(ctx, p, "user")
					elapsed := time.Since(start)
					require.NoError(t, err)
					assert.True(t, r.Degraded, "%s #%d", p.Name(), i)
					assert.ErrorIs(t, r.Err, throttler.ErrBackend)
					assert.Equal(t, p.FailureMode() == throttler.FailOpen, r.Allowed, "%s #%d", p.Name(), i)
					assert.Less(t, elapsed, hangBound)

					_, err = th.Peek(ctx, p, "user")
					require.NoError(t, err)
					_, err = th.Refund(ctx, p, "user", 1)
					assert.ErrorIs(t, err, throttler.ErrBackend)
					assert.ErrorIs(t, th.Reset(ctx, p, "user"), throttler.ErrBackend)
					assert.ErrorIs(t, th.Ping(ctx), throttler.ErrBackend)
				}
			}

			// Back on the same port, empty (nothing is persisted) and with
			// an empty script cache: the backend recovers without help.
			require.NoError(t, server.Start())
			recovered := false
			deadline := time.Now().Add(hangBound)
			for !recovered && time.Now().Before(deadline) {
				r, err := th.Allow(ctx, open, "user")
				require.NoError(t, err)
				recovered = !r.Degraded
			}
			require.True(t, recovered, "still degraded %v after the restart", hangBound)
			for _, p := range []*throttler.Policy{open, closed} {
				r, err := th.Allow(ctx, p, "user")
				require.NoError(t, err)
				assert.False(t, r.Degraded, "%v", r.Err)
				assert.True(t, r.Allowed)
			}
			assert.NoError(t, th.Ping(ctx))
		})
	}
}

// A per-call timeout holds on a client that ignores command contexts once a
// command is queued (the auto-pipeliner), even when its server never
// answers: a listener that accepts connections and stays silent.
func TestTimeoutBoundsADetachedClient(t *testing.T) {
	ctx := context.Background()
	server := ownRedis(t)
	c := newClient(t, server.Addr())
	ap := newAutoPipeliner(t, c)
	b := mustBackend(t, ap, redis.WithPrefix(newPrefix()))
	th := throttler.New(b, throttler.WithClock(throttler.NewManualClock(t0)), throttler.WithObserver(throttler.NopObserver{}),
		throttler.WithTimeout(50*time.Millisecond))
	p := mustPolicy(t, "slow", "10/min", throttler.WithFailureMode(throttler.FailClosed))

	// CLIENT PAUSE holds every command of every client, the auto-pipeliner's
	// batch included, for a second: twenty times the 50 ms budget. Had the
	// call waited for its batch, it would have succeeded, not timed out.
	admin := newClient(t, server.Addr())
	require.NoError(t, admin.Do(ctx, "CLIENT", "PAUSE", "1000", "ALL").Err())
	start := time.Now()
	r, err := th.Allow(ctx, p, "user")
	elapsed := time.Since(start)
	require.NoError(t, err)
	assert.True(t, r.Degraded)
	assert.False(t, r.Allowed)
	assert.ErrorIs(t, r.Err, context.DeadlineExceeded)
	assert.Less(t, elapsed, hangBound, "the call waited for the paused server")

	// A caller that has given up gets its context's error, not a decision.
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = b.Decide(cancelled, throttler.Request{Policy: p, Identifier: "user", Cost: 1, Now: t0})
	assert.ErrorIs(t, err, context.Canceled)
}

// SCRIPT FLUSH in the middle of a run costs no decision: EVALSHA meets
// NOSCRIPT and the same call falls back to EVAL, on every kind of client.
func TestScriptFlushCostsNoDecision(t *testing.T) {
	for _, kind := range clientKinds() {
		t.Run(kind.name, func(t *testing.T) {
			ctx := context.Background()
			client, reader, syncReplicas := kind.client(t)
			flusher, ok := client.(interface {
				ScriptFlush(ctx context.Context) *goredis.StatusCmd
			})
			require.True(t, ok)
			readFlusher, ok := reader.(interface {
				ScriptFlush(ctx context.Context) *goredis.StatusCmd
			})
			require.True(t, ok)
			b := mustBackend(t, client, redis.WithPrefix(newPrefix()), redis.WithReadClient(reader))
			clock := throttler.NewManualClock(t0)
			th := throttler.New(b, throttler.WithClock(clock), throttler.WithObserver(throttler.NopObserver{}),
				throttler.WithTimeout(5*time.Second))
			p := mustPolicy(t, "flush", "1000/min, 10/min gcra burst=1000", throttler.WithFailureMode(throttler.FailClosed))
			for i := range 60 {
				if i%5 == 0 {
					require.NoError(t, flusher.ScriptFlush(ctx).Err())
					require.NoError(t, readFlusher.ScriptFlush(ctx).Err())
				}
				id := fmt.Sprint("user:", i%3)
				r, err := th.Allow(ctx, p, id)
				require.NoError(t, err)
				require.False(t, r.Degraded, "decision %d: %v", i, r.Err)
				require.True(t, r.Allowed)
				_, err = th.Refund(ctx, p, id, 1)
				require.NoError(t, err, "refund %d", i)
				if syncReplicas != nil {
					syncReplicas(t)
				}
				r, err = th.Peek(ctx, p, id)
				require.NoError(t, err)
				require.False(t, r.Degraded, "peek %d: %v", i, r.Err)
			}
		})
	}
}

// A Redis Cluster failover loses no state and costs no decision once the
// cluster has settled: the promoted replica holds the counts, and its empty
// script cache is filled by the EVAL fallback. The test fails back at the
// end, leaving the shared cluster as it found it.
func TestClusterFailoverKeepsCounts(t *testing.T) {
	ctx := context.Background()
	c := cluster(t)
	cc := newClusterClient(t, c, false)
	b := mustBackend(t, cc, redis.WithPrefix(newPrefix()))
	th := throttler.New(b, throttler.WithClock(throttler.NewManualClock(t0)), throttler.WithObserver(throttler.NopObserver{}),
		throttler.WithTimeout(5*time.Second))
	p := mustPolicy(t, "failover", "10/min, 100/h")
	const id = "user:42"
	for i := range 3 {
		r, err := th.Allow(ctx, p, id)
		require.NoError(t, err)
		require.False(t, r.Degraded, "%v", r.Err)
		require.EqualValues(t, 9-i, r.Remaining)
	}
	key := b.Keys(p, id)[0]
	primary, err := cc.MasterForKey(ctx, key)
	require.NoError(t, err)
	replica, err := cc.SlaveForKey(ctx, key)
	require.NoError(t, err)
	require.NotEqual(t, primary.Options().Addr, replica.Options().Addr)
	waitReplicas(primary)(t)

	failover := func(promote, demote *goredis.Client) {
		t.Helper()
		require.NoError(t, promote.Do(ctx, "CLUSTER", "FAILOVER").Err())
		deadline := time.Now().Add(30 * time.Second)
		for {
			role, err := promote.Do(ctx, "ROLE").Slice()
			require.NoError(t, err)
			if role[0] == "master" {
				break
			}
			require.True(t, time.Now().Before(deadline), "%s not promoted", promote.Options().Addr)
			time.Sleep(50 * time.Millisecond)
		}
		require.NoError(t, c.WaitReady(30*time.Second))
		require.NoError(t, c.WaitReplicasSynced(30*time.Second))
	}
	failover(replica, primary)
	t.Cleanup(func() { failover(primary, replica) })

	for i := range 3 {
		r, err := th.Allow(ctx, p, id)
		require.NoError(t, err)
		require.False(t, r.Degraded, "decision %d after the failover: %v", i, r.Err)
		require.EqualValues(t, 6-i, r.Remaining, "decision %d after the failover", i)
	}
}
