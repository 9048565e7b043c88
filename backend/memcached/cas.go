package memcachedbackend

import (
	"bytes"
	"strconv"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// This file holds the limits whose whole state is one item written by
// compare-and-swap, with bounded retries: GCRA (the theoretical arrival
// time) and sliding windows ("used:end:prev").

// casAllows reports whether limit i alone allows the request on state s,
// by the reference arithmetic.
func (c *call) casAllows(i int, s driver.State) bool {
	states := make([]driver.State, len(c.limits))
	states[i] = s
	allowed := driver.Decide(c.policy, c.req.Now, c.req.Cost, states)
	return allowed
}

// consumeCAS takes the request's units from limit i (GCRA or sliding) by
// compare-and-swap (add when absent), rereading and recomputing after each
// lost race. It reports false when the limit denies on the state read.
func (c *call) consumeCAS(i int) (allowed bool, err error) {
	l := &c.limits[i]
	for attempt := 0; ; attempt++ {
		states := make([]driver.State, len(c.limits))
		states[i] = l.state
		next := append([]driver.State(nil), states...)
		allowed := driver.Decide(c.policy, c.req.Now, c.req.Cost, next)
		if !allowed {
			return false, nil
		}
		if c.b.hooks.beforeCAS != nil {
			c.b.hooks.beforeCAS()
		}
		err := c.writeCAS(i, next[i])
		if err == nil {
			c.undo = append(c.undo, undoStep{limit: i, units: c.req.Cost})
			return true, nil
		}
		if !lostRace(err) {
			return false, err
		}
		c.b.stats.casConflicts.Add(1)
		if attempt >= c.b.casRetries {
			return false, c.exhausted()
		}
		if err := c.backoff(attempt); err != nil {
			return false, err
		}
		if err := c.rereadCAS(i); err != nil {
			return false, err
		}
	}
}

// refundCAS gives back n units of limit i (GCRA or sliding; reference
// Refund arithmetic) by compare-and-swap, rereading after each lost race.
func (c *call) refundCAS(i int, n int64) error {
	l := &c.limits[i]
	for attempt := 0; ; attempt++ {
		if l.item == nil {
			return nil
		}
		states := make([]driver.State, len(c.limits))
		states[i] = l.state
		driver.Refund(c.policy, c.req.Now, n, states)
		next := states[i]
		if next == l.state {
			return nil
		}
		err := c.writeCAS(i, next)
		if err == nil {
			l.state = next
			return nil
		}
		if !lostRace(err) {
			return err
		}
		c.b.stats.casConflicts.Add(1)
		if attempt >= c.b.casRetries {
			return c.exhausted()
		}
		if err := c.backoff(attempt); err != nil {
			return err
		}
		if err := c.rereadCAS(i); err != nil {
			return err
		}
	}
}

// writeCAS stores state s for limit i over the item last read: add when it
// was absent, compare-and-swap otherwise.
func (c *call) writeCAS(i int, s driver.State) error {
	l := &c.limits[i]
	var value []byte
	var live time.Duration
	if l.limit.Algorithm == driver.SlidingWindow {
		value = encodeSliding(s)
		// The next window still weighs this one's count.
		live = time.Duration(s.End+l.limit.WindowMillis-c.nowMs) * time.Millisecond
	} else {
		value = []byte(strconv.FormatInt(s.End, 10))
		live = time.Duration(s.End-c.nowUs) * time.Microsecond
	}
	item := &memcache.Item{Key: c.keys.cas(i), Value: value, Expiration: expiration(live, 0, c.b.wall)}
	err := c.roundTrip(func() error {
		if l.item == nil {
			return c.mc.Add(item)
		}
		item.CasID = l.item.CasID
		return c.mc.CompareAndSwap(item)
	})
	if err != nil {
		return driver.Errorf("throttlekit: memcached: write %s state: %w", l.limit.Algorithm, err)
	}
	l.item, l.state = nil, s
	return nil
}

// encodeSliding returns a sliding-window item's value, "used:end:prev".
func encodeSliding(s driver.State) []byte {
	b := strconv.AppendInt(nil, s.Used, 10)
	b = append(b, ':')
	b = strconv.AppendInt(b, s.End, 10)
	b = append(b, ':')
	return strconv.AppendInt(b, s.Prev, 10)
}

// parseSliding reads a sliding-window item's value.
func parseSliding(v []byte) (driver.State, bool) {
	parts := bytes.Split(v, []byte(":"))
	if len(parts) != 3 {
		return driver.State{}, false
	}
	var s driver.State
	for j, f := range []*int64{&s.Used, &s.End, &s.Prev} {
		n, ok := parseInt(parts[j])
		if !ok {
			return driver.State{}, false
		}
		*f = n
	}
	return s, true
}

// rereadCAS reads limit i's item again after a lost race.
func (c *call) rereadCAS(i int) error {
	it, err := c.get(c.keys.cas(i))
	if err != nil {
		return err
	}
	return c.setCASItem(i, it)
}
