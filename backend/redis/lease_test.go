package redisbackend_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

func mustConcurrency(tb testing.TB, name string, max int64, ttl time.Duration) *driver.ConcurrencyLimit {
	tb.Helper()
	l, err := driver.NewConcurrencyLimit(name, max, ttl)
	require.NoError(tb, err)
	return l
}

func TestLeaseKeyLayout(t *testing.T) {
	c := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	b := mustBackend(t, c, redisbackend.WithPrefix("app:"))
	assert.Equal(t, "app:{user%3A42%7B%7D}:lease:up%20loads", b.LeaseKey(mustConcurrency(t, "up loads", 2, time.Minute), "user:42{}"))
	assert.Equal(t, "", b.LeaseKey(nil, "a"))
	var zero *redisbackend.Backend
	assert.Equal(t, "", zero.LeaseKey(mustConcurrency(t, "x", 1, time.Second), "a"))
}

// A lease key shares its identifier's slot with the policy keys, whatever
// bytes the identifier holds, so leases work on a Cluster.
func TestLeaseKeyShareTheIdentifierSlot(t *testing.T) {
	ctx := context.Background()
	cc := newClusterClient(t, cluster(t), false)
	b := mustBackend(t, cc, redisbackend.WithPrefix(newPrefix()))
	l := mustConcurrency(t, "conc", 2, time.Minute)
	for _, id := range []string{"user:42", "{user:42}", "}{", "a{b}c", "\x00\xff{"} {
		want, err := cc.ClusterKeySlot(ctx, driver.EscapeKey(id)).Result()
		require.NoError(t, err)
		got, err := cc.ClusterKeySlot(ctx, b.LeaseKey(l, id)).Result()
		require.NoError(t, err)
		assert.Equal(t, want, got, "identifier %q", id)
		out, err := b.Acquire(ctx, driver.LeaseRequest{Limit: l, Identifier: id, Lease: "x", Now: t0})
		require.NoError(t, err)
		assert.True(t, out.Acquired)
	}
}

// The lease scripts mirror driver.AcquireLease and driver.ReleaseLease: the
// same random sequences through both give the same outcomes and the same
// stored leases, with a clock that jumps forwards and backwards across
// expiries.
func TestLeaseScriptsMirrorGo(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, standalone(t).primary.Addr())
	b := mustBackend(t, c, redisbackend.WithPrefix(newPrefix()))
	rng := rand.New(rand.NewPCG(20300102, 15))
	const sequences, steps = 200, 40
	for seq := range sequences {
		l := mustConcurrency(t, fmt.Sprint("conc-", seq), 1+rng.Int64N(4), time.Duration(1+rng.IntN(3000))*time.Millisecond)
		id := fmt.Sprint("seq:", seq)
		model := map[string]int64{}
		now := t0.Add(time.Duration(rng.IntN(1000)) * time.Microsecond)
		var trail []string
		for range steps {
			req := driver.LeaseRequest{Limit: l, Identifier: id, Lease: fmt.Sprint("lease-", rng.IntN(6)), Now: now}
			var got, want driver.LeaseOutcome
			var err error
			if rng.IntN(3) < 2 {
				trail = append(trail, fmt.Sprintf("acquire %s at %d ms", req.Lease, now.UnixMilli()))
				got, err = b.Acquire(ctx, req)
				want = driver.AcquireLease(l, model, req.Lease, now)
			} else {
				trail = append(trail, fmt.Sprintf("release %s at %d ms", req.Lease, now.UnixMilli()))
				got, err = b.Release(ctx, req)
				want = driver.ReleaseLease(l, model, req.Lease, now)
			}
			require.NoError(t, err)
			require.Equal(t, want, got, "max %d, ttl %v\n%s", l.Max, l.LeaseTTL, strings.Join(trail, "\n"))
			// Stored: the model's leases, and perhaps expired ones a later
			// call drops.
			stored := storedLeases(t, c, b.LeaseKey(l, id))
			maps.DeleteFunc(stored, func(_ string, exp int64) bool { return exp <= now.UnixMilli() })
			require.Equal(t, model, stored, "%s", strings.Join(trail, "\n"))
			now = now.Add(time.Duration(rng.IntN(int(l.TTLMillis)*2)-int(l.TTLMillis)/2) * time.Millisecond)
		}
	}
}

func storedLeases(t *testing.T, c *goredis.Client, key string) map[string]int64 {
	t.Helper()
	zs, err := c.ZRangeWithScores(context.Background(), key, 0, -1).Result()
	require.NoError(t, err)
	out := map[string]int64{}
	for _, z := range zs {
		out[z.Member.(string)] = int64(z.Score)
	}
	return out
}

// One acquisition and one release are one round trip each: one EVALSHA.
func TestOneRoundTripPerLeaseOperation(t *testing.T) {
	ctx := context.Background()
	server := ownRedis(t)
	c := newClient(t, server.Addr())
	th := quiet(t, mustBackend(t, c), throttlertest.NewManualClock(t0))
	l, err := throttler.NewConcurrencyLimit("trip", 3, time.Minute)
	require.NoError(t, err)
	warm, err := th.Acquire(ctx, l, "warm-up")
	require.NoError(t, err)
	require.NoError(t, warm.Release(ctx))
	require.NoError(t, c.ConfigResetStat(ctx).Err())
	for i := range 5 {
		lease, err := th.Acquire(ctx, l, fmt.Sprint("user:", i%2))
		require.NoError(t, err)
		require.True(t, lease.Acquired && !lease.Degraded, "%v", lease.Err)
		require.NoError(t, lease.Release(ctx))
	}
	info, err := c.InfoMap(ctx, "commandstats").Result()
	require.NoError(t, err)
	calls := make(map[string]int64)
	for name, stats := range info["Commandstats"] {
		var n int64
		_, err := fmt.Sscanf(stats, "calls=%d", &n)
		require.NoError(t, err)
		calls[name] = n
	}
	// The client sent nothing but EVALSHA; the rest are the scripts' own
	// commands, counted by Redis too.
	assert.Equal(t, int64(10), calls["cmdstat_evalsha"])
	for name := range calls {
		assert.Contains(t, []string{"cmdstat_evalsha", "cmdstat_config|resetstat", "cmdstat_zremrangebyscore",
			"cmdstat_zscore", "cmdstat_zcard", "cmdstat_zadd", "cmdstat_zrange", "cmdstat_pexpire", "cmdstat_zrem"}, name)
	}
}

// The lease set expires, for garbage collection only, the grace after its
// latest lease, counted from the request's now.
func TestLeaseExpiryFollowsTheLatestLease(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, standalone(t).primary.Addr())
	b := mustBackend(t, c, redisbackend.WithPrefix(newPrefix()), redisbackend.WithExpiryGrace(5*time.Second))
	long := mustConcurrency(t, "conc", 3, 10*time.Minute)
	key := b.LeaseKey(long, "user")
	_, err := b.Acquire(ctx, driver.LeaseRequest{Limit: long, Identifier: "user", Lease: "a", Now: t0})
	require.NoError(t, err)
	// A later acquisition with the same TTL moves the expiry on.
	_, err = b.Acquire(ctx, driver.LeaseRequest{Limit: long, Identifier: "user", Lease: "b", Now: t0.Add(time.Minute)})
	require.NoError(t, err)
	ttl, err := c.PTTL(ctx, key).Result()
	require.NoError(t, err)
	want := 10*time.Minute + 5*time.Second
	assert.LessOrEqual(t, ttl, want)
	assert.Greater(t, ttl, want-2*time.Second)

	// Releasing the last lease leaves no key.
	for _, id := range []string{"a", "b"} {
		_, err = b.Release(ctx, driver.LeaseRequest{Limit: long, Identifier: "user", Lease: id, Now: t0.Add(time.Minute)})
		require.NoError(t, err)
	}
	n, err := c.Exists(ctx, key).Result()
	require.NoError(t, err)
	assert.Zero(t, n)
}

// A lease key holding another type is a foreign value: the script stops
// before writing, and the throttler applies the failure mode.
func TestLeaseForeignValue(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, standalone(t).primary.Addr())
	b := mustBackend(t, c, redisbackend.WithPrefix(newPrefix()))
	dl := mustConcurrency(t, "conc", 2, time.Minute)
	require.NoError(t, c.Set(ctx, b.LeaseKey(dl, "user"), "3", time.Minute).Err())
	for name, call := range map[string]func(context.Context, driver.LeaseRequest) (driver.LeaseOutcome, error){
		"acquire": b.Acquire, "release": b.Release,
	} {
		_, err := call(ctx, driver.LeaseRequest{Limit: dl, Identifier: "user", Lease: "x", Now: t0})
		assert.ErrorIs(t, err, redisbackend.ErrForeignValue, name)
	}
	l, err := throttler.NewConcurrencyLimit("conc", 2, time.Minute, throttler.WithFailureMode(throttler.FailClosed))
	require.NoError(t, err)
	lease, err := quiet(t, b, throttlertest.NewManualClock(t0)).Acquire(ctx, l, "user")
	require.NoError(t, err)
	assert.True(t, lease.Degraded)
	assert.False(t, lease.Acquired)
	assert.ErrorIs(t, lease.Err, redisbackend.ErrForeignValue)
	v, err := c.Get(ctx, b.LeaseKey(dl, "user")).Result()
	require.NoError(t, err)
	assert.Equal(t, "3", v, "nothing written")
}

// Requests a direct caller could get wrong are errors, never sent.
func TestLeaseBadRequests(t *testing.T) {
	ctx := context.Background()
	b := mustBackend(t, goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"}))
	l := mustConcurrency(t, "conc", 1, time.Second)
	for name, req := range map[string]driver.LeaseRequest{
		"nil limit":        {Identifier: "u", Lease: "x", Now: t0},
		"zero limit":       {Limit: &driver.ConcurrencyLimit{}, Identifier: "u", Lease: "x", Now: t0},
		"empty identifier": {Limit: l, Lease: "x", Now: t0},
		"empty lease":      {Limit: l, Identifier: "u", Now: t0},
		"long lease":       {Limit: l, Identifier: "u", Lease: strings.Repeat("x", driver.MaxLeaseIDLen+1), Now: t0},
		"before 1970":      {Limit: l, Identifier: "u", Lease: "x", Now: time.Unix(-1, 0)},
	} {
		for op, call := range map[string]func(context.Context, driver.LeaseRequest) (driver.LeaseOutcome, error){
			"acquire": b.Acquire, "release": b.Release,
		} {
			_, err := call(ctx, req)
			assert.True(t, errors.Is(err, driver.ErrInvalidLimit) || errors.Is(err, driver.ErrInvalidOption), "%s, %s: %v", name, op, err)
		}
	}
	var zero redisbackend.Backend
	_, err := zero.Acquire(ctx, driver.LeaseRequest{Limit: l, Identifier: "u", Lease: "x", Now: t0})
	assert.ErrorIs(t, err, driver.ErrNotInitialized)
}
