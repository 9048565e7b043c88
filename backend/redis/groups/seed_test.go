package redisgroups

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// TestSeedReachesTheOwningGroup: states given to the groups' sharded
// backend (driver.Seeder, how a rollout carries an identifier's windows
// into them) are merged and decided on the primary of the group that owns
// the identifier, as driver.Seed does, and written nowhere else; the
// throttler's next decisions through the groups count them.
func TestSeedReachesTheOwningGroup(t *testing.T) {
	ts := servers(t)
	ctx := context.Background()
	b, prefix := openShared(t, ts, "")
	groups := make([]*redisbackend.Backend, len(shardNames))
	for i := range shardNames {
		g, err := redisbackend.New(ts.primaryClients[i], redisbackend.WithPrefix(prefix))
		require.NoError(t, err)
		groups[i] = g
	}
	if _, ok := any(groups[0]).(driver.Seeder); !ok {
		t.Skip("the Redis backend does not implement driver.Seeder yet")
	}

	policy := testkit.Policy(t, "api", "5/min, 10/min gcra")
	p := compile(t, policy)
	now := t0.Add(1500 * time.Millisecond)
	given := []driver.State{
		{Used: 3, End: t0.Add(40 * time.Second).UnixMilli()},
		{End: now.Add(30 * time.Second).UnixMicro()},
	}
	clock := throttlertest.NewManualClock(now)
	th := testkit.Throttler(t, b, throttler.WithClock(clock), throttler.WithCallTimeout(5*time.Second))
	held := map[string]int{}
	for _, id := range identifiers(60) {
		req := driver.Request{Policy: p, Identifier: id, Cost: 1, Now: now}
		out, err := b.Seed(ctx, req, append([]driver.State(nil), given...))
		require.NoError(t, err, id)
		want := make([]driver.State, len(p.Limits))
		require.True(t, driver.Seed(p, now, 1, want, given))
		assert.True(t, out.Allowed, id)
		assert.Equal(t, want, out.States, id)
		assert.Equal(t, make([]driver.State, len(p.Limits)), out.Prior, "%s: nothing held before", id)

		owner := b.ShardFor(id)
		held[owner]++
		keys := []string{groups[0].Key(p, id)}
		for i, name := range shardNames {
			n, err := ts.primaryClients[i].Exists(ctx, keys...).Result()
			require.NoError(t, err)
			if name != owner {
				assert.Zero(t, n, "%s: nothing written on group %s", id, name)
				continue
			}
			assert.EqualValues(t, len(keys), n, "%s: its keys on its group %s", id, name)
			peeked, err := groups[i].Peek(ctx, driver.Request{Policy: p, Identifier: id, Now: now})
			require.NoError(t, err)
			assert.Equal(t, want, peeked.States, "%s on group %s", id, name)
		}

		// The fixed window holds 3 given + 1 seeded: one unit left, in the
		// given window.
		r, err := th.Allow(ctx, policy, id)
		require.NoError(t, err)
		require.False(t, r.Degraded, "%v", r.Err)
		assert.True(t, r.Allowed, id)
		assert.EqualValues(t, 5, r.Limits()[0].Used, id)
		assert.Equal(t, given[0].End, r.Limits()[0].ResetAt.UnixMilli(), id)
		r, err = th.Allow(ctx, policy, id)
		require.NoError(t, err)
		assert.False(t, r.Allowed, "%s: the seeded window is full", id)
	}
	for _, name := range shardNames {
		assert.Positive(t, held[name], "group %s owns no identifier", name)
	}
}
