package throttler

import (
	"fmt"
	"sync"
	"time"
)

// MaxTime is the latest clock reading a Throttler decides with: the start of
// 2200 UTC. Its Unix microseconds stay below 2^53, so every stored time is
// an exact integer even in a float64 (Redis Lua computes with those). The
// earliest is the Unix epoch.
var MaxTime = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)

// checkTime reports whether t is a clock reading the throttler decides
// with; the error wraps ErrClockOutOfRange.
func checkTime(t time.Time) error {
	if t.Before(time.Unix(0, 0)) || t.After(MaxTime) {
		return fmt.Errorf("%w: %v is outside [1970-01-01, %v]", ErrClockOutOfRange, t, MaxTime.Format(time.DateOnly))
	}
	return nil
}

// Clock supplies the time for every decision. Backends never read a clock
// of their own: the reading travels with each Request.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
}

// SystemClock is the wall clock, the default Clock of a Throttler.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// ManualClock is a Clock that moves only when told to. Tests and examples use
// it to write deterministic timelines. It is safe for concurrent use; the
// zero value reads as the zero time.
type ManualClock struct {
	mu  sync.Mutex
	now time.Time
}

// NewManualClock returns a ManualClock reading t.
func NewManualClock(t time.Time) *ManualClock { return &ManualClock{now: t} }

// Now returns the clock's current reading.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set moves the clock to t, forwards or backwards.
func (c *ManualClock) Set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}

// Advance moves the clock by d (which may be negative) and returns the new
// reading.
func (c *ManualClock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}
