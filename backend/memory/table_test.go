package memorybackend

import (
	"math/rand/v2"
	"strconv"
	"testing"
)

// TestTableMatchesAMap drives a table and a Go map with the same random
// puts, deletions and sweeps, on hashes drawn from a few values so that
// identifiers collide, share homes and wrap around the array, and checks
// after every step that both hold the same identifiers and that every one
// is found.
func TestTableMatchesAMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	wraps := 0
	for round := range 20 {
		var tb table
		model := map[string]uint64{}
		// Few distinct hashes, spread over the array: long runs that wrap
		// around its end, collisions of the full hash.
		hashOf := func(id string) uint64 {
			n, _ := strconv.Atoi(id)
			return uint64(n%(3+round)+round) * 0x9e3779b97f4a7c15
		}
		wrapped := false
		for step := range 2000 {
			id := strconv.Itoa(rng.IntN(200))
			h := hashOf(id)
			switch op := rng.IntN(10); {
			case op < 6:
				if tb.get(h, id) == nil {
					tb.put(h, &idEntry{id: id})
					model[id] = h
				}
			case op < 9:
				if i := tb.find(h, id); i >= 0 {
					tb.deleteAt(i)
					delete(model, id)
				}
			default:
				// Sweep away about half, by a rule that gives the same
				// answer however often it is asked.
				cut := strconv.Itoa(rng.IntN(10))
				tb.sweep(func(ie *idEntry) bool { return ie.id[len(ie.id)-1:] > cut })
				for id := range model {
					if id[len(id)-1:] <= cut {
						delete(model, id)
					}
				}
				if rng.IntN(2) == 0 {
					tb.fit()
				}
			}
			if tb.n != len(model) {
				t.Fatalf("round %d step %d: table holds %d, model %d", round, step, tb.n, len(model))
			}
			if len(tb.slots) > 0 && tb.n*4 > len(tb.slots)*3 {
				t.Fatalf("round %d step %d: %d of %d slots used", round, step, tb.n, len(tb.slots))
			}
			for id, h := range model {
				if ie := tb.get(h, id); ie == nil || ie.id != id {
					t.Fatalf("round %d step %d: %q not found", round, step, id)
				}
			}
			used := 0
			for i, s := range tb.slots {
				if s.ie != nil {
					wrapped = wrapped || i < tb.home(s.hash)
					used++
					if _, ok := model[s.ie.id]; !ok {
						t.Fatalf("round %d step %d: %q held but deleted", round, step, s.ie.id)
					}
				}
			}
			if used != tb.n {
				t.Fatalf("round %d step %d: %d slots used, n = %d", round, step, used, tb.n)
			}
		}
		wraps += map[bool]int{true: 1}[wrapped]
	}
	if wraps == 0 {
		t.Fatal("no run of slots wrapped around the array's end: the test misses that case")
	}
}
