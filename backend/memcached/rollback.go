package memcachedbackend

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// This file holds what a denied or failed request undoes: giving its units
// back, newest first, and retracting the windows it opened.

// deny gives back every unit the call took and returns the denial with
// every limit's state: fixed windows it touched as they were just before
// its units (absent when it opened them and retracted the opening), GCRA
// limits as the rollback left them, and the windows it did not reach read
// now (one round trip), so that the throttler can name the right binding
// limit. When the call's context ends before the give-back does, the
// states are computed from what the call knows.
func (c *call) deny() driver.Outcome {
	before := c.statesBeforeUnits()
	if !c.rollback() {
		return driver.Outcome{Allowed: false, States: before}
	}
	for _, u := range c.undo {
		if u.counter == "" {
			continue
		}
		l := &c.limits[u.limit]
		if l.retracted {
			l.open, l.state = false, driver.State{}
			continue
		}
		l.state = before[u.limit]
	}
	if err := c.readCounters(); err != nil {
		// The verdict stands; only those limits' figures are unknown.
		for i := range c.limits {
			if l := &c.limits[i]; !l.cas && l.open && !l.known {
				l.state = driver.State{}
			}
		}
	}
	return driver.Outcome{Allowed: false, States: c.states()}
}

// statesBeforeUnits returns the best-known states with this call's units
// taken out again by the reference arithmetic; open windows whose count
// was not read are unknown (zero), as when reading them fails.
func (c *call) statesBeforeUnits() []driver.State {
	states := c.states()
	for i := range c.limits {
		if l := &c.limits[i]; !l.cas && l.open && !l.known {
			states[i] = driver.State{}
		}
	}
	for _, u := range c.undo {
		if u.counter != "" {
			states[u.limit].Used = max(states[u.limit].Used-u.units, 0)
			continue
		}
		one := make([]driver.State, len(states))
		one[u.limit] = states[u.limit]
		driver.Refund(c.policy, c.req.Now, u.units, one)
		states[u.limit] = one[u.limit]
	}
	return states
}

// rollback gives back, newest first, every unit the call took, and
// retracts each window the call opened that nobody else counts in (see
// retract). It reports whether it finished.
//
// The give-back runs on a budget of its own (giveBackBudget), not on the
// call's context: a call denied or failed because its context ended must
// still give its units back, or a denial would consume. It runs in a
// goroutine of its own, and rollback waits for it only while the call's
// context lasts, so that a call still returns promptly once its context
// is done; the call then belongs to that goroutine. A give-back that fails
// (a server error, the budget spent) is counted in
// Stats.RollbackFailures; its units stay spent until their window closes,
// which can deny, never over-admit.
func (c *call) rollback() (finished bool) {
	if len(c.undo) == 0 {
		return true
	}
	callerCtx := c.ctx
	ctx, cancel := context.WithTimeout(context.WithoutCancel(callerCtx), c.b.giveBackBudget())
	c.ctx = ctx
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer cancel()
		c.giveBack()
		if c.b.hooks.afterGiveBack != nil {
			c.b.hooks.afterGiveBack()
		}
	}()
	select {
	case <-done:
	case <-callerCtx.Done():
		select {
		case <-done:
		default:
			return false
		}
	}
	c.ctx = callerCtx
	return true
}

// giveBack is rollback's work; see rollback.
func (c *call) giveBack() {
	for j := len(c.undo) - 1; j >= 0; j-- {
		u := c.undo[j]
		var err error
		if u.counter == "" {
			if err = c.rereadCAS(u.limit); err == nil {
				err = c.refundCAS(u.limit, u.units)
			}
		} else {
			var left int64
			left, err = c.incrDecr("decr", u.counter, u.units)
			switch {
			case errors.Is(err, memcache.ErrCacheMiss):
				err = nil // evicted: nothing left to give back or retract
			case serverRefused(err) && c.forwarded(u.counter):
				// A Seed replaced the window after these units were
				// counted, by a successor holding the seeded count, which
				// does not include them (see "Seeding"): nothing to give
				// back.
				err = nil
			case err == nil && u.opened && left == 0:
				err = c.retract(u)
			}
		}
		if err != nil {
			c.b.stats.rollbackFailures.Add(1)
		}
	}
}

// retract closes again window u.limit, which this call opened and whose
// units it has just given back, when nobody else counts in it: it reads
// the counter with its CAS id and, if it still holds zero, swaps in
// retractedValue. Any incr since the read changes the CAS id, so the swap
// fails exactly when someone counted in between; then, or when the
// counter holds units of others, the window stays open, theirs. After a
// swap, the window item still names the counter, and every request takes
// the window for absent and opens a new one (by compare-and-swap over that
// item), as after an eviction.
func (c *call) retract(u undoStep) error {
	if c.b.hooks.beforeRetract != nil {
		c.b.hooks.beforeRetract(u.counter)
	}
	live := time.Duration(u.end-c.nowMs) * time.Millisecond
	for attempt := 0; ; attempt++ {
		it, err := c.get(u.counter)
		if err != nil || it == nil {
			return err // nil when evicted: the window counts as absent already
		}
		if v, ok := parseInt(it.Value); !ok || v != 0 {
			return nil // someone else's units: their window now
		}
		it.Value = []byte(strconv.FormatInt(retractedValue, 10))
		it.Expiration = expiration(live, 1, c.b.wall)
		err = c.roundTrip(func() error { return c.mc.CompareAndSwap(it) })
		if err == nil {
			c.b.stats.openingsRetracted.Add(1)
			c.limits[u.limit].retracted = true
			return nil
		}
		if errors.Is(err, memcache.ErrCacheMiss) {
			return nil
		}
		if !lostRace(err) {
			return driver.Errorf("throttlekit: memcached: retract window: %w", err)
		}
		c.b.stats.casConflicts.Add(1)
		if attempt >= c.b.casRetries {
			// Not a failed call: the verdict stands, the window stays.
			return driver.Errorf("%w while retracting a window", ErrRetriesExhausted)
		}
		if err := c.backoff(attempt); err != nil {
			return err
		}
	}
}
