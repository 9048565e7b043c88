package throttler

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// randomLimitState returns a limit of a random algorithm and a state for
// it around nowMs: open or closed windows, counts below, at and above Max
// (a lowered limit), negative counts, TATs behind and ahead of now.
func randomLimitState(t *testing.T, rng *rand.Rand, i int, nowMs int64) (driver.Limit, driver.State) {
	t.Helper()
	algs := []driver.Algorithm{driver.FixedWindow, driver.AlignedWindow, driver.GCRA, driver.SlidingWindow}
	alg := algs[rng.IntN(len(algs))]
	maxN := 1 + rng.Int64N(20)
	window := time.Duration(1+rng.IntN(3000)) * time.Millisecond
	var burst int64
	if alg == driver.GCRA && rng.IntN(2) == 0 {
		burst = 1 + rng.Int64N(40)
	}
	l, err := driver.NewLimit(string(rune('a'+i)), alg, maxN, window, burst)
	if err != nil {
		t.Fatal(err)
	}
	w := l.WindowMillis
	var s driver.State
	switch rng.IntN(4) {
	case 0: // nothing stored
	case 1: // a closed window, an old TAT
		s = driver.State{Used: rng.Int64N(maxN + 3), End: nowMs - rng.Int64N(2*w+1), Prev: rng.Int64N(maxN + 1)}
	default: // open, possibly over Max or negative
		s = driver.State{Used: rng.Int64N(maxN+5) - 2, End: nowMs + 1 + rng.Int64N(w), Prev: rng.Int64N(maxN + 1)}
	}
	if alg == driver.GCRA {
		s = driver.State{End: nowMs*1000 + rng.Int64N(l.Capacity*l.EmissionMicros*2+1) - l.EmissionMicros}
	}
	return l, s
}

// TestRemainingAndResetMatchEvaluate: the figures the binding limit is
// picked by are Evaluate's, for every algorithm and any state.
func TestRemainingAndResetMatchEvaluate(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 20000 {
		now := time.UnixMicro(1_700_000_000_000_000 + rng.Int64N(10_000_000))
		nowMs := now.UnixMilli()
		l, s := randomLimitState(t, rng, 0, nowMs)
		st := driver.Evaluate(&l, s, now, 0, true)
		rem, reset := remainingAndReset(&l, s, now, nowMs)
		if rem != st.Remaining || reset != st.ResetAt.UnixMicro() {
			t.Fatalf("%+v, %+v at %d: got %d, %d; Evaluate says %d, %d",
				l, s, nowMs, rem, reset, st.Remaining, st.ResetAt.UnixMicro())
		}
	}
}

// TestBindingLimitOfAnAllowedDecision: an allowed decision's result, whose
// binding limit is picked without evaluating every limit in full, is the
// one evaluating every limit gives: the smallest Remaining, ties to the
// latest ResetAt, with that limit's figures.
func TestBindingLimitOfAnAllowedDecision(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	ties := 0
	for range 5000 {
		now := time.UnixMicro(1_700_000_000_000_000 + rng.Int64N(10_000_000))
		n := 2 + rng.IntN(inlineLimits-1)
		limits := make([]driver.Limit, n)
		states := make([]driver.State, n)
		for i := range n {
			limits[i], states[i] = randomLimitState(t, rng, i, now.UnixMilli())
		}
		if rng.IntN(3) == 0 {
			// The same figures under another name and key: a tie on
			// Remaining and ResetAt, or on Remaining alone.
			l0 := limits[0]
			window := l0.Window
			if rng.IntN(2) == 0 {
				window += time.Duration(1+rng.IntN(1000)) * time.Millisecond
			}
			var burst int64
			if l0.Algorithm == driver.GCRA {
				burst = l0.Capacity
			}
			l, err := driver.NewLimit("tie", l0.Algorithm, l0.Max, window, burst)
			if err != nil {
				t.Fatal(err)
			}
			limits[1], states[1] = l, states[0]
			ties++
		}
		p, err := driver.NewPolicy("p", limits...)
		if err != nil {
			t.Fatal(err)
		}
		cost := rng.Int64N(2)
		got := evaluated(p, now, cost, true, states)
		keep := -1
		var want driver.Status
		for i := range n {
			st := driver.Evaluate(&p.Limits[i], states[i], now, cost, true)
			if keep < 0 || st.Remaining < want.Remaining || st.Remaining == want.Remaining && st.ResetAt.After(want.ResetAt) {
				keep, want = i, st
			}
		}
		if got.Binding != p.Limits[keep].Name || got.Remaining != want.Remaining || got.Used != want.Used ||
			got.Limit != want.Limit || !got.ResetAt.Equal(want.ResetAt) || got.RetryAfter != 0 || !got.Allowed {
			t.Fatalf("%+v, %+v: got %s %+v, want %s %+v", p.Limits, states, got.Binding, got, p.Limits[keep].Name, want)
		}
		for i := range n {
			if got.LimitAt(i).Remaining != driver.Evaluate(&p.Limits[i], states[i], now, cost, true).Remaining {
				t.Fatalf("limit %d's figures differ", i)
			}
		}
	}
	if ties == 0 {
		t.Fatal("no tie was tried")
	}
}
