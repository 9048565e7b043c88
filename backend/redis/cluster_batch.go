package redisbackend

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// This file holds the batching of a Cluster client: a batcher per primary,
// so that a round trip carries the calls of every slot one node serves and
// waits on no other node.

// clusterBatcher sends each script call of a Cluster client through the
// batcher of the primary that serves its key's slot, by the client's view
// of the cluster. Each primary's round trips are its own: a node that hangs
// or dies delays only the calls of the slots it serves, where a pipeline
// over the Cluster client would hold every node's replies until the slowest
// node's part returned or its deadline passed. A round trip's decisions go
// as one batch call per policy shape, whatever their slots (the batch
// scripts are declared with allow-cross-slot-keys).
//
// The client's view of the cluster may be behind it (a slot migrated, a
// replica promoted): a call that the node answers with a redirect, or a
// decision whose key the node does not serve, goes again alone through
// the Cluster client, which follows the redirect, and the client is told to
// reload its view. Reads (peeks) go through the Cluster client unbatched,
// so that a client set to read from replicas still does.
type clusterBatcher struct {
	cluster  conn // the Cluster client, for reads and calls sent again
	max      int
	inFlight int // per primary
	inline   bool

	mu    sync.Mutex
	nodes map[*goredis.Client]*batcher

	// resent counts the calls sent again through the Cluster client after
	// their node turned them away (redirected).
	resent atomic.Int64
}

// run implements scriptRunner.
func (cb *clusterBatcher) run(ctx context.Context, script *goredis.Script, readOnly bool, keys []string, args []any, policy *driver.Policy) (any, error) {
	cc := cb.cluster.Client.(*goredis.ClusterClient)
	if readOnly || len(keys) == 0 {
		return cb.direct(ctx, script, readOnly, keys, args)
	}
	node, err := cc.MasterForKey(ctx, keys[0])
	if err != nil {
		// No view of the slot yet (or none to be had): the Cluster
		// client finds the node itself, or fails as it would alone.
		return cb.direct(ctx, script, readOnly, keys, args)
	}
	reply, err := cb.batcherFor(node).run(ctx, script, readOnly, keys, args, policy)
	switch {
	case err == nil:
		return reply, nil
	case redirected(err):
		cb.resent.Add(1)
		cc.ReloadState(ctx)
		if ctx.Err() != nil {
			return nil, withContextError(ctx, err)
		}
		return cb.direct(ctx, script, readOnly, keys, args)
	case unreachable(err):
		// A node that stopped answering may have been replaced: the next
		// calls should find its successor as soon as the cluster knows it.
		cc.ReloadState(ctx)
	}
	return reply, err
}

// direct runs one call through the Cluster client, unbatched.
func (cb *clusterBatcher) direct(ctx context.Context, script *goredis.Script, readOnly bool, keys []string, args []any) (any, error) {
	return await(ctx, cb.cluster, func() (any, error) {
		if readOnly {
			return script.RunRO(ctx, cb.cluster.Client, keys, args...).Result()
		}
		return script.Run(ctx, cb.cluster.Client, keys, args...).Result()
	})
}

// batcherFor returns the batcher of node, made on first use. The Cluster
// client owns node; a node it closes (one that left the cluster) fails its
// calls with goredis.ErrClosed, which sends them again (redirected).
func (cb *clusterBatcher) batcherFor(node *goredis.Client) *batcher {
	cb.mu.Lock()
	defer cb.mu.Unlock()
	bt, ok := cb.nodes[node]
	if !ok {
		bt = &batcher{client: node, pipe: node, max: cb.max, inline: cb.inline, many: true, inFlight: cb.inFlight}
		cb.nodes[node] = bt
	}
	return bt
}

// redirected reports the failures of a call sent to a node that does not
// (or no longer) serve its key: a redirect the node client does not
// follow, a decision's key the node does not hold (a batch script's
// THROTTLEKIT_ELSEWHERE), or a node client the Cluster client closed.
func redirected(err error) bool {
	return migrating(err) || goredis.HasErrorPrefix(err, elsewhereReply) || errors.Is(err, goredis.ErrClosed)
}

// elsewhereReply starts a batch script's error for a decision whose key
// the node it ran on does not serve.
const elsewhereReply = "THROTTLEKIT_ELSEWHERE"
