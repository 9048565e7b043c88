package debugpage

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"
)

// TestTopKBoundedUnderAMillionIdentifiers: a million distinct identifiers,
// each denied once, and five heavy hitters denied thousands of times in
// between. The sketch holds at most K entries per shard whatever it saw;
// the heavy hitters come out on top, their counts within the error bound;
// the heap grows by about what K entries hold, not by the million.
func TestTopKBoundedUnderAMillionIdentifiers(t *testing.T) {
	const distinct, k = 1_000_000, 100
	heavy := map[string]uint64{"abuser-1": 40000, "abuser-2": 30000, "abuser-3": 20000, "abuser-4": 10000, "abuser-5": 5000}
	var stream []string
	for id, n := range heavy {
		for range n {
			stream = append(stream, id)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	heapBefore := heapInUse()
	s := newTopK(8, k)
	next := 0
	for i := range distinct {
		s.add(topKKey{"api", "user:" + strconv.Itoa(i)})
		// Interleave the heavy hitters at random through the stream.
		for next < len(stream) && rng.IntN(distinct) < len(stream) {
			j := next + rng.IntN(len(stream)-next)
			stream[next], stream[j] = stream[j], stream[next]
			s.add(topKKey{"api", stream[next]})
			next++
		}
	}
	for ; next < len(stream); next++ {
		s.add(topKKey{"api", stream[next]})
	}
	heapAfter := heapInUse()
	runtime.KeepAlive(stream)

	if n := s.len(); n > 8*k {
		t.Fatalf("the sketch holds %d entries, more than 8 shards × %d", n, k)
	}
	top, seen := s.top(5)
	if want := uint64(distinct + 105000); seen != want {
		t.Errorf("seen %d, want %d", seen, want)
	}
	for i, e := range top {
		id := e.Key.id
		trueCount, ok := heavy[id]
		if !ok {
			t.Errorf("rank %d is %q, not a heavy hitter", i+1, id)
			continue
		}
		if e.Count < trueCount || e.Count-e.Err > trueCount {
			t.Errorf("%s: count %d err %d, true count %d outside [count-err, count]", id, e.Count, e.Err, trueCount)
		}
	}
	grown := int64(heapAfter) - int64(heapBefore)
	// 800 entries of short keys, with their maps and heaps: well under
	// 1 MiB. A sketch that kept every identifier would hold ~100 MiB.
	if grown > 1<<20 {
		t.Errorf("the heap grew by %d bytes over a million identifiers, want under 1 MiB", grown)
	}
	t.Logf("1,000,000 identifiers and 105,000 heavy denials: %d entries held, heap grew %d KiB; top: %s", s.len(), grown>>10, fmt.Sprint(top))
}

func heapInUse() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse
}
