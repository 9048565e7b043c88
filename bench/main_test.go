package main

import (
	"context"
	"testing"
	"time"
)

// The harness measures an in-process cell without any server: the figures
// are there and consistent (a run made calls, the percentiles are ordered).
func TestRunCellInProcess(t *testing.T) {
	cfg := config{duration: 50 * time.Millisecond, warmUp: 10 * time.Millisecond, runs: 1, goroutines: 4, identifiers: 100}
	for _, c := range []cell{
		{path: pathMemory64, impl: "x/time/rate", peer: true, setup: xrate},
		{path: pathMemory64, impl: "throttled (memstore)", peer: true, setup: throttledMemory},
	} {
		r := runCell(context.Background(), cfg, &env{}, c)
		if r.err != "" {
			t.Fatalf("%s: %s", c.impl, r.err)
		}
		if r.rate <= 0 || r.p50 <= 0 || r.p99 < r.p50 {
			t.Errorf("%s: rate %v, p50 %v, p99 %v", c.impl, r.rate, r.p50, r.p99)
		}
	}
}
