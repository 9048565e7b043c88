package legacybackend_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	legacybackend "github.com/throttlekit/throttlekit/backend/legacy"
	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// migrate returns a throttler deciding on a fresh memory store behind a
// split rollout at 100 % from old, with seeding (the defaults), on a
// manual clock at t0.
func migrate(t *testing.T, old driver.Backend) (*throttler.Throttler, *throttlertest.ManualClock) {
	t.Helper()
	all, err := rollout.NewStaticSource(100)
	require.NoError(t, err)
	rb, err := rollout.New(old, memorybackend.New(), all)
	require.NoError(t, err)
	clock := throttlertest.NewManualClock(t0)
	th, err := throttler.New(rb, throttler.WithClock(clock), throttler.WithCallTimeout(testTimeout))
	require.NoError(t, err)
	return th, clock
}

// requireRemaining decides one request and checks its verdict, remaining
// count and reset time.
func requireRemaining(t *testing.T, th *throttler.Throttler, p *throttler.Policy, id string, allowed bool, remaining int64, reset time.Time) {
	t.Helper()
	r, err := th.Allow(context.Background(), p, id)
	require.NoError(t, err)
	require.False(t, r.Degraded, "%v", r.Err)
	require.Equal(t, allowed, r.Allowed)
	require.Equal(t, remaining, r.Remaining)
	require.True(t, reset.Equal(r.ResetAt), "reset %v, want %v", r.ResetAt, reset)
}

// A rollout seeds the new store from the live legacy memcached counter:
// the window goes on where the old code left it, same end, same count.
func TestRolloutSeedsFromLegacyMemcached(t *testing.T) {
	c := memcachedClient(t)
	prefix := freshPrefix()
	old := newMemcached(t, c, time.Hour, legacybackend.WithKeyFunc(prefixed(prefix)))
	th, clock := migrate(t, old)
	p, err := throttler.ParsePolicy("api", "10/s, 5/h")
	require.NoError(t, err)

	// The old code opened the window 20 minutes ago and counted 3.
	opened := t0.Add(-20 * time.Minute)
	for range 3 {
		legacyHit(t, c, prefix+"user:42", opened, time.Hour)
	}
	reset := time.Unix(opened.Add(time.Hour).Unix(), 0)
	requireRemaining(t, th, p, "user:42", true, 1, reset)
	clock.Advance(time.Minute)
	requireRemaining(t, th, p, "user:42", true, 0, reset)
	clock.Advance(time.Minute)
	requireRemaining(t, th, p, "user:42", false, 0, reset)

	// An identifier the old code never counted starts afresh.
	requireRemaining(t, th, p, "user:7", true, 4, clock.Now().Add(time.Hour))

	// The legacy counter was read, never written.
	it, err := c.Get(prefix + "user:42")
	require.NoError(t, err)
	require.Equal(t, "3", string(it.Value))
	require.Equal(t, uint64(1), old.Stats().Found)
}

// The same from a Redis INCR+EXPIRE counter: the window ends where the
// key's TTL says, read once.
func TestRolloutSeedsFromLegacyRedis(t *testing.T) {
	c := redisClient(t)
	prefix := freshPrefix()
	old := newRedis(t, c, legacybackend.WithKeyFunc(prefixed(prefix)), legacybackend.WithWindow(time.Hour))
	th, clock := migrate(t, old)
	p, err := throttler.ParsePolicy("api", "10/s, 5/h")
	require.NoError(t, err)
	key := prefix + "user:42"
	for range 3 {
		legacyIncr(t, c, key, time.Hour)
	}

	before := pttl(t, c, key)
	r, err := th.Allow(context.Background(), p, "user:42")
	require.NoError(t, err)
	after := pttl(t, c, key)
	require.True(t, r.Allowed)
	require.Equal(t, int64(1), r.Remaining)
	end := r.ResetAt.UnixMilli()
	require.GreaterOrEqual(t, end, t0.UnixMilli()+after)
	require.LessOrEqual(t, end, t0.UnixMilli()+before)

	// Later decisions keep that end, read once.
	clock.Advance(time.Minute)
	requireRemaining(t, th, p, "user:42", true, 0, time.UnixMilli(end))
	requireRemaining(t, th, p, "user:42", false, 0, time.UnixMilli(end))
	require.Equal(t, legacybackend.Stats{Reads: 1, Found: 1}, old.Stats())
}
