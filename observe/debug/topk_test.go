package debugpage

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"sync"
	"testing"
)

// TestSketchBySteps follows Space-Saving by hand with 3 counters (one
// shard): a newcomer takes the smallest counter and inherits its count as
// its error.
func TestSketchBySteps(t *testing.T) {
	s := newSketch(3)
	if len(s.shards) != 1 {
		t.Fatalf("%d shards for 3 counters, want 1", len(s.shards))
	}
	for _, step := range []struct {
		id string
		n  int
	}{{"a", 5}, {"b", 3}, {"c", 2}, {"d", 1}, {"a", 1}, {"e", 1}} {
		for range step.n {
			s.add("api", step.id, kindDenied)
		}
	}
	// After a5 b3 c2: {a5, b3, c2}. d takes c's counter, the smallest: d3
	// err 2, still at the heap's root (b3 is not smaller). a6. e takes the
	// root's counter: e4 err 3. Left: a6, e4, b3.
	top, tot := s.top()
	if tot.seen != 13 || tot.tracked != 3 || tot.kinds[kindDenied] != 13 {
		t.Fatalf("totals %+v, want 13 seen, 3 tracked", tot)
	}
	if top[0].Key.id != "a" || top[0].Count != 6 || top[0].Err != 0 {
		t.Errorf("first %+v, want a 6 err 0", top[0])
	}
	var sum uint64
	for _, e := range top {
		sum += e.Count
	}
	if sum != 13 {
		t.Errorf("the counts add up to %d, want the 13 seen", sum)
	}
	if e := top[1]; e.Key.id != "e" || e.Count != 4 || e.Err != 3 {
		t.Errorf("second %+v, want e 4 err 3 (it took over a counter of 3)", e)
	}
	if e := top[2]; e.Key.id != "b" || e.Count != 3 || e.Err != 0 {
		t.Errorf("third %+v, want b 3 err 0", e)
	}
}

// TestSketchBounds checks Space-Saving's guarantees on random skewed
// streams against exact counts: each count within [true, true+err], err
// at most the shard's stream over its counters, every key more frequent
// than that counted, the counts of a shard adding up to what it saw, and
// at most k counters in all.
func TestSketchBounds(t *testing.T) {
	for _, k := range []int{1, 7, 50, 100, 333} {
		t.Run(strconv.Itoa(k), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(k), 9))
			zipf := rand.NewZipf(rng, 1.2, 1, 5000)
			s := newSketch(k)
			exact := map[sketchKey]uint64{}
			for range 50_000 {
				id := "id-" + strconv.FormatUint(zipf.Uint64(), 10)
				pol := []string{"api", "search"}[rng.IntN(2)]
				s.add(pol, id, rng.IntN(numKinds))
				exact[sketchKey{pol, id}]++
			}
			if n := s.len(); n > k {
				t.Fatalf("%d counters, more than k=%d", n, k)
			}
			counted := map[sketchKey]bool{}
			for i := range s.shards {
				sh := &s.shards[i]
				bound := sh.seen / uint64(cap(sh.counters))
				var sum uint64
				for j, c := range sh.counters {
					counted[c.key] = true
					sum += c.count
					if got := sh.index[c.key]; int(got) != j || sh.heap[c.pos] != int32(j) {
						t.Fatalf("shard %d: counter %d misindexed", i, j)
					}
					if tr := exact[c.key]; c.count < tr || c.count-c.err > tr {
						t.Errorf("%v: count %d err %d, true %d", c.key, c.count, c.err, tr)
					}
					if c.err > bound {
						t.Errorf("%v: err %d above the shard's bound %d", c.key, c.err, bound)
					}
				}
				if sum != sh.seen {
					t.Errorf("shard %d: counts add up to %d, seen %d", i, sum, sh.seen)
				}
				for j := 1; j < len(sh.heap); j++ {
					if sh.less(j, (j-1)/2) {
						t.Fatalf("shard %d: heap order broken at %d", i, j)
					}
				}
			}
			for key, n := range exact {
				i := s.shardIndex(key.id)
				if bound := s.shards[i].seen / uint64(cap(s.shards[i].counters)); n > bound && !counted[key] {
					t.Errorf("%v seen %d times, above its shard's N/k %d, not counted", key, n, bound)
				}
			}
		})
	}
}

// TestSketchBoundedUnderAMillionIdentifiers: a million distinct
// identifiers, each denied once, and five heavy hitters denied tens of
// thousands of times, spread through the stream or arriving only in its
// second half, once the counters are full and their counts high. The
// sketch holds at most K entries whatever it saw; the heavy hitters come
// out on top with counts within their error bounds; the heap grows by what
// K entries hold, not by the million.
func TestSketchBoundedUnderAMillionIdentifiers(t *testing.T) {
	const distinct, k = 1_000_000, DefaultTopK
	// Each is above N/K (N ≈ 1.33M) even if every heavy hitter lands in
	// the same shard, where Space-Saving guarantees it a counter.
	heavy := map[string]uint64{"abuser-1": 100_000, "abuser-2": 80_000, "abuser-3": 60_000, "abuser-4": 50_000, "abuser-5": 40_000}
	var stream []string
	for id, n := range heavy {
		for range n {
			stream = append(stream, id)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rng.Shuffle(len(stream), func(i, j int) { stream[i], stream[j] = stream[j], stream[i] })
	ids := make([]string, distinct) // made before the measure: the caller's strings
	for i := range ids {
		ids[i] = "user:" + strconv.Itoa(i)
	}

	for _, tc := range []struct {
		name  string
		start int // the heavy hitters' first denial comes after ids[start]
	}{{"spread", 0}, {"late", distinct / 2}} {
		t.Run(tc.name, func(t *testing.T) {
			before := heapInUse()
			s := newSketch(k)
			next := 0
			for i, id := range ids {
				s.add("api", id, kindDenied)
				if i < tc.start {
					continue
				}
				// The heavy hitters' denials, spread evenly between the
				// others from start on.
				for end := (i + 1 - tc.start) * len(stream) / (distinct - tc.start); next < end; next++ {
					s.add("api", stream[next], kindDenied)
				}
			}
			after := heapInUse()
			runtime.KeepAlive(s)

			if n := s.len(); n > k {
				t.Fatalf("the sketch holds %d entries, more than K=%d", n, k)
			}
			top, tot := s.top()
			if want := uint64(distinct + len(stream)); tot.seen != want {
				t.Errorf("seen %d, want %d", tot.seen, want)
			}
			for i, e := range top[:len(heavy)] {
				trueCount, ok := heavy[e.Key.id]
				if !ok {
					t.Errorf("rank %d is %q, not a heavy hitter", i+1, e.Key.id)
					continue
				}
				if e.Count < trueCount || e.Count-e.Err > trueCount {
					t.Errorf("%s: count %d err %d, true count %d outside [count-err, count]", e.Key.id, e.Count, e.Err, trueCount)
				}
				sh := &s.shards[s.shardIndex(e.Key.id)]
				if bound := sh.seen / uint64(cap(sh.counters)); e.Err > bound {
					t.Errorf("%s: err %d above its shard's N/k %d", e.Key.id, e.Err, bound)
				}
			}
			grown := int64(after) - int64(before)
			// K entries of short keys, with their index and heap: tens of
			// KiB. A sketch that kept every identifier would hold ~100 MiB.
			if grown > 1<<20 {
				t.Errorf("the heap grew by %d bytes over a million identifiers, want under 1 MiB", grown)
			}
			t.Logf("%d distinct identifiers and %d heavy denials: %d entries held in %d shards, heap grew %d bytes (%.1f KiB)",
				distinct, len(stream), s.len(), len(s.shards), grown, float64(grown)/1024)
			for _, e := range top[:len(heavy)] {
				t.Logf("  %s: count %d err %d, true %d", e.Key.id, e.Count, e.Err, heavy[e.Key.id])
			}
		})
	}
	runtime.KeepAlive(ids)
	runtime.KeepAlive(stream)
}

// TestSketchConcurrent: adds from many goroutines lose nothing (run with
// -race).
func TestSketchConcurrent(t *testing.T) {
	s := newSketch(64)
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 2000 {
				s.add("api", fmt.Sprint("id-", (g*31+i)%300), kindCached)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		for range 50 {
			s.top()
		}
	}()
	wg.Wait()
	top, tot := s.top()
	if tot.seen != 32000 || tot.kinds[kindCached] != 32000 {
		t.Fatalf("seen %d, want 32000", tot.seen)
	}
	var sum uint64
	for _, e := range top {
		sum += e.Count
	}
	if sum != 32000 {
		t.Errorf("counts add up to %d, want 32000", sum)
	}
	s.reset()
	if top, tot := s.top(); len(top) != 0 || tot.seen != 0 {
		t.Errorf("after reset: %d entries, %d seen", len(top), tot.seen)
	}
}

func heapInUse() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}
