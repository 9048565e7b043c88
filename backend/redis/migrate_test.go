package redisbackend_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/internal/keyslot"
	"github.com/throttlekit/throttlekit/internal/localserver"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
)

// nodeID returns the cluster node ID of the node at addr.
func nodeID(t *testing.T, c *goredis.Client) string {
	t.Helper()
	id, err := c.Do(context.Background(), "CLUSTER", "MYID").Text()
	require.NoError(t, err)
	return id
}

// A slot moves from one primary to another the way redis-cli --cluster
// reshard moves it (IMPORTING on the target, MIGRATING on the source, the
// slot's keys moved with MIGRATE ... KEYS, then SETSLOT NODE everywhere),
// while goroutines keep deciding for identifiers of that slot under a
// two-limit policy. The states are held for a while at each step so that
// decisions run against every one of them. No decision may be degraded, and
// no unit may be lost: each identifier's hour limit ends up counting exactly
// the units that were allowed. The decisions go in per-node batches (the
// default), and some of them must meet the slot on the move and go again
// through the Cluster client.
func TestSlotMigrationCostsNoDecision(t *testing.T) {
	// keys per MIGRATE: redis-cli's default pipeline, and one at a time
	// with a pause after each, which leaves identifiers' keys split
	// between the two nodes for a while.
	for _, batch := range []int{10, 1} {
		t.Run(fmt.Sprintf("keys-per-migrate=%d", batch), func(t *testing.T) { testSlotMigration(t, batch) })
	}
}

func testSlotMigration(t *testing.T, migrateBatch int) {
	ctx := context.Background()
	c := localserver.RedisClusterT(t, 3, 0) // a cluster of its own: this test reshapes it
	cc := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: c.Addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = cc.Close() })
	b := mustBackend(t, cc, redisbackend.WithPrefix(newPrefix()))
	// A second per call, not the default 100 ms: what this proves is that a
	// slot on the move fails no decision, and a machine loaded by other
	// work can stall a call for longer than 100 ms on its own.
	th := testkit.Throttler(t, b, throttler.WithLogger(nil), throttler.WithCallTimeout(time.Second))
	p := mustPolicy(t, "migrate", "10/s, 5000/h")
	compiled := testkit.Compile(t, p)

	// Identifiers that share one slot: the first, and others found by
	// trying names until they hash to it.
	ids := []string{"mig:0"}
	slot := keyslot.Of(b.Key(compiled, ids[0]))
	for i := 1; len(ids) < 4 && i < 1_000_000; i++ {
		id := fmt.Sprintf("mig:%d", i)
		if keyslot.Of(b.Key(compiled, id)) == slot {
			ids = append(ids, id)
		}
	}
	require.Len(t, ids, 4)

	src, err := cc.MasterForKey(ctx, b.Key(compiled, ids[0]))
	require.NoError(t, err)
	var dstAddr string
	for _, addr := range c.Addrs() {
		if addr != src.Options().Addr && dstAddr == "" {
			dstAddr = addr
		}
	}
	srcAdmin, dstAdmin := newClient(t, src.Options().Addr), newClient(t, dstAddr)
	srcID, dstID := nodeID(t, srcAdmin), nodeID(t, dstAdmin)

	var mu sync.Mutex
	allowed := map[string]int64{}
	decided, degraded := 0, 0
	var firstErr error
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 100_000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				id := ids[(g+i)%len(ids)]
				r, err := th.Allow(ctx, p, id)
				mu.Lock()
				decided++
				if err != nil || r.Degraded {
					degraded++
					if firstErr == nil {
						firstErr = fmt.Errorf("%v %v", err, r.Err)
					}
				} else if r.Allowed {
					allowed[id]++
				}
				mu.Unlock()
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}

	hold := func() { time.Sleep(700 * time.Millisecond) }
	hold() // decisions on the source, before the move
	require.NoError(t, dstAdmin.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", srcID).Err())
	require.NoError(t, srcAdmin.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", dstID).Err())
	hold() // MIGRATING / IMPORTING, every key still on the source
	host, port, err := net.SplitHostPort(dstAddr)
	require.NoError(t, err)
	moved := 0
	for range 100 {
		keys, err := srcAdmin.ClusterGetKeysInSlot(ctx, slot, migrateBatch).Result()
		require.NoError(t, err)
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", host, port, "", 0, 5000, "KEYS"}
		for _, k := range keys {
			args = append(args, k)
		}
		require.NoError(t, srcAdmin.Do(ctx, args...).Err())
		moved += len(keys)
		if migrateBatch == 1 {
			time.Sleep(30 * time.Millisecond)
		}
	}
	hold() // keys on the target, the slot still MIGRATING: the source answers ASK
	for _, admin := range []*goredis.Client{dstAdmin, srcAdmin} {
		require.NoError(t, admin.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", dstID).Err())
	}
	hold() // the source answers MOVED; the client reloads its slot map
	close(stop)
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	resent := b.ClusterResent()
	t.Logf("slot %d moved (%d keys) while %d decisions ran for %d identifiers: %d degraded (goal 0), "+
		"%d sent again after their node turned them away", slot, moved, decided, len(ids), degraded, resent)
	assert.Zero(t, degraded, "first failure: %v", firstErr)
	assert.Positive(t, moved)
	// The per-node batches met the move and absorbed it.
	assert.Positive(t, resent, "no decision met the slot on the move")
	for _, id := range ids {
		r, err := th.Peek(ctx, p, id)
		require.NoError(t, err)
		require.False(t, r.Degraded, "%v", r.Err)
		for _, lr := range r.Limits() {
			if lr.Name == "5000/h" {
				assert.Equal(t, allowed[id], lr.Used, "%s: the hour limit counts every allowed unit", id)
			}
		}
	}
	owner, err := cc.MasterForKey(ctx, b.Key(compiled, ids[0]))
	require.NoError(t, err)
	assert.Equal(t, dstAddr, owner.Options().Addr, "the slot moved")
}
