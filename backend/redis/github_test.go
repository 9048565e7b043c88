package redisbackend_test

import (
	"context"
	"fmt"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// GitHub's first fix: the reset time is stored beside the count, so it does
// not wobble. 1000 decisions in one window, from two throttlers whose clocks
// are 700 ms apart, deciding at once, all report one identical ResetAt: the
// end stored by whichever opened the window.
func TestResetAtNeverWobbles(t *testing.T) {
	for _, kind := range []struct {
		name   string
		client func(t *testing.T) redisbackend.Client
	}{
		{"standalone", func(t *testing.T) redisbackend.Client { return newClient(t, standalone(t).primary.Addr()) }},
		{"cluster", func(t *testing.T) redisbackend.Client { return newClusterClient(t, cluster(t), false) }},
		{"autopipeline", func(t *testing.T) redisbackend.Client {
			return newAutoPipeliner(t, newClient(t, standalone(t).primary.Addr()))
		}},
	} {
		t.Run(kind.name, func(t *testing.T) {
			ctx := context.Background()
			prefix := newPrefix()
			p := mustPolicy(t, "core", "5000/h")
			clocks := []*throttlertest.ManualClock{
				throttlertest.NewManualClock(t0),
				throttlertest.NewManualClock(t0.Add(700 * time.Millisecond)),
			}
			const perThrottler = 500
			results := make([][]throttler.Result, len(clocks))
			var wg sync.WaitGroup
			for i, clock := range clocks {
				// Each throttler has its own client, as another host would.
				th := quiet(t, mustBackend(t, kind.client(t), redisbackend.WithPrefix(prefix)), clock)
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range perThrottler {
						r, err := th.Allow(ctx, p, "user:42")
						if err != nil {
							t.Error(err)
							return
						}
						results[i] = append(results[i], r)
						clock.Advance(3 * time.Millisecond)
					}
				}()
			}
			wg.Wait()
			require.False(t, t.Failed())

			resetAt := results[0][0].ResetAt
			assert.Contains(t, []time.Time{t0.Add(time.Hour), t0.Add(time.Hour + 700*time.Millisecond)}, resetAt)
			remaining := make(map[int64]bool)
			for i := range results {
				require.Len(t, results[i], perThrottler)
				for j, r := range results[i] {
					require.False(t, r.Degraded, "%v", r.Err)
					require.True(t, r.Allowed)
					require.True(t, r.ResetAt.Equal(resetAt), "throttler %d, decision %d: ResetAt %v, want %v", i, j, r.ResetAt, resetAt)
					remaining[r.Remaining] = true
				}
			}
			// Exact under concurrency: every count from 4999 down to 4000 once.
			assert.Len(t, remaining, 2*perThrottler)
		})
	}
}

// GitHub's second fix, on a real replica: a peek served by the replica after
// the window closed reports a fresh window, whatever the replica still
// holds; and a denial reports the numbers of the read that denied it.
func TestReplicaPeekIgnoresClosedWindows(t *testing.T) {
	ctx := context.Background()
	s := standalone(t)
	primary, replica := newClient(t, s.primary.Addr()), newClient(t, s.replica.Addr())
	b := mustBackend(t, primary, redisbackend.WithPrefix(newPrefix()), redisbackend.WithReadClient(replica))
	clock := throttlertest.NewManualClock(t0)
	th := quiet(t, b, clock)
	p := mustPolicy(t, "core", "5/min")
	const id = "user:42"

	for i := range 5 {
		r, err := th.Allow(ctx, p, id)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		require.EqualValues(t, 4-i, r.Remaining)
		clock.Advance(time.Second)
	}
	// The denial carries the numbers of the read that denied it: never
	// "rejected, but Remaining: 5".
	denied, err := th.Allow(ctx, p, id)
	require.NoError(t, err)
	assert.False(t, denied.Allowed)
	assert.Zero(t, denied.Remaining)
	assert.EqualValues(t, 5, denied.Used)
	assert.Equal(t, t0.Add(time.Minute), denied.ResetAt)
	assert.Equal(t, denied.ResetAt.Sub(clock.Now()), denied.RetryAfter)

	waitReplicas(primary)(t)
	primaryCalls := commandCalls(t, s.primary.Addr(), "evalsha_ro")
	replicaCalls := commandCalls(t, s.replica.Addr(), "evalsha_ro") + commandCalls(t, s.replica.Addr(), "eval_ro")

	// Within the window the replica reports it (a peek costs nothing, so
	// it is allowed, with nothing remaining).
	clock.Set(t0.Add(30 * time.Second))
	r, err := th.Peek(ctx, p, id)
	require.NoError(t, err)
	assert.True(t, r.Allowed)
	assert.Zero(t, r.Remaining)
	assert.Equal(t, t0.Add(time.Minute), r.ResetAt)

	// The window has closed by the throttler's clock; the key lives on in
	// real time (its TTL runs past the window by the grace), on the
	// primary and on the replica.
	clock.Set(t0.Add(time.Minute))
	for _, c := range []*goredis.Client{primary, replica} {
		held := storedStates(t, c, b, testkit.Compile(t, p), id)
		require.EqualValues(t, 5, held[0].Used, "%+v", held)
	}
	r, err = th.Peek(ctx, p, id)
	require.NoError(t, err)
	assert.True(t, r.Allowed)
	assert.EqualValues(t, 5, r.Remaining)
	assert.Zero(t, r.Used)
	assert.Equal(t, clock.Now().Add(time.Minute), r.ResetAt)

	// The replica served both peeks (a third call when its script cache
	// was empty: EVALSHA_RO, then EVAL_RO); the primary none.
	assert.Equal(t, primaryCalls, commandCalls(t, s.primary.Addr(), "evalsha_ro"))
	assert.GreaterOrEqual(t,
		commandCalls(t, s.replica.Addr(), "evalsha_ro")+commandCalls(t, s.replica.Addr(), "eval_ro"), replicaCalls+2)

	// The next decision opens that fresh window on the primary.
	r, err = th.Allow(ctx, p, id)
	require.NoError(t, err)
	assert.True(t, r.Allowed)
	assert.EqualValues(t, 4, r.Remaining)
	assert.Equal(t, clock.Now().Add(time.Minute), r.ResetAt)
}

// What a replica does once a key's real TTL has passed while its primary
// still holds the key (active expiry off, nobody touching the key on the
// primary): the replica still holds the key, but Redis 7 replicas hide
// logically expired keys from reads, so the peek sees no state at all. Either way the peek reports a fresh window.
// This is the one test that waits on real time: a TTL cannot be sped up.
func TestReplicaPeekAfterRealExpiry(t *testing.T) {
	ctx := context.Background()
	s := standalone(t)
	primary, replica := newClient(t, s.primary.Addr()), newClient(t, s.replica.Addr())
	require.NoError(t, primary.Do(ctx, "DEBUG", "SET-ACTIVE-EXPIRE", "0").Err())
	t.Cleanup(func() { _ = primary.Do(context.Background(), "DEBUG", "SET-ACTIVE-EXPIRE", "1").Err() })
	// The shortest grace the backend accepts, so that the wait is short.
	b := mustBackend(t, primary, redisbackend.WithPrefix(newPrefix()), redisbackend.WithReadClient(replica),
		redisbackend.WithExpiryGrace(time.Second))
	start := time.Now()
	clock := throttlertest.NewManualClock(start)
	th := quiet(t, b, clock)
	p := mustPolicy(t, "short", "3/10ms")
	const id = "user:7"
	for range 3 {
		_, err := th.Allow(ctx, p, id)
		require.NoError(t, err)
	}
	key := b.Key(testkit.Compile(t, p), id)
	waitReplicas(primary)(t)

	// Wait (bounded) until the replica stops returning the key: its TTL,
	// 10 ms plus the one-second grace, has passed.
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := replica.Exists(ctx, key).Result()
		require.NoError(t, err)
		if n == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the replica still returns %s", key)
		time.Sleep(50 * time.Millisecond)
	}
	assert.GreaterOrEqual(t, time.Since(start), time.Second, "expired before the grace second")
	// Both still hold it: DEBUG OBJECT looks a key up without expiring it.
	for _, c := range []*goredis.Client{primary, replica} {
		assert.NoError(t, c.Do(ctx, "DEBUG", "OBJECT", key).Err(), c.Options().Addr)
	}

	clock.Set(time.Now())
	r, err := th.Peek(ctx, p, id)
	require.NoError(t, err)
	assert.True(t, r.Allowed)
	assert.EqualValues(t, 3, r.Remaining)
}

// Peeks go to the read client: a replica of a standalone primary, or the
// replicas of a cluster through a ReadOnly cluster client.
func TestPeeksGoToReplicas(t *testing.T) {
	ctx := context.Background()
	roCalls := func(t *testing.T, addrs []string) int64 {
		var n int64
		for _, a := range addrs {
			n += commandCalls(t, a, "evalsha_ro") + commandCalls(t, a, "eval_ro")
		}
		return n
	}
	t.Run("cluster", func(t *testing.T) {
		c := cluster(t)
		var primaries, replicas []string
		for _, addr := range c.Addrs() {
			cl := newClient(t, addr)
			role, err := cl.Do(ctx, "ROLE").Slice()
			require.NoError(t, err)
			if role[0] == "master" {
				primaries = append(primaries, addr)
			} else {
				replicas = append(replicas, addr)
			}
		}
		require.Len(t, primaries, 3)
		require.Len(t, replicas, 3)
		b := mustBackend(t, newClusterClient(t, c, false), redisbackend.WithPrefix(newPrefix()),
			redisbackend.WithReadClient(newClusterClient(t, c, true)))
		th := quiet(t, b, throttlertest.NewManualClock(t0))
		p := mustPolicy(t, "reads", "10/min, 100/h")
		before, beforePrimaries := roCalls(t, replicas), roCalls(t, primaries)
		const peeks = 30
		for i := range peeks {
			id := fmt.Sprint("user:", i)
			_, err := th.Allow(ctx, p, id)
			require.NoError(t, err)
			r, err := th.Peek(ctx, p, id)
			require.NoError(t, err)
			require.False(t, r.Degraded, "%v", r.Err)
		}
		// At least one call per peek (two when a replica's script cache
		// was empty: EVALSHA_RO, then EVAL_RO).
		assert.GreaterOrEqual(t, roCalls(t, replicas)-before, int64(peeks))
		assert.Equal(t, beforePrimaries, roCalls(t, primaries))
	})
}
