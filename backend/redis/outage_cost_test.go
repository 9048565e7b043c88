package redisbackend_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/breaker"
	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/internal/localserver"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
)

// TestOutageCostAndCause: with Redis stopped (connection refused) or hung
// (SIGSTOP: no reply), under the production call timeout, a decision
// costs microseconds with the default options, whose breakers open, and
// the whole call timeout with WithoutBreaker; either way the degraded
// result keeps the cause beside the deadline. The figures are logged
// (docs/DESIGN.md, Outages); the assertion on the cost is a millisecond,
// far from both, so that a loaded machine holds.
func TestOutageCostAndCause(t *testing.T) {
	ctx := context.Background()
	for _, fault := range []string{"stopped", "paused"} {
		for _, side := range []string{"default (breaker on)", "WithoutBreaker"} {
			t.Run(fault+", "+side, func(t *testing.T) {
				server := localserver.RedisT(t, localserver.RedisOptions{})
				opts := []redisbackend.Option{redisbackend.WithPrefix(newPrefix())}
				if side == "WithoutBreaker" {
					opts = append(opts, redisbackend.WithoutBreaker())
				}
				b := mustBackend(t, ctxClient(t, server.Addr()), opts...)
				th := testkit.Throttler(t, b, throttler.WithLogger(nil))
				p := mustPolicy(t, "outage", "1000000/h")
				r, err := th.Allow(ctx, p, "u")
				require.NoError(t, err)
				require.False(t, r.Degraded, "%v", r.Err)
				if fault == "stopped" {
					require.NoError(t, server.Stop())
				} else {
					require.NoError(t, server.Pause())
					t.Cleanup(func() { _ = server.Resume() })
				}
				var open, waited []time.Duration
				var first error
				refused := 0
				start := time.Now()
				for calls := 0; time.Since(start) < 1500*time.Millisecond && calls < 200_000; calls++ {
					began := time.Now()
					r, err := th.Allow(ctx, p, "u")
					took := time.Since(began)
					require.NoError(t, err)
					require.True(t, r.Degraded)
					if errors.Is(r.Err, breaker.ErrOpen) {
						open = append(open, took)
						continue
					}
					waited = append(waited, took)
					if first == nil {
						first = r.Err
					}
					// The cause beside the deadline, on every call that
					// reached the network.
					assert.ErrorIs(t, r.Err, throttler.ErrBackend)
					if fault == "stopped" {
						// A call may still be reading from a pooled connection
						// when the server stops; on a loaded machine its
						// deadline can pass before the reset arrives, and its
						// cause is then that no reply came. Every other call
						// meets a refused dial.
						if errors.Is(r.Err, syscall.ECONNREFUSED) {
							refused++
						} else {
							require.ErrorIs(t, r.Err, os.ErrDeadlineExceeded, "%v", r.Err)
						}
					} else {
						require.ErrorIs(t, r.Err, os.ErrDeadlineExceeded, "%v", r.Err)
						require.ErrorIs(t, r.Err, context.DeadlineExceeded, "%v", r.Err)
					}
				}
				if fault == "stopped" && side == "WithoutBreaker" {
					// every call of the outage reaches the network: most
					// meet the refused dial (with the breaker on, a few
					// calls open it, and they may all have been on the
					// pooled connection)
					require.Positive(t, refused, "no call met the refused dial")
				}
				slices.Sort(open)
				slices.Sort(waited)
				t.Logf("%s, %s: %d calls that waited for the network (median %v), %d answered by an open breaker (median %v, p99 %v); the first error: %v",
					fault, side, len(waited), pick(waited, 50), len(open), pick(open, 50), pick(open, 99), first)
				if side == "WithoutBreaker" {
					assert.Empty(t, open)
					return
				}
				require.NotEmpty(t, open, "the default breaker opened")
				assert.Less(t, pick(open, 50), time.Millisecond, "an open breaker answers in microseconds")
				assert.Greater(t, len(open), 10*len(waited), "most decisions of the outage cost microseconds")
			})
		}
	}
}

// pick returns the percentile q of sorted, 0 for none.
func pick(sorted []time.Duration, q int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)*q/100, len(sorted)-1)]
}
