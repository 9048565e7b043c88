package memcachedbackend

import (
	"fmt"
	"strconv"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// This file holds GCRA limits: compare-and-swap writes of the theoretical
// arrival time, with bounded retries.

// gcraAllows reports whether GCRA limit i alone allows the request on
// state s, by the reference arithmetic.
func (c *call) gcraAllows(i int, s driver.State) bool {
	states := make([]driver.State, len(c.limits))
	states[i] = s
	allowed := driver.Decide(c.policy, c.req.Now, c.req.Cost, states)
	return allowed
}

// consumeGCRA takes the request's units from GCRA limit i by
// compare-and-swap (add when absent), rereading and recomputing after each
// lost race. It reports false when the limit denies on the state read.
func (c *call) consumeGCRA(i int) (allowed bool, err error) {
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
		err := c.writeGCRA(i, next[i].End)
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
		if err := c.rereadGCRA(i); err != nil {
			return false, err
		}
	}
}

// refundGCRA gives back n units of GCRA limit i (reference Refund
// arithmetic) by compare-and-swap, rereading after each lost race.
func (c *call) refundGCRA(i int, n int64) error {
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
		err := c.writeGCRA(i, next.End)
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
		if err := c.rereadGCRA(i); err != nil {
			return err
		}
	}
}

// writeGCRA stores tat for limit i over the item last read: add when it
// was absent, compare-and-swap otherwise.
func (c *call) writeGCRA(i int, tat int64) error {
	l := &c.limits[i]
	live := time.Duration(tat-c.nowUs) * time.Microsecond
	item := &memcache.Item{Key: c.keys.gcra(i), Value: []byte(strconv.FormatInt(tat, 10)),
		Expiration: expiration(live, 0, c.b.wall)}
	err := c.roundTrip(func() error {
		if l.item == nil {
			return c.b.client.Add(item)
		}
		item.CasID = l.item.CasID
		return c.b.client.CompareAndSwap(item)
	})
	if err != nil {
		return fmt.Errorf("memcached: write GCRA: %w", err)
	}
	l.item, l.state = nil, driver.State{End: tat}
	return nil
}

// rereadGCRA reads limit i's GCRA item again after a lost race.
func (c *call) rereadGCRA(i int) error {
	it, err := c.get(c.keys.gcra(i))
	if err != nil {
		return err
	}
	return c.setGCRAItem(i, it)
}
