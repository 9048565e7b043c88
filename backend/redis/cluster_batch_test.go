package redisbackend_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/internal/localserver"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
)

// TestClusterKillDegradesOnlyTheDeadNode kills a Cluster primary (kill -9)
// while 64 goroutines decide for identifiers of every node, with the
// default options (batching on, no breaker), until its replica has taken
// over; then brings the killed node back (it rejoins as a replica) and
// kills the next primary, ten times (THROTTLEKIT_FAILOVER_RUNS). Every decision for an identifier of a
// node that stays up must be decided normally: a round trip waits on its
// own node alone. The dead node's identifiers are degraded until the
// promotion, and decided normally again soon after it.
//
// The call timeout is 500 ms: long enough that a loaded machine does not
// make a live node's decision late (the project's loaded-machine test sees
// none at 100 ms), short enough that a live node's call held behind the
// dead node's share of a Cluster pipeline, which go-redis retries until the
// deadline, fails (61 of 6,127 did in one run before each node had
// batchers of its own).
func TestClusterKillDegradesOnlyTheDeadNode(t *testing.T) {
	ctx := context.Background()
	c := localserver.RedisClusterT(t, 3, 1) // a cluster of its own: this test breaks it
	require.NoError(t, c.WaitReplicasSynced(10*time.Second))
	require.NoError(t, listReplicas(c))
	// As operators run a cluster that must keep serving the slots it still
	// has (see Cluster failover in the package documentation). A restarted
	// node starts from its command line, so it is told again.
	fullCoverageNo := func(n *localserver.Redis) {
		require.NoError(t, newClient(t, n.Addr()).ConfigSet(ctx, "cluster-require-full-coverage", "no").Err())
	}
	for _, n := range c.Nodes() {
		fullCoverageNo(n)
	}
	cc := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: c.Addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = cc.Close() })
	b := mustBackend(t, cc, redisbackend.WithPrefix(newPrefix()))
	th := testkit.Throttler(t, b, throttler.WithLogger(nil), throttler.WithCallTimeout(500*time.Millisecond))
	p := mustPolicy(t, "failover", "1000000/h")
	compiled := testkit.Compile(t, p)
	ids := make([]string, 300)
	for i := range ids {
		ids[i] = "user:" + strconv.Itoa(i)
	}
	nodeOf := func(id string) string {
		node, err := cc.MasterForKey(ctx, b.Key(compiled, id))
		require.NoError(t, err)
		return node.Options().Addr
	}
	byAddr := map[string]*localserver.Redis{}
	for _, n := range c.Nodes() {
		byAddr[n.Addr()] = n
	}

	for run := range testkit.Count(t, "THROTTLEKIT_FAILOVER_RUNS", 10) {
		// Every identifier decided once, so that the client's view of the
		// cluster is current before the kill.
		for _, id := range ids {
			r, err := th.Allow(ctx, p, id)
			require.NoError(t, err)
			require.Falsef(t, r.Degraded, "run %d, before the kill: %v", run, r.Err)
		}
		owner := map[string]string{}
		for _, id := range ids {
			owner[id] = nodeOf(id)
		}
		victimAddr := owner[ids[run%len(ids)]]
		victim := byAddr[victimAddr]
		require.NotNil(t, victim)
		replicaAddr := replicaOf(t, c, victimAddr)
		watch := newClient(t, replicaAddr)

		var onDead, onLive, degradedDead, degradedLive atomic.Int64
		var firstLive atomic.Value
		stop := make(chan struct{})
		var workers sync.WaitGroup
		for w := range 64 {
			workers.Add(1)
			go func() {
				defer workers.Done()
				rng := rand.New(rand.NewPCG(uint64(run), uint64(w)))
				for {
					select {
					case <-stop:
						return
					default:
					}
					id := ids[rng.IntN(len(ids))]
					r, err := th.Allow(ctx, p, id)
					if err != nil {
						t.Errorf("Allow: %v", err)
						return
					}
					if owner[id] == victimAddr {
						onDead.Add(1)
						if r.Degraded {
							degradedDead.Add(1)
						}
						continue
					}
					onLive.Add(1)
					if r.Degraded {
						degradedLive.Add(1)
						firstLive.CompareAndSwap(nil, fmt.Sprintf("%s on %s: %v", id, owner[id], r.Err))
					}
				}
			}()
		}
		time.Sleep(200 * time.Millisecond) // the decisions are under way
		killed := time.Now()
		victim.Kill()
		promoted := time.Time{}
		for deadline := killed.Add(40 * time.Second); promoted.IsZero() && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if role, err := watch.Do(ctx, "ROLE").Slice(); err == nil && len(role) > 0 && role[0] == "master" {
				promoted = time.Now()
			}
		}
		// The decisions go on for a while under the new primary.
		time.Sleep(time.Second)
		close(stop)
		workers.Wait()
		require.False(t, promoted.IsZero(), "run %d: the replica of %s was not promoted within 40 s", run, victimAddr)
		t.Logf("run %d: killed %s, promoted %s after %v; live nodes: %d decisions, %d degraded; dead node: %d decisions, %d degraded",
			run, victimAddr, replicaAddr, promoted.Sub(killed).Round(time.Millisecond), onLive.Load(), degradedLive.Load(), onDead.Load(), degradedDead.Load())
		assert.Zerof(t, degradedLive.Load(), "run %d: decisions for identifiers of live nodes degraded, the first: %v", run, firstLive.Load())
		assert.Positive(t, onLive.Load())

		// The killed node comes back as a replica of its successor.
		require.NoError(t, victim.Start())
		fullCoverageNo(victim)
		require.NoError(t, c.WaitReady(30*time.Second))
		require.NoError(t, c.WaitReplicasSynced(30*time.Second))
		require.NoError(t, listReplicas(c))
		if t.Failed() {
			return
		}
	}
}

// replicaOf returns the address of a replica of the primary at addr, as
// the primary's ROLE reports it.
func replicaOf(t *testing.T, c *localserver.RedisCluster, addr string) string {
	t.Helper()
	role, err := newClient(t, addr).Do(context.Background(), "ROLE").Slice()
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(role), 3)
	replicas, _ := role[2].([]any)
	require.NotEmpty(t, replicas, "primary %s has no replica", addr)
	r, _ := replicas[0].([]any)
	require.GreaterOrEqual(t, len(r), 2)
	return fmt.Sprintf("%v:%v", r[0], r[1])
}
