package driver

import (
	"math/rand/v2"
	"testing"
	"time"
)

// TestSlidingAgreesWithBruteForce checks the sliding window's closed forms
// (allow, Remaining, RetryAfter) against a search over every millisecond.
func TestSlidingAgreesWithBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := 0; iter < 3000; iter++ {
		max := int64(1 + rng.IntN(20))
		w := time.Duration(1+rng.IntN(50)) * time.Millisecond
		l, err := NewLimit("", SlidingWindow, max, w, 0)
		if err != nil {
			t.Fatal(err)
		}
		p, _ := NewPolicy("p", l)
		nowMs := int64(1_000_000 + rng.IntN(1000))
		end := slidingEnd(&l, nowMs)
		cur := int64(rng.IntN(int(max) + 1))
		prev := int64(rng.IntN(int(max) + 1))
		s := State{Used: cur, End: end, Prev: prev}
		switch rng.IntN(6) { // a window ahead, the previous one, an old one
		case 0:
			s.End = end + l.WindowMillis*int64(1+rng.IntN(2))
		case 1:
			s.End = end - l.WindowMillis
		case 2:
			s.End = end - 2*l.WindowMillis
		}
		cost := int64(1 + rng.IntN(int(max)))
		now := time.UnixMilli(nowMs)
		st := Evaluate(&l, s, now, cost, false)
		if st.Allowed {
			if cost > st.Remaining {
				t.Fatalf("allowed cost %d > remaining %d", cost, st.Remaining)
			}
			continue
		}
		if cost <= st.Remaining {
			t.Fatalf("denied cost %d <= remaining %d", cost, st.Remaining)
		}
		// The first ms at which the same request, with no other traffic,
		// is allowed.
		first := int64(-1)
		for ms := nowMs; ms <= nowMs+5*l.WindowMillis; ms++ {
			if Decide(p, time.UnixMilli(ms), cost, []State{s}) {
				first = ms
				break
			}
		}
		if got := st.RetryAfter.Milliseconds(); first < 0 || got != first-nowMs {
			t.Fatalf("max %d w %v cur %d prev %d cost %d at %d (end %d): RetryAfter %dms, brute force %d", max, w, cur, prev, cost, nowMs, end, got, first-nowMs)
		}
	}
}
