package redisbackend_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/breaker"
	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

func TestWithBreakerRejectsUnsupportedClients(t *testing.T) {
	c := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = c.Close() })
	ap, err := c.AutoPipeline()
	require.NoError(t, err)
	_, err = redisbackend.New(ap, redisbackend.WithBreaker())
	assert.ErrorIs(t, err, driver.ErrInvalidOption)
	_, err = redisbackend.New(c, redisbackend.WithBreaker(breaker.WithFailures(0)))
	assert.ErrorIs(t, err, driver.ErrInvalidOption)
}

// median returns the middle of ds (which it sorts).
func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// The store stopped, then hung, then back: with the breaker open a decision
// is answered by its failure mode without waiting for the per-call timeout,
// the breaker closes on the first probe once the server is back, and the
// logs have one line per state change, not one per request. The figures
// (median decision time while open, recovery after the restart) are logged,
// not asserted: the machine is shared.
func TestBreakerStoreStoppedAndRestarted(t *testing.T) {
	for _, fault := range []string{"killed", "hung"} {
		t.Run(fault, func(t *testing.T) {
			ctx := context.Background()
			server := ownRedis(t)
			client := goredis.NewClient(&goredis.Options{Addr: server.Addr(), ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = client.Close() })
			logs, logger := testkit.NewLogs()
			b := mustBackend(t, client, redisbackend.WithPrefix(newPrefix()),
				redisbackend.WithBreaker(breaker.WithLogger(logger), breaker.WithOpenFor(200*time.Millisecond)))
			th := testkit.Throttler(t, b, throttler.WithLogger(logger))
			p := mustPolicy(t, "breaker", "1000000/h")
			r, err := th.Allow(ctx, p, "user")
			require.NoError(t, err)
			require.False(t, r.Degraded, "%v", r.Err)

			const outage = 2 * time.Second
			switch fault {
			case "killed":
				server.Kill()
			case "hung":
				pause(t, server, outage)
			}
			start := time.Now()
			var open []time.Duration
			calls, slow := 0, 0
			for time.Since(start) < outage-300*time.Millisecond && calls < 200_000 {
				t0 := time.Now()
				r, err := th.Allow(ctx, p, "user")
				d := time.Since(t0)
				require.NoError(t, err)
				require.True(t, r.Degraded)
				require.True(t, r.Allowed, "fail open")
				calls++
				if errors.Is(r.Err, breaker.ErrOpen) {
					open = append(open, d)
				} else {
					slow++
				}
			}
			require.Equal(t, breaker.Open, b.Breakers()[0].State)
			require.NotEmpty(t, open, "the breaker never answered")
			t.Logf("%s: %d decisions in %v, %d reached the server (failures and probes), %d answered by the open breaker: median %v (goal <= 1ms)",
				fault, calls, time.Since(start).Round(time.Millisecond), slow, len(open), median(open))

			if fault == "killed" {
				require.NoError(t, server.Start())
			} else {
				time.Sleep(time.Until(start.Add(outage))) // the pause ends
			}
			back := time.Now()
			var recovered time.Duration
			for deadline := back.Add(recoveryBound); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
				r, err := th.Allow(ctx, p, "user")
				require.NoError(t, err)
				if !r.Degraded {
					recovered = time.Since(back)
					break
				}
				if !errors.Is(r.Err, breaker.ErrOpen) {
					t.Logf("probe: %v", r.Err)
				}
			}
			require.NotZero(t, recovered, "still degraded %v after the server came back", recoveryBound)
			t.Logf("%s: decided normally %v after the server came back (goal <= 1s)", fault, recovered.Round(time.Millisecond))
			assert.Equal(t, breaker.Closed, b.Breakers()[0].State)

			// The throttler logs the recovery once calls have succeeded for
			// a second without a failure.
			for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline) &&
				logs.Count(slog.LevelInfo, "backend recovered") == 0; time.Sleep(20 * time.Millisecond) {
				r, err := th.Allow(ctx, p, "user")
				require.NoError(t, err)
				require.False(t, r.Degraded, "%v", r.Err)
			}
			assert.Equal(t, 1, logs.Count(slog.LevelWarn, "circuit breaker opened"))
			assert.Equal(t, 1, logs.Count(slog.LevelInfo, "circuit breaker closed"))
			assert.Equal(t, 1, logs.Count(slog.LevelWarn, "backend failing"))
			assert.Equal(t, 1, logs.Count(slog.LevelInfo, "backend recovered"))
			lines := len(logs.Records()) - logs.Count(slog.LevelDebug, "") + logs.Count(slog.LevelInfo, "")
			t.Logf("%s: %d log lines at info and above for %d failed decisions", fault, lines, calls)
			assert.Less(t, lines, 10, "an outage is logged by state changes, not per request")
		})
	}
}

// A 10 s outage of the store with FailLocal: the throttler decides in
// process on this process's share of the policy (100/min over 4 processes:
// 25), so an abusive identifier gets at most that share however hard it
// pushes, and every other identifier passes. With the breaker open each of
// those decisions costs microseconds. After the restart, decisions go to
// the store again.
func TestLocalFallbackDuringOutage(t *testing.T) {
	ctx := context.Background()
	server := ownRedis(t)
	client := goredis.NewClient(&goredis.Options{Addr: server.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = client.Close() })
	b := mustBackend(t, client, redisbackend.WithPrefix(newPrefix()), redisbackend.WithBreaker(breaker.WithLogger(nil)))
	th := testkit.Throttler(t, b, throttler.WithLogger(nil), throttler.WithFailureMode(throttler.FailLocal),
		throttler.WithLocalFallback(memorybackend.New(), 4))
	// A window far longer than the test, so that the share is spent once.
	p := mustPolicy(t, "fallback", "100/h")
	r, err := th.Allow(ctx, p, "abuser")
	require.NoError(t, err)
	require.False(t, r.Degraded, "%v", r.Err)

	server.Kill()
	const outage = 10 * time.Second
	start := time.Now()
	abuserAllowed, abuserCalls, others, othersDenied, remote := 0, 0, 0, 0, 0
	for time.Since(start) < outage && abuserCalls < 50_000 {
		r, err := th.Allow(ctx, p, "abuser")
		require.NoError(t, err)
		abuserCalls++
		if !r.Local {
			remote++ // failures before the breaker opened were decided locally too
		}
		if r.Allowed {
			abuserAllowed++
		}
		if abuserCalls%100 == 0 {
			r, err := th.Allow(ctx, p, fmt.Sprintf("user:%d", others))
			require.NoError(t, err)
			others++
			if !r.Allowed {
				othersDenied++
			}
		}
		time.Sleep(100 * time.Microsecond)
	}
	t.Logf("outage of %v: the abuser made %d requests and was allowed %d (its share: 25 of 100/h over 4 processes); %d other identifiers, %d denied",
		time.Since(start).Round(time.Millisecond), abuserCalls, abuserAllowed, others, othersDenied)
	assert.Zero(t, remote, "every decision during the outage is local")
	assert.Equal(t, 25, abuserAllowed, "the abuser gets this process's share and no more")
	assert.Zero(t, othersDenied, "others pass")
	assert.Positive(t, others)

	require.NoError(t, server.Start())
	var back bool
	for deadline := time.Now().Add(recoveryBound); time.Now().Before(deadline) && !back; time.Sleep(5 * time.Millisecond) {
		r, err := th.Allow(ctx, p, "after")
		require.NoError(t, err)
		back = !r.Degraded && !r.Local
	}
	assert.True(t, back, "decisions go to the store again after the restart")
}
