package debugpage

import (
	"container/heap"
	"hash/maphash"
	"sort"
	"sync"
)

// topK finds the heaviest keys of a stream in fixed memory with the
// Space-Saving algorithm: it counts at most k keys; a key not counted
// takes the place of the smallest count, inheriting that count as its
// possible overestimate. Any key whose true count exceeds N/k (N the
// stream's length) is counted, and every count overestimates by at most
// its Err. Keys are split over shards by hash, each a sketch of its own
// with its own lock, so that denials of different identifiers rarely wait
// on each other; a key lives in one shard, so the shards' entries merge
// into one ranking without double counting.
type topK struct {
	seed   maphash.Seed
	shards []topKShard
}

// topKKey is what the sketch counts: an identifier under a policy.
type topKKey struct{ policy, id string }

type topKShard struct {
	mu   sync.Mutex
	k    int
	idx  map[topKKey]*topKEntry
	heap topKHeap // min-heap on count
	n    uint64   // keys seen by this shard
}

type topKEntry struct {
	key        topKKey
	count, err uint64
	pos        int // index in the heap
}

type topKHeap []*topKEntry

func (h topKHeap) Len() int           { return len(h) }
func (h topKHeap) Less(i, j int) bool { return h[i].count < h[j].count }
func (h topKHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].pos, h[j].pos = i, j
}
func (h *topKHeap) Push(x any) {
	e := x.(*topKEntry)
	e.pos = len(*h)
	*h = append(*h, e)
}
func (h *topKHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return e
}

// newTopK returns a sketch of shards × perShard counters.
func newTopK(shards, perShard int) *topK {
	t := &topK{seed: maphash.MakeSeed(), shards: make([]topKShard, shards)}
	for i := range t.shards {
		t.shards[i].k = perShard
		t.shards[i].idx = make(map[topKKey]*topKEntry, perShard)
		t.shards[i].heap = make(topKHeap, 0, perShard)
	}
	return t
}

// add counts one occurrence of key.
func (t *topK) add(key topKKey) {
	sh := &t.shards[maphash.String(t.seed, key.id)%uint64(len(t.shards))]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.n++
	if e, ok := sh.idx[key]; ok {
		e.count++
		heap.Fix(&sh.heap, e.pos)
		return
	}
	if len(sh.heap) < sh.k {
		e := &topKEntry{key: key, count: 1}
		heap.Push(&sh.heap, e)
		sh.idx[key] = e
		return
	}
	// Replace the smallest count: the newcomer may have been among the
	// keys it stood for, so it inherits that count as its error bound.
	e := sh.heap[0]
	delete(sh.idx, e.key)
	e.key, e.err = key, e.count
	e.count++
	sh.idx[key] = e
	heap.Fix(&sh.heap, 0)
}

// topEntry is one of the heaviest keys: Count overestimates the true count
// by at most Err.
type topEntry struct {
	Key        topKKey
	Count, Err uint64
}

// top returns up to n entries, heaviest first, and the number of keys the
// sketch has seen.
func (t *topK) top(n int) ([]topEntry, uint64) {
	var all []topEntry
	var seen uint64
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		seen += sh.n
		for _, e := range sh.heap {
			all = append(all, topEntry{Key: e.key, Count: e.count, Err: e.err})
		}
		sh.mu.Unlock()
	}
	sort.Slice(all, func(i, j int) bool {
		if all[i].Count != all[j].Count {
			return all[i].Count > all[j].Count
		}
		if all[i].Key.id != all[j].Key.id {
			return all[i].Key.id < all[j].Key.id
		}
		return all[i].Key.policy < all[j].Key.policy
	})
	if len(all) > n {
		all = all[:n]
	}
	return all, seen
}

// len returns the number of keys counted, at most shards × perShard.
func (t *topK) len() int {
	n := 0
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		n += len(sh.heap)
		sh.mu.Unlock()
	}
	return n
}
