package memcachedbackend

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/breaker"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// TestBreakerOptions checks which clients get breakers: a client of
// NewClient by default, one of memcache.NewFromSelector with WithSelector,
// none otherwise (and WithBreaker is then an error); WithoutBreaker turns
// them off.
func TestBreakerOptions(t *testing.T) {
	client, err := NewClient(time.Second, "127.0.0.1:1", "127.0.0.1:2")
	require.NoError(t, err)
	b, err := New(client)
	require.NoError(t, err)
	assert.NotNil(t, b.breakers)
	assert.Empty(t, b.Breakers(), "made on first use")

	b, err = New(client, WithoutBreaker())
	require.NoError(t, err)
	assert.Nil(t, b.Breakers())
	assert.Nil(t, b.breakers)

	_, err = New(client, WithBreaker(breaker.WithFailures(0)))
	assert.ErrorIs(t, err, driver.ErrInvalidOption)

	// A client the backend cannot see the placement of.
	plain := memcache.New("127.0.0.1:1")
	b, err = New(plain)
	require.NoError(t, err)
	assert.Nil(t, b.Breakers())
	_, err = New(plain, WithBreaker())
	assert.ErrorIs(t, err, driver.ErrInvalidOption)
	_, err = New(plain, WithSelector(nil))
	assert.ErrorIs(t, err, driver.ErrInvalidOption)

	sel, err := NewRendezvousSelector("127.0.0.1:1")
	require.NoError(t, err)
	b, err = New(memcache.NewFromSelector(sel), WithSelector(sel), WithBreaker())
	require.NoError(t, err)
	assert.NotNil(t, b.breakers)
}

// TestBreakerPerServer runs against three real servers, one of which is
// stopped: its breaker opens and answers its identifiers' calls without a
// round trip, the other two stay closed and decide on, Ping reports the
// open breaker, the breaker logs where the throttler does, and the first
// probe after the restart closes it.
func TestBreakerPerServer(t *testing.T) {
	ctx := context.Background()
	srvs := make([]string, 3)
	lost := localserverT(t)
	srvs[0] = lost.Addr()
	copy(srvs[1:], sharedAddrs(t, 2))
	client, err := NewClient(100*time.Millisecond, srvs...)
	require.NoError(t, err)
	b, err := New(client, WithPrefix(freshPrefix()), WithBreaker(breaker.WithOpenFor(100*time.Millisecond)))
	require.NoError(t, err)
	t.Cleanup(b.CloseIdleConnections)
	logs, logger := testkit.NewLogs()
	th := testkit.Throttler(t, b, throttler.WithLogger(logger), throttler.WithCallTimeout(time.Second))
	p := mustPolicy(t, "per-server", "1000000/h")
	dp := testkit.Compile(t, p)

	// An identifier on each server.
	ids := make([]string, len(srvs))
	for i, found := 0, 0; found < len(srvs) && i < 10_000; i++ {
		id := fmt.Sprintf("user:%d", i)
		addr, err := b.selector.PickServer(newKeys(b.prefix, dp, id).route)
		require.NoError(t, err)
		for s := range srvs {
			if addr.String() == srvs[s] && ids[s] == "" {
				ids[s] = id
				found++
			}
		}
	}
	for s, id := range ids {
		require.NotEmpty(t, id, "no identifier on server %d", s)
		r, err := th.Allow(ctx, p, id)
		require.NoError(t, err)
		require.False(t, r.Degraded, "%v", r.Err)
	}
	require.NoError(t, b.Ping(ctx))
	assert.Len(t, b.Breakers(), 3)

	require.NoError(t, lost.Stop())
	var answered bool
	for deadline := time.Now().Add(5 * time.Second); !answered && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		r, err := th.Allow(ctx, p, ids[0])
		require.NoError(t, err)
		require.True(t, r.Degraded)
		answered = errors.Is(r.Err, breaker.ErrOpen)
		for _, id := range ids[1:] {
			r, err := th.Allow(ctx, p, id)
			require.NoError(t, err)
			require.False(t, r.Degraded, "%v", r.Err)
		}
	}
	require.True(t, answered, "the stopped server's breaker never opened")
	before := b.Stats().RoundTrips
	r, err := th.Allow(ctx, p, ids[0])
	require.NoError(t, err)
	assert.ErrorIs(t, r.Err, breaker.ErrOpen)
	assert.Contains(t, r.Err.Error(), lost.Addr(), "the error names the server")
	assert.Equal(t, before, b.Stats().RoundTrips, "answered without a round trip")
	assert.ErrorIs(t, b.Ping(ctx), breaker.ErrOpen)
	for _, st := range b.Breakers() {
		if st.Server == lost.Addr() {
			assert.Equal(t, breaker.Open, st.State)
			assert.NotZero(t, st.Rejected)
		} else {
			assert.Equal(t, breaker.Closed, st.State, st.Server)
		}
	}
	assert.Equal(t, 1, logs.Count(slog.LevelWarn, "circuit breaker opened"))

	require.NoError(t, lost.Start())
	var normal bool
	for deadline := time.Now().Add(5 * time.Second); !normal && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		r, err := th.Allow(ctx, p, ids[0])
		require.NoError(t, err)
		normal = !r.Degraded
	}
	require.True(t, normal, "the restarted server's identifiers still degraded 5 s on")
	assert.Equal(t, 1, logs.Count(slog.LevelInfo, "circuit breaker closed"))
}
