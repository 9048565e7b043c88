package testkit

import (
	"context"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// SkewedClock is the wall clock moved by Offset: a host whose clock is off.
type SkewedClock struct{ Offset time.Duration }

// Now returns the wall clock's time plus Offset.
func (c SkewedClock) Now() time.Time { return time.Now().Add(c.Offset) }

// RealClockSkew checks, in real time, that a store's expiry never loses
// live state between two hosts whose clocks differ by skew. Host A, ahead
// by skew, spends the whole of a 3-per-2-s limit at once (an anchored
// window, and GCRA); the store's keys then carry A's idea of their expiry.
// Once B's clock reaches the moment A spent it (skew later, in real time),
// B must find the limit spent and be denied: an expired key would admit
// it. Both throttlers share one store through backends from newBackend.
// It takes skew plus a fraction of a second.
func RealClockSkew(t *testing.T, newBackend func(t *testing.T) driver.Backend, skew time.Duration) {
	t.Helper()
	for _, name := range SkewLosses(t, newBackend, skew) {
		t.Errorf("%s: host B, %v behind, was allowed once its clock reached host A's spent limit: the store lost it", name, skew)
	}
}

// SkewLosses runs RealClockSkew's scenario and returns the names of the
// policies whose spent state host B did not find.
func SkewLosses(t *testing.T, newBackend func(t *testing.T) driver.Backend, skew time.Duration) []string {
	t.Helper()
	ctx := context.Background()
	// The property is the store's expiry, not its latency: CallTimeout, so
	// that a loaded -race run is not read as lost state.
	a := Throttler(t, newBackend(t), throttler.WithClock(SkewedClock{Offset: skew}), throttler.WithLogger(nil), throttler.WithCallTimeout(CallTimeout))
	b := Throttler(t, newBackend(t), throttler.WithClock(SkewedClock{}), throttler.WithLogger(nil), throttler.WithCallTimeout(CallTimeout))
	policies := []*throttler.Policy{
		Policy(t, "skew-window", "3/2s"),
		Policy(t, "skew-gcra", "3/2s gcra"),
	}
	for _, p := range policies {
		for i := range 3 {
			r, err := a.Allow(ctx, p, "shared")
			if err != nil || !r.Allowed || r.Degraded {
				t.Fatalf("%s: host A's request %d: allowed %v, degraded %v, %v %v", p.Name(), i, r.Allowed, r.Degraded, err, r.Err)
			}
		}
	}
	time.Sleep(skew + 100*time.Millisecond)
	var lost []string
	for _, p := range policies {
		r, err := b.Allow(ctx, p, "shared")
		if err != nil || r.Degraded {
			t.Fatalf("%s: host B: %v %v", p.Name(), err, r.Err)
		}
		if r.Allowed {
			lost = append(lost, p.Name())
		}
	}
	return lost
}
