package throttlertest_test

import (
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

var _ throttler.Clock = (*throttlertest.ManualClock)(nil)

// TestAfterFiresWhenTheClockReachesIt: a timeline of Set and Advance,
// backwards included, and the channels After returned.
func TestAfterFiresWhenTheClockReachesIt(t *testing.T) {
	t0 := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	c := throttlertest.NewManualClock(t0)
	ch := c.After(time.Second)
	if c.Waiters() != 1 {
		t.Fatalf("Waiters = %d, want 1", c.Waiters())
	}
	if got := c.Advance(999 * time.Millisecond); !got.Equal(t0.Add(999 * time.Millisecond)) {
		t.Fatalf("Advance returned %v", got)
	}
	select {
	case <-ch:
		t.Fatal("fired before its time")
	default:
	}
	c.Advance(-time.Minute) // a clock stepping back fires nothing
	if c.Waiters() != 1 {
		t.Fatalf("Waiters = %d after stepping back", c.Waiters())
	}
	c.Set(t0.Add(time.Second))
	select {
	case at := <-ch:
		if !at.Equal(t0.Add(time.Second)) {
			t.Fatalf("fired with %v", at)
		}
	default:
		t.Fatal("did not fire at its time")
	}
	if c.Waiters() != 0 || !c.Now().Equal(t0.Add(time.Second)) {
		t.Fatalf("Waiters = %d, Now = %v", c.Waiters(), c.Now())
	}
	select {
	case <-c.After(0):
	default:
		t.Fatal("After(0) did not fire at once")
	}
}
