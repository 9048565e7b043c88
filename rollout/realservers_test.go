package rollout

import (
	"context"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	memcachedbackend "github.com/throttlekit/throttlekit/backend/memcached"
	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	redisgroups "github.com/throttlekit/throttlekit/backend/redis/groups"
	"github.com/throttlekit/throttlekit/internal/localserver"
	"github.com/throttlekit/throttlekit/internal/redislayout2"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// TestMirrorMemcachedToRedis migrates from memcached (old) to Redis (new) on
// real servers, the way an operator would: mirror at 50%, then move
// everything to Redis mid-window, then back, and check that no identifier's
// window is reset or its quota doubled by either move; finally a shadow
// pass finds the two stores in agreement.
func TestMirrorMemcachedToRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real servers")
	}
	mc := localserver.MemcachedT(t, localserver.MemcachedOptions{})
	rd := localserver.RedisT(t, localserver.RedisOptions{})

	mcClient, err := memcachedbackend.NewClient(time.Second, mc.Addr())
	require.NoError(t, err)
	oldB, err := memcachedbackend.New(mcClient, memcachedbackend.WithPrefix("rollout-test"))
	require.NoError(t, err)
	rdClient := goredis.NewClient(&goredis.Options{Addr: rd.Addr()})
	t.Cleanup(func() { _ = rdClient.Close() })
	newB, err := redisbackend.New(rdClient, redisbackend.WithPrefix("rollout-test:"))
	require.NoError(t, err)

	src := mustStatic(t, 50)
	rb := mustRollout(t, oldB, newB, src, WithMode(MirrorMode))
	// Windows of a minute and more: TTLs on the servers run on real time.
	clock := throttlertest.NewManualClock(t0)
	ctx := context.Background()
	// A generous per-call timeout: a slow -race run must never turn into a
	// degraded (fail-open) result.
	th := testkit.Throttler(t, rb, throttler.WithClock(clock), throttler.WithCallTimeout(5*time.Second))

	for _, tc := range []struct{ name, limits string }{
		{"fixed", "20/min, 100/h"},
		{"aligned", "20/min aligned"},
		{"gcra", "20/min gcra"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.NoError(t, src.Set(50))
			clock.Set(t0)
			policy := mustPolicy(t, "mirror-"+tc.name, tc.limits)
			oldV := view{th: testkit.Throttler(t, oldB, throttler.WithClock(clock), throttler.WithCallTimeout(5*time.Second)), p: policy}
			newV := view{th: testkit.Throttler(t, newB, throttler.WithClock(clock), throttler.WithCallTimeout(5*time.Second)), p: policy}
			const quota = 20

			// At 50%: identifier i spends i%15+1 units, one request at a
			// time, a second apart.
			all := ids(24)
			spent := map[string]int64{}
			onNew := 0
			for i, id := range all {
				if rb.Side(id) == SideNew {
					onNew++
				}
				for range i%15 + 1 {
					r, err := th.Allow(ctx, policy, id)
					require.NoError(t, err)
					require.False(t, r.Degraded, "%v", r.Err)
					require.True(t, r.Allowed)
					spent[id]++
				}
				clock.Advance(time.Second)
			}
			require.True(t, onNew > 0 && onNew < len(all), "50%% puts identifiers on both sides (%d of %d on new)", onNew, len(all))

			// Both stores hold the same windows (a GCRA bucket has refilled
			// a little since, on both alike).
			for _, id := range all {
				o, n := oldV.peek(t, id), newV.peek(t, id)
				if tc.name != "gcra" {
					require.Equal(t, spent[id], o.Used, "%s on memcached", id)
				}
				require.Equal(t, o.Limits(), n.Limits(), "%s: memcached and redis differ", id)
			}

			// Everything to Redis mid-window: each identifier gets exactly
			// what it had left, not a fresh quota.
			require.NoError(t, src.Set(100))
			for _, id := range all {
				before := oldV.peek(t, id)
				allowed := int64(0)
				for range quota {
					r, err := th.Allow(ctx, policy, id)
					require.NoError(t, err)
					require.False(t, r.Degraded, "%v", r.Err)
					if r.Allowed {
						allowed++
					} else {
						assert.True(t, r.ResetAt.Equal(before.ResetAt) || tc.name == "gcra",
							"%s: ResetAt moved from %v to %v", id, before.ResetAt, r.ResetAt)
					}
				}
				assert.Equal(t, before.Remaining, allowed, "%s: units allowed after the move to redis", id)
				if tc.name != "gcra" {
					assert.Equal(t, quota-spent[id], allowed, "%s: units allowed after the move to redis", id)
				}
			}

			// And back to memcached: it mirrored the units Redis allowed.
			require.NoError(t, src.Set(0))
			for _, id := range all {
				r, err := th.Allow(ctx, policy, id)
				require.NoError(t, err)
				require.False(t, r.Degraded, "%v", r.Err)
				assert.False(t, r.Allowed, "%s: allowed again after moving back to memcached", id)
			}
			st := rb.Stats()
			assert.Zero(t, st.SecondaryErrors)
			assert.Zero(t, st.MirrorShortfalls)

			// A shadow pass over the same stores: the two agree on every
			// decision (a refund of one unit each first, so that the
			// decisions allow and consume on both).
			var mismatches []string
			shadow := mustRollout(t, oldB, newB, src, WithMode(ShadowMode),
				WithMismatchHandler(func(m Mismatch) {
					mismatches = append(mismatches, fmt.Sprintf("%s: %s", m.Request.Identifier, m.Kinds))
				}))
			sth := testkit.Throttler(t, shadow, throttler.WithClock(clock), throttler.WithCallTimeout(5*time.Second))
			for _, id := range all {
				_, err := th.Refund(ctx, policy, id, 1)
				require.NoError(t, err)
				r, err := sth.Allow(ctx, policy, id)
				require.NoError(t, err)
				require.False(t, r.Degraded, "%v", r.Err)
				assert.True(t, r.Allowed)
			}
			assert.EqualValues(t, len(all), shadow.Stats().ShadowCompared)
			assert.Empty(t, mismatches)
		})
	}
}

// realStores starts one memcached and two Redis servers and returns
// throttlekit's memcached backend over the first and sharded Redis (two
// groups) over the others, on key prefixes unique to name.
func realStores(t *testing.T, name string) (oldB, newB driver.Backend) {
	t.Helper()
	mc := localserver.MemcachedT(t, localserver.MemcachedOptions{})
	a := localserver.RedisT(t, localserver.RedisOptions{})
	b := localserver.RedisT(t, localserver.RedisOptions{})
	mcClient, err := memcachedbackend.NewClient(5*time.Second, mc.Addr())
	require.NoError(t, err)
	mcB, err := memcachedbackend.New(mcClient, memcachedbackend.WithPrefix("faithful-"+name))
	require.NoError(t, err)
	cfg, err := redisgroups.Parse(fmt.Sprintf("a=redis://%s,b=redis://%s", a.Addr(), b.Addr()))
	require.NoError(t, err)
	sharded, err := redisgroups.New(cfg, redisgroups.WithBackendOptions(redisbackend.WithPrefix("faithful-"+name+":")))
	require.NoError(t, err)
	t.Cleanup(func() { _ = sharded.Close() })
	return mcB, sharded
}

// TestFaithfulMigrationMemcachedToShardedRedis is the migration of the
// issue that asked for it, on real servers: 1,000 identifiers with steady
// traffic decide on memcached alone, with windows opening at random
// offsets; then a rollout to sharded Redis is deployed (mirroring begins in
// the middle of open windows, or split mode seeds each identifier as it
// moves) and ramped to 100 % and back down, clients still calling. Every
// result is compared with a reference store that saw the same requests:
// no ResetAt changes, no Remaining differences, no quota granted twice.
func TestFaithfulMigrationMemcachedToShardedRedis(t *testing.T) {
	for _, mode := range []Mode{MirrorMode, SplitMode} {
		t.Run(mode.String(), func(t *testing.T) {
			oldB, newB := realStores(t, mode.String())
			m := migration{mode: mode, limits: "3/5s, 10/min", ids: 1000, before: 65 * time.Second, after: 185 * time.Second,
				steps: rampUpAndDown, seed: 1000, parallel: 8}
			start := time.Now()
			rep, rb := m.run(t, oldB, newB, 5*time.Second)
			t.Logf("%s: %v in %v", mode, rep, time.Since(start).Round(time.Millisecond))
			assert.Zero(t, rep.resetChanges+rep.remaining+rep.doubleGrants+rep.lostGrants, "%v; first: %s", rep, rep.first)
			assert.Greater(t, rep.moves, 1000, "identifiers moved mid-window, up and down")
			st := rb.Stats()
			t.Logf("%s: stats %+v", mode, st)
			assert.Zero(t, st.SecondaryErrors)
			assert.Zero(t, st.SeedUnsupported)
			assert.Zero(t, st.MirrorShortfalls)
		})
	}
}

// TestLayoutUpgradeOnRealRedis: a Redis deployment of an earlier release,
// one string per limit with windows open, is upgraded to layout 3 (one hash
// per policy) with Upgrade and the backend's read-only Layout2 view while
// 300 clients keep calling: every ResetAt is kept and no quota is granted
// twice. Both earlier layouts: 2, and 1, whose unnamed limits were keyed by
// their notation (read through KeyLayoutV1).
func TestLayoutUpgradeOnRealRedis(t *testing.T) {
	rd := localserver.RedisT(t, localserver.RedisOptions{})
	client := goredis.NewClient(&goredis.Options{Addr: rd.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	for i, tc := range []struct {
		name     string
		old      func(w *redislayout2.Writer) driver.Backend
		from     func(b *redisbackend.Backend) driver.Backend
		oldNames string // a pattern the old release's keys match
	}{
		{"layout 2", func(w *redislayout2.Writer) driver.Backend { return w },
			func(b *redisbackend.Backend) driver.Backend { return b.Layout2() }, "*:fixed:60000"},
		{"layout 1", func(w *redislayout2.Writer) driver.Backend { return KeyLayoutV1(w) },
			func(b *redisbackend.Backend) driver.Backend { return KeyLayoutV1(b.Layout2()) }, "*%2F*"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			prefix := fmt.Sprintf("upgrade%d:", i)
			store, err := redisbackend.New(client, redisbackend.WithPrefix(prefix))
			require.NoError(t, err)
			m := migration{mode: SplitMode, limits: "3/5s, 10/min, 20/min gcra", ids: 300, before: 70 * time.Second, after: 90 * time.Second,
				seed: 300, parallel: 8, upgrade: true, from: tc.from(store)}
			rep, rb := m.run(t, tc.old(redislayout2.New(client, prefix)), store, 5*time.Second)
			t.Logf("upgrade: %v; stats %+v", rep, rb.Stats())
			assert.Zero(t, rep.resetChanges+rep.remaining+rep.doubleGrants+rep.lostGrants, "%v; first: %s", rep, rep.first)
			assert.NotZero(t, rb.Stats().Seeded)
			// The old keys were real strings, written before the upgrade, and
			// the new state is in layout-3 hashes.
			old, err := client.Keys(context.Background(), prefix+"{"+tc.oldNames).Result()
			require.NoError(t, err)
			require.NotEmpty(t, old, "the old release's keys")
			typ, err := client.Type(context.Background(), old[0]).Result()
			require.NoError(t, err)
			assert.Equal(t, "string", typ)
			hashes, err := client.Keys(context.Background(), prefix+"v3:*").Result()
			require.NoError(t, err)
			assert.Len(t, hashes, 300)
		})
	}
}
