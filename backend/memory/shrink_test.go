package memorybackend

import (
	"context"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

type fixedClock struct{ now time.Time }

func (c *fixedClock) Now() time.Time { return c.now }

// TestSweepShrinksTheMaps: after a burst of identifiers expires, a sweep
// replaces each shard's map by one sized for what is left, so the heap
// falls back (Go maps never shrink on their own).
func TestSweepShrinksTheMaps(t *testing.T) {
	t0 := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	clock := &fixedClock{now: t0}
	b := New(WithSweepClock(clock))
	l, err := driver.NewLimit("", driver.FixedWindow, 5, time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	p, err := driver.NewPolicy("api", l)
	if err != nil {
		t.Fatal(err)
	}
	const burst = 200_000
	ctx := context.Background()
	for i := range burst {
		if _, err := b.Decide(ctx, driver.Request{Policy: p, Identifier: "burst:" + strconv.Itoa(i), Cost: 1, Now: t0}); err != nil {
			t.Fatal(err)
		}
	}
	heapAt := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapInuse
	}
	full := heapAt()
	// Every state has stopped mattering, grace included.
	clock.now = t0.Add(time.Second + gracePeriod + time.Second)
	if !b.sweepAll() {
		t.Fatal("sweepAll did not sweep")
	}
	if b.Len() != 0 {
		t.Fatalf("%d pairs left after the sweep, want 0", b.Len())
	}
	for i := range b.shards {
		if sh := &b.shards[i]; sh.peak != 0 {
			t.Fatalf("shard %d: peak %d after the sweep, want a new, empty map", i, sh.peak)
		}
	}
	swept := heapAt()
	t.Logf("heap in use: %d MiB with %d identifiers, %d MiB after they expired (%.0f bytes per identifier)",
		full>>20, burst, swept>>20, float64(full-min(swept, full))/burst)
}
