package debugpage

import (
	"hash/maphash"
	"sort"
	"strings"
	"sync"
)

// The kinds of denial the sketch counts, as indexes of its per-kind totals.
const (
	kindDenied = iota // the store denied
	kindCached        // the deny cache denied
	kindLocal         // FailLocal denied on this process's share
	numKinds
)

// minPerShard is the fewest counters a shard holds: below it, splitting
// the sketch costs more accuracy than it saves contention.
const minPerShard = 16

// maxShards bounds how many shards a sketch has.
const maxShards = 8

// sketch finds the heaviest keys of a stream in fixed memory with the
// Space-Saving algorithm (Metwally, Agrawal and El Abbadi, 2005). It holds
// at most k counters. A key already counted has its counter incremented; a
// new key, once every counter is taken, replaces the key of the smallest
// counter, increments it and records the count it inherited as its error.
// So every count overestimates its key's true count by at most its err,
// err is at most N/k (N the keys seen), and every key seen more than N/k
// times is counted.
//
// The k counters are split over shards by a hash of the identifier, each a
// Space-Saving sketch of its own with its own lock, so that denials of
// different identifiers rarely wait on each other. A key always lands in
// the same shard, so the shards' counters merge into one ranking without
// double counting, and each shard's bounds hold for the keys it saw.
type sketch struct {
	seed   maphash.Seed
	k      int
	shards []shard
}

// sketchKey is what the sketch counts: an identifier under a policy.
type sketchKey struct{ policy, id string }

// counter is one of a shard's counters.
type counter struct {
	key   sketchKey
	count uint64
	err   uint64
	pos   int32 // index in the shard's heap
}

// shard is a Space-Saving sketch of its own: counters in a fixed array, a
// min-heap of their indexes ordered by count, and an index from key to
// counter. Counts only grow by one, so an increment only sifts down.
type shard struct {
	mu       sync.Mutex
	counters []counter // len grows to cap, never beyond
	heap     []int32   // indexes into counters; heap[0] has the least count
	index    map[sketchKey]int32
	seen     uint64
	kinds    [numKinds]uint64
	_        [64]byte // keeps neighbouring shards' locks off one cache line
}

// newSketch returns a sketch of k counters, k ≥ 1.
func newSketch(k int) *sketch {
	n := min(max(k/minPerShard, 1), maxShards)
	s := &sketch{seed: maphash.MakeSeed(), k: k, shards: make([]shard, n)}
	for i := range s.shards {
		per := k / n
		if i < k%n {
			per++
		}
		s.shards[i].init(per)
	}
	return s
}

func (sh *shard) init(capacity int) {
	sh.counters = make([]counter, 0, capacity)
	sh.heap = make([]int32, 0, capacity)
	sh.index = make(map[sketchKey]int32, capacity)
	sh.seen = 0
	sh.kinds = [numKinds]uint64{}
}

// add counts one denial of id under policy, of the given kind.
func (s *sketch) add(policy, id string, kind int) {
	sh := &s.shards[s.shardIndex(id)]
	sh.mu.Lock()
	sh.add(sketchKey{policy, id}, kind)
	sh.mu.Unlock()
}

// shardIndex returns the index of the shard that counts id.
func (s *sketch) shardIndex(id string) int {
	return int(maphash.String(s.seed, id) % uint64(len(s.shards)))
}

func (sh *shard) add(key sketchKey, kind int) {
	sh.seen++
	sh.kinds[kind]++
	if i, ok := sh.index[key]; ok {
		c := &sh.counters[i]
		c.count++
		sh.down(int(c.pos))
		return
	}
	// The key is kept: copy the identifier, which may share the memory of
	// something larger (a request header, a body) the caller let go of.
	key.id = strings.Clone(key.id)
	if n := len(sh.counters); n < cap(sh.counters) {
		sh.counters = append(sh.counters, counter{key: key, count: 1, pos: int32(len(sh.heap))})
		sh.heap = append(sh.heap, int32(n))
		sh.index[key] = int32(n)
		sh.up(len(sh.heap) - 1)
		return
	}
	// Every counter is taken: the newcomer takes over the smallest. It may
	// have been among the keys that count stood for, so the count becomes
	// its possible overestimate.
	i := sh.heap[0]
	c := &sh.counters[i]
	delete(sh.index, c.key)
	c.key, c.err = key, c.count
	c.count++
	sh.index[key] = i
	sh.down(0)
}

func (sh *shard) less(a, b int) bool {
	return sh.counters[sh.heap[a]].count < sh.counters[sh.heap[b]].count
}

func (sh *shard) swap(a, b int) {
	sh.heap[a], sh.heap[b] = sh.heap[b], sh.heap[a]
	sh.counters[sh.heap[a]].pos = int32(a)
	sh.counters[sh.heap[b]].pos = int32(b)
}

func (sh *shard) up(j int) {
	for j > 0 {
		parent := (j - 1) / 2
		if !sh.less(j, parent) {
			return
		}
		sh.swap(j, parent)
		j = parent
	}
}

func (sh *shard) down(j int) {
	n := len(sh.heap)
	for {
		least := j
		if l := 2*j + 1; l < n && sh.less(l, least) {
			least = l
		}
		if r := 2*j + 2; r < n && sh.less(r, least) {
			least = r
		}
		if least == j {
			return
		}
		sh.swap(j, least)
		j = least
	}
}

// topEntry is one counted key: its true count lies in [Count-Err, Count].
type topEntry struct {
	Key        sketchKey
	Count, Err uint64
}

// sketchTotals are the sketch's totals.
type sketchTotals struct {
	seen    uint64
	kinds   [numKinds]uint64
	tracked int
}

// top returns every counted key, heaviest first (ties: the smaller error,
// then by identifier and policy), and the sketch's totals.
func (s *sketch) top() ([]topEntry, sketchTotals) {
	var tot sketchTotals
	all := make([]topEntry, 0, s.k)
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		tot.seen += sh.seen
		for j := range tot.kinds {
			tot.kinds[j] += sh.kinds[j]
		}
		for _, c := range sh.counters {
			all = append(all, topEntry{Key: c.key, Count: c.count, Err: c.err})
		}
		sh.mu.Unlock()
	}
	tot.tracked = len(all)
	sort.Slice(all, func(i, j int) bool {
		a, b := &all[i], &all[j]
		switch {
		case a.Count != b.Count:
			return a.Count > b.Count
		case a.Err != b.Err:
			return a.Err < b.Err
		case a.Key.id != b.Key.id:
			return a.Key.id < b.Key.id
		}
		return a.Key.policy < b.Key.policy
	})
	return all, tot
}

// len returns how many keys the sketch counts: at most k.
func (s *sketch) len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.counters)
		sh.mu.Unlock()
	}
	return n
}

// reset forgets every key and total.
func (s *sketch) reset() {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		sh.init(cap(sh.counters))
		sh.mu.Unlock()
	}
}
