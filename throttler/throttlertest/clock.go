package throttlertest

import (
	"sync"
	"time"
)

// ManualClock is a throttler.Clock that moves only when told to. Tests and
// examples use it to write deterministic timelines. It is safe for
// concurrent use.
type ManualClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []manualWaiter
}

// manualWaiter is a channel After returned, due at a clock reading.
type manualWaiter struct {
	due time.Time
	ch  chan time.Time
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
	c.fire()
	c.mu.Unlock()
}

// Advance moves the clock by d, which may be negative to model a clock that
// steps back, and returns the new reading.
func (c *ManualClock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	c.fire()
	return c.now
}

// After returns a channel that receives the clock's reading once the clock
// has moved d past the current reading, as time.After does on the wall
// clock; throttler.Throttler.Wait sleeps on it.
func (c *ManualClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	c.waiters = append(c.waiters, manualWaiter{due: c.now.Add(d), ch: ch})
	c.fire()
	return ch
}

// fire sends the reading to every waiter now due; c.mu is held.
func (c *ManualClock) fire() {
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if w.due.After(c.now) {
			kept = append(kept, w)
			continue
		}
		w.ch <- c.now
	}
	clear(c.waiters[len(kept):])
	c.waiters = kept
}

// Waiters returns how many channels After returned are still waiting for
// the clock to reach them: a test moves the clock once the code under test
// is asleep in throttler.Throttler.Wait, with no sleep of its own.
func (c *ManualClock) Waiters() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.waiters)
}
