package memcachedbackend

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/breaker"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
)

// memcached behind breaker.Wrap, its own breakers off: with the server
// stopped, the open breaker answers by the failure mode without a round
// trip, and the first probe after the restart closes it. The figures are
// logged, not asserted.
func TestBreakerOverStoppedServer(t *testing.T) {
	ctx := context.Background()
	srv := localserverT(t)
	client, err := NewClient(100*time.Millisecond, srv.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close() })
	mc, err := New(client, WithPrefix(freshPrefix()), WithoutBreaker())
	require.NoError(t, err)
	logs, logger := testkit.NewLogs()
	b, err := breaker.Wrap(mc, "memcached "+srv.Addr(), breaker.WithLogger(logger), breaker.WithOpenFor(200*time.Millisecond))
	require.NoError(t, err)
	th := testkit.Throttler(t, b, throttler.WithLogger(logger))
	p := mustPolicy(t, "breaker", "1000000/h")
	r, err := th.Allow(ctx, p, "u")
	require.NoError(t, err)
	require.False(t, r.Degraded, "%v", r.Err)

	require.NoError(t, srv.Stop())
	var fast []time.Duration
	start := time.Now()
	for calls := 0; time.Since(start) < time.Second && calls < 100_000; calls++ {
		t0 := time.Now()
		r, err := th.Allow(ctx, p, "u")
		require.NoError(t, err)
		require.True(t, r.Degraded)
		if errors.Is(r.Err, breaker.ErrOpen) {
			fast = append(fast, time.Since(t0))
		}
	}
	require.NotEmpty(t, fast)
	slices.Sort(fast)
	t.Logf("%d decisions answered by the open breaker: median %v (goal <= 1ms)", len(fast), fast[len(fast)/2])

	require.NoError(t, srv.Start())
	back := time.Now()
	var recovered time.Duration
	for deadline := back.Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		r, err := th.Allow(ctx, p, "u")
		require.NoError(t, err)
		if !r.Degraded {
			recovered = time.Since(back)
			break
		}
	}
	require.NotZero(t, recovered, "still degraded 5s after the restart")
	t.Logf("decided normally %v after the restart (goal <= 1s)", recovered.Round(time.Millisecond))
	assert.Equal(t, breaker.Closed, b.Breaker().State())
	assert.Equal(t, 1, logs.Count(slog.LevelWarn, "circuit breaker opened"))
	assert.Equal(t, 1, logs.Count(slog.LevelInfo, "circuit breaker closed"))
}
