package redisbackend_test

import (
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/conformance"
	"github.com/throttlekit/throttlekit/internal/localserver"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// sentinelMasterName is the name the sentinels of these tests monitor their
// primary under.
const sentinelMasterName = "throttlekit"

// sentinelFailoverBound bounds the wait for a Sentinel failover and for the
// failover client to follow it: about 3 s on an idle machine, the rest is
// headroom for a loaded one.
const sentinelFailoverBound = 30 * time.Second

// sentinelSetup is a primary, its replica and a Sentinel watching them,
// owned by one test.
type sentinelSetup struct {
	primary, replica *localserver.Redis
	sentinel         *localserver.RedisSentinel
}

// startSentinelSetup starts a sentinelSetup that the test's cleanup closes.
// The replica starts before the sentinel, which must see it to fail over.
func startSentinelSetup(tb testing.TB) sentinelSetup {
	tb.Helper()
	primary := localserver.RedisT(tb, localserver.RedisOptions{})
	replica := localserver.RedisReplicaT(tb, primary, localserver.RedisOptions{})
	s := localserver.RedisSentinelT(tb, primary, sentinelMasterName, localserver.RedisOptions{})
	return sentinelSetup{primary: primary, replica: replica, sentinel: s}
}

// newSentinelFailoverClient returns a go-redis failover client that finds
// the primary through s's sentinel, closed by the test's cleanup.
func newSentinelFailoverClient(tb testing.TB, s sentinelSetup) *goredis.Client {
	c := goredis.NewFailoverClient(&goredis.FailoverOptions{
		MasterName:    s.sentinel.MasterName(),
		SentinelAddrs: []string{s.sentinel.Addr()},
		// The backend then leaves deadlines to the client rather than
		// running each call on a goroutine of its own.
		ContextTimeoutEnabled: true,
	})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}

var sentinelPrefixes atomic.Int64

// newSentinelPrefix returns a key prefix no other test of this binary uses.
func newSentinelPrefix() string {
	return fmt.Sprintf("tks%d-%d:", os.Getpid(), sentinelPrefixes.Add(1))
}

// sentinelHarness makes backends over one shared failover client with one
// prefix: the backends of a subtest share state, as processes sharing the
// primary do.
type sentinelHarness struct {
	client redisbackend.Client
	prefix string
	opts   []redisbackend.Option // besides the prefix
}

func (h *sentinelHarness) MakeBackend(context.Context) (driver.Backend, error) {
	return redisbackend.New(h.client, append([]redisbackend.Option{redisbackend.WithPrefix(h.prefix)}, h.opts...)...)
}

// Close leaves the client open: the test that made it owns it.
func (h *sentinelHarness) Close() {}

// TestSentinelFailoverClient shows that a go-redis Sentinel failover client
// is a full client of the backend: it passes the conformance suite, and an
// identifier's counts survive a real Sentinel failover, decided through the
// promoted replica as soon as the client follows it.
func TestSentinelFailoverClient(t *testing.T) {
	t.Run("conformance", func(t *testing.T) {
		t.Parallel()
		client := newSentinelFailoverClient(t, startSentinelSetup(t))
		// batching on (the default), then one call per round trip
		for _, opts := range [][]redisbackend.Option{nil, {redisbackend.WithoutBatching()}} {
			conformance.Run(t, func(context.Context, testing.TB) (conformance.Harness, error) {
				return &sentinelHarness{client: client, prefix: newSentinelPrefix(), opts: opts}, nil
			})
		}
	})
	t.Run("failover", func(t *testing.T) {
		t.Parallel()
		testSentinelFailoverKeepsCounts(t)
	})
}

// testSentinelFailoverKeepsCounts decides a few times for an identifier,
// stops the primary, and checks that once the sentinel has promoted the
// replica the decisions carry on from the same count in the same window.
func testSentinelFailoverKeepsCounts(t *testing.T) {
	ctx := context.Background()
	s := startSentinelSetup(t)
	client := newSentinelFailoverClient(t, s)
	b, err := redisbackend.New(client, redisbackend.WithPrefix(newSentinelPrefix()))
	require.NoError(t, err)
	clock := throttlertest.NewManualClock(conformance.T0)
	// The per-call timeout is generous so that a decision after the
	// failover is never degraded by a slow machine. During the outage a call
	// may take up to that long: go-redis retries refused dials with backoff.
	th := testkit.Throttler(t, b, throttler.WithClock(clock), throttler.WithLogger(nil),
		throttler.WithCallTimeout(5*time.Second))
	p, err := throttler.ParsePolicy("sentinel-failover", "10/h fixed")
	require.NoError(t, err)
	const id = "user:42"

	const before = 4
	var resetAt time.Time
	for i := range before {
		r, err := th.Allow(ctx, p, id)
		require.NoError(t, err)
		require.False(t, r.Degraded, "decision %d: %v", i, r.Err)
		require.True(t, r.Allowed, "decision %d", i)
		require.EqualValues(t, i+1, r.Used, "decision %d", i)
		if i == 0 {
			resetAt = r.ResetAt
		}
		require.Equal(t, resetAt, r.ResetAt, "decision %d", i)
		clock.Advance(time.Minute)
	}
	require.NoError(t, s.replica.WaitReplicaSynced(10*time.Second))

	require.NoError(t, s.primary.Stop())
	stopped := time.Now()

	// Keep deciding, for another identifier, as a live service would, until
	// the client finds the promoted replica by itself. Degraded attempts
	// (which might or might not have run on a server) then never muddle the
	// counts under test.
	deadline := stopped.Add(sentinelFailoverBound)
	var slowest time.Duration
	for attempt := 1; ; attempt++ {
		start := time.Now()
		r, err := th.Allow(ctx, p, "probe")
		require.NoError(t, err)
		if !r.Degraded {
			t.Logf("decided through the promoted replica %v after the primary stopped, after %d degraded decisions (slowest %v)",
				time.Since(stopped), attempt-1, slowest)
			break
		}
		slowest = max(slowest, time.Since(start))
		require.True(t, time.Now().Before(deadline),
			"failover client still degraded %v after the primary stopped: %v%s", sentinelFailoverBound, r.Err,
			sentinelState(s))
		time.Sleep(50 * time.Millisecond)
	}
	master, err := s.sentinel.MasterAddr()
	require.NoError(t, err)
	require.Equal(t, s.replica.Addr(), master, "the sentinel's master once decisions succeed again")

	peek, err := th.Peek(ctx, p, id)
	require.NoError(t, err)
	require.False(t, peek.Degraded, "peek after the failover: %v", peek.Err)
	require.EqualValues(t, before, peek.Used, "peek after the failover")
	require.Equal(t, resetAt, peek.ResetAt, "peek after the failover")

	for i := before; i < 10; i++ {
		r, err := th.Allow(ctx, p, id)
		require.NoError(t, err)
		require.False(t, r.Degraded, "decision %d after the failover: %v", i, r.Err)
		require.True(t, r.Allowed, "decision %d after the failover", i)
		require.EqualValues(t, i+1, r.Used, "decision %d after the failover", i)
		require.Equal(t, resetAt, r.ResetAt, "decision %d after the failover", i)
		clock.Advance(time.Minute)
	}
	r, err := th.Allow(ctx, p, id)
	require.NoError(t, err)
	require.False(t, r.Degraded, "%v", r.Err)
	require.False(t, r.Allowed, "the 11th decision of the window")
	require.Equal(t, resetAt.Sub(clock.Now()), r.RetryAfter)

	// Redis 7 replicates a script's effects, not the script, so the promoted
	// replica started with an empty script cache; the calls above went
	// through go-redis's EVALSHA-then-EVAL fallback.
	promoted := goredis.NewClient(&goredis.Options{Addr: s.replica.Addr()})
	defer promoted.Close()
	stats, err := promoted.InfoMap(ctx, "commandstats").Result()
	require.NoError(t, err)
	for _, cmd := range []string{"evalsha", "eval", "evalsha_ro", "eval_ro"} {
		t.Logf("promoted replica: %s %s", cmd, stats["Commandstats"]["cmdstat_"+cmd])
	}
}

// sentinelState describes, for a failure message, what the sentinel thinks
// the master is.
func sentinelState(s sentinelSetup) string {
	master, err := s.sentinel.MasterAddr()
	if err != nil {
		return fmt.Sprintf("\nsentinel: %v", err)
	}
	return fmt.Sprintf("\nsentinel reports master %s (primary %s, replica %s)", master, s.primary.Addr(), s.replica.Addr())
}
