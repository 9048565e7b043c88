package memcachedbackend

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// This file holds Seed: merging states another store decided into the
// stored ones, limit by limit, each by compare-and-swap on one item (see
// "Seeding" in the package documentation).

// Seed implements driver.Seeder. It merges given into the stored states
// as driver.Merge does, one limit after another, each limit in one atomic
// step (a compare-and-swap on one item), and then, for a cost above zero,
// decides req.Cost as Decide does. The merge and the decision are two
// steps, not one: see "Seeding" in the package documentation for what a
// concurrent request can see between them. Outcome.Prior holds each
// limit's state just before its merge. A lost compare-and-swap is retried
// up to WithCASRetries times, then the call fails with an error wrapping
// ErrRetriesExhausted; given states that do not match the policy are an
// error wrapping driver.ErrInvalidState, and nothing is written.
func (b *Backend) Seed(ctx context.Context, req driver.Request, given []driver.State) (driver.Outcome, error) {
	if req.Policy.Valid() {
		if err := driver.CheckGiven(req.Policy, given); err != nil {
			return driver.Outcome{}, err
		}
	}
	c, err := b.newCall(ctx, req)
	if err != nil {
		return driver.Outcome{}, err
	}
	if c.needsTurn() {
		if err := c.takeTurn(); err != nil {
			return driver.Outcome{}, err
		}
		defer c.endTurn()
	}
	if err := c.snapshot(); err != nil {
		return driver.Outcome{}, err
	}
	// The counters of the open windows, in one round trip; a window whose
	// merge must be retried reads its own again.
	if err := c.readCounters(); err != nil {
		return driver.Outcome{}, err
	}
	prior := make([]driver.State, len(c.limits))
	after := make([]driver.State, len(c.limits))
	for i := range c.limits {
		var err error
		if c.limits[i].cas {
			prior[i], after[i], err = c.seedCAS(i, given[i])
		} else {
			prior[i], after[i], err = c.seedWindow(i, given[i])
		}
		if err != nil {
			return driver.Outcome{}, err
		}
	}
	if req.Cost == 0 {
		allowed := driver.Decide(c.policy, req.Now, 0, append([]driver.State(nil), after...))
		return driver.Outcome{Allowed: allowed, States: after, Prior: prior}, nil
	}
	out, err := b.decide(ctx, req, c.holdsTurn)
	if err != nil {
		return driver.Outcome{}, err
	}
	out.Prior = prior
	return out, nil
}

// merged returns held merged with given for limit i alone, by
// driver.Merge, and whether the merge changed it.
func (c *call) merged(i int, held, given driver.State) (driver.State, bool) {
	h := make([]driver.State, len(c.limits))
	g := make([]driver.State, len(c.limits))
	h[i], g[i] = held, given
	changed := driver.Merge(c.policy, c.req.Now, h, g)
	return h[i], changed
}

// seedCAS merges given into limit i's GCRA or sliding-window item: the
// item as read, merged, written back by compare-and-swap (add when
// absent), rereading after each lost race. It returns the state read and
// the state after.
func (c *call) seedCAS(i int, given driver.State) (prior, after driver.State, err error) {
	l := &c.limits[i]
	for attempt := 0; ; attempt++ {
		held := l.state
		next, changed := c.merged(i, held, given)
		if !changed {
			return held, held, nil
		}
		if c.b.hooks.beforeSeedWrite != nil {
			c.b.hooks.beforeSeedWrite()
		}
		err := c.writeCAS(i, next)
		if err == nil {
			return held, next, nil
		}
		if !lostRace(err) {
			return driver.State{}, driver.State{}, err
		}
		if err := c.seedConflict(attempt); err != nil {
			return driver.State{}, driver.State{}, err
		}
		if err := c.rereadCAS(i); err != nil {
			return driver.State{}, driver.State{}, err
		}
	}
}

// seedConflict counts a seed's lost race and waits before the next
// attempt, or fails once the retries are spent.
func (c *call) seedConflict(attempt int) error {
	c.b.stats.casConflicts.Add(1)
	if attempt >= c.b.casRetries {
		return c.exhausted()
	}
	return c.backoff(attempt)
}

// seedWindow merges given into fixed-window limit i. The state held is
// the window its item leads to (through forward markers) with the count
// of that window's counter; a count above Max reads as Max (units above
// Max belong to requests about to give them back). Then:
//
//   - the merge changes nothing: nothing is written;
//   - no window is open: the given window is opened, a new counter
//     holding its count published in the window item, as a request opens
//     one;
//   - a window is open: it is replaced, by a new counter holding the
//     merged state (the open window's End with the larger count: Merge
//     never moves an open window's End), which the open window's counter is swapped for a
//     forward marker to (compare-and-swap over the counter as read, so
//     the swap fails if anyone counted in between), and the window item
//     is then pointed at the new counter.
//
// Each lost race rereads the window item and starts again.
func (c *call) seedWindow(i int, given driver.State) (prior, after driver.State, err error) {
	l := &c.limits[i]
	for attempt := 0; ; attempt++ {
		var stored, held driver.State
		if l.open {
			stored = l.state
			held = driver.State{Used: min(stored.Used, l.limit.Max), End: stored.End}
		}
		if _, changed := c.merged(i, stored, given); !changed {
			after, _ := c.merged(i, held, given)
			return held, after, nil
		}
		next, _ := c.merged(i, held, given)
		if c.b.hooks.beforeSeedWrite != nil {
			c.b.hooks.beforeSeedWrite()
		}
		var done bool
		if l.open {
			done, err = c.replaceWindow(i, stored, next)
		} else {
			done, err = c.openSeeded(i, next)
		}
		if err != nil {
			return driver.State{}, driver.State{}, err
		}
		if done {
			return held, next, nil
		}
		if err := c.seedConflict(attempt); err != nil {
			return driver.State{}, driver.State{}, err
		}
		if err := c.rereadWindow(i); err != nil {
			return driver.State{}, driver.State{}, err
		}
	}
}

// rereadWindow reads limit i's window item again, and the counter it
// leads to when the window is open.
func (c *call) rereadWindow(i int) error {
	it, err := c.get(c.keys.window(i))
	if err != nil {
		return err
	}
	if err := c.setWindowItem(i, it); err != nil {
		return err
	}
	if !c.limits[i].open {
		return nil
	}
	counter, err := c.get(c.keys.counter(i, c.limits[i].win))
	if err != nil {
		return err
	}
	return c.setCounter(i, counter)
}

// openSeeded opens window next.End of limit i holding next.Used: a new
// counter, then the window item written to name it, by add when the item
// was absent and compare-and-swap over the closed or countless window it
// held. It reports false when another request wrote the item first; the
// unpublished counter is then deleted.
func (c *call) openSeeded(i int, next driver.State) (done bool, err error) {
	l := &c.limits[i]
	w := window{end: next.End, token: newToken()}
	live := time.Duration(w.end-c.nowMs) * time.Millisecond
	counter := c.keys.counter(i, w)
	if done, err := c.addCounter(counter, next.Used, live); !done || err != nil {
		return false, err
	}
	item := &memcache.Item{Key: c.keys.window(i), Value: w.encode(), Expiration: expiration(live, 0, c.b.wall)}
	err = c.roundTrip(func() error {
		if l.item == nil {
			return c.mc.Add(item)
		}
		item.CasID = l.item.CasID
		return c.mc.CompareAndSwap(item)
	})
	switch {
	case err == nil:
		l.item, l.open, l.win, l.counter = nil, true, w, nil
		l.state, l.known = next, true
		return true, nil
	case lostRace(err):
		_ = c.roundTrip(func() error { return c.mc.Delete(counter) })
		return false, nil
	}
	// The item may have been stored: then it names the counter, which
	// must stay.
	return false, driver.Errorf("throttlekit: memcached: publish seeded window: %w", err)
}

// replaceWindow replaces limit i's open window, whose counter l.counter
// holds stored, with next: a new counter holding next.Used, then the open
// counter swapped, by compare-and-swap over its read, for a forward
// marker naming the new one. The swap is the merge's atomic step: any
// incr or decr since the read fails it, and after it no incr or decr can
// count in the old counter (memcached refuses them on a value that is not
// a number), so every request that reads the old window counts in the new
// one. The window item is then pointed at the new counter (best effort:
// readers follow the marker anyway). It reports false when the swap lost a
// race; the unpublished counter is then deleted.
func (c *call) replaceWindow(i int, stored, next driver.State) (done bool, err error) {
	l := &c.limits[i]
	if l.counter == nil {
		return false, nil
	}
	w := window{end: next.End, token: newToken()}
	live := time.Duration(w.end-c.nowMs) * time.Millisecond
	counter := c.keys.counter(i, w)
	if done, err := c.addCounter(counter, next.Used, live); !done || err != nil {
		return false, err
	}
	old := *l.counter
	old.Value = w.forward()
	// The marker lasts as long as either window: whoever still reads the
	// old one must find the way to the new one.
	old.Expiration = expiration(time.Duration(max(stored.End, w.end)-c.nowMs)*time.Millisecond, 1, c.b.wall)
	err = c.roundTrip(func() error { return c.mc.CompareAndSwap(&old) })
	switch {
	case err == nil:
		if l.item != nil {
			c.publishWindow(i, l.item, w)
		}
		l.item, l.win, l.counter = nil, w, nil
		l.state, l.known = next, true
		return true, nil
	case lostRace(err):
		_ = c.roundTrip(func() error { return c.mc.Delete(counter) })
		return false, nil
	}
	// The swap may have been applied: then the marker names the counter,
	// which must stay.
	return false, driver.Errorf("throttlekit: memcached: forward window: %w", err)
}

// addCounter creates counter key holding used, to live a second longer
// than its window item (live). It reports false on a token collision
// with a live counter, for the caller to try again under another token.
func (c *call) addCounter(key string, used int64, live time.Duration) (bool, error) {
	err := c.roundTrip(func() error {
		return c.mc.Add(&memcache.Item{
			Key:        key,
			Value:      []byte(strconv.FormatInt(used, 10)),
			Expiration: expiration(live, 1, c.b.wall),
		})
	})
	if errors.Is(err, memcache.ErrNotStored) {
		return false, nil
	}
	if err != nil {
		return false, driver.Errorf("throttlekit: memcached: add counter: %w", err)
	}
	return true, nil
}
