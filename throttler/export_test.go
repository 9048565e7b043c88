package throttler

// ManualClockWaiters returns how many After channels of c are still
// waiting, so that a test can move the clock once a waiter is asleep.
func ManualClockWaiters(c *ManualClock) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.waiters)
}
