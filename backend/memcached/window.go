package memcachedbackend

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// This file holds the fixed-window protocol: taking units in an open
// window, and opening a window under a fresh token (docs/DESIGN.md, memcached).

// startsNow reports whether fixed window i, as last read, is one that
// starts at the request's now: an open window opened at that very reading,
// or a closed one whose successor would start then (every anchored one,
// and an aligned one whose slot begins at now). At one clock reading every
// request classes every limit the same way, whatever it read; see
// "Concurrency".
func (c *call) startsNow(i int) bool {
	l := &c.limits[i]
	end := driver.WindowEnd(&l.limit, c.nowMs)
	if l.open {
		end = l.win.end
	}
	return end-l.limit.Window.Milliseconds() == c.nowMs
}

// consumeWindow takes the request's units from fixed-window limit i: incr
// on the open window's counter, or, when no window is open, opening one.
// It reports stepDenied when the limit denies; the units then stay taken
// until rollback gives them back. A counter found evicted or retracted
// means the window must be opened again; when deferOpen is set and that
// window would start at now, the opening is left to the last rank
// (stepDeferred) instead of being made here.
func (c *call) consumeWindow(i int, deferOpen bool) (step, error) {
	l := &c.limits[i]
	n := c.req.Cost
	for opens, follows := 0, 0; ; {
		if l.open {
			key := c.keys.counter(i, l.win)
			v, err := c.incrDecr("incr", key, n)
			if serverRefused(err) && follows < maxForwards {
				// A counter that is not a number: a Seed forwarded it to
				// the window that replaced it (see "Seeding"). Count there.
				follows++
				live, ferr := c.follow(i, key, err)
				if ferr != nil {
					return stepDenied, ferr
				}
				if live {
					continue
				}
				err = errWindowGone
			}
			evicted := errors.Is(err, memcache.ErrCacheMiss)
			if evicted || errors.Is(err, errWindowGone) || err == nil && v >= retractedFloor {
				// The window item names a counter that is gone (evicted)
				// or retracted: the window counts as absent. Reopen it
				// rather than recreate the counter, so no incarnation ever
				// counts from zero twice (see "Eviction"). Units an incr
				// added to a retracted counter count nowhere.
				if evicted {
					c.b.stats.windowsLost.Add(1)
				}
				l.open, l.state, l.known, l.counter = false, driver.State{}, false, nil
				if deferOpen && c.startsNow(i) {
					return stepDeferred, nil
				}
				continue
			}
			if err != nil {
				return stepDenied, err
			}
			c.undo = append(c.undo, undoStep{limit: i, counter: key, units: n})
			l.state, l.known, l.consumed = driver.State{Used: v, End: l.win.end}, true, true
			if v <= l.limit.Max {
				return stepPassed, nil
			}
			if c.b.hooks.overLimit != nil {
				c.b.hooks.overLimit()
			}
			return stepDenied, nil
		}
		if opens > c.b.casRetries {
			return stepDenied, c.exhausted()
		}
		opens++
		opened, err := c.openWindow(i)
		if err != nil {
			return stepDenied, err
		}
		if opened {
			l.consumed = true
			return stepPassed, nil
		}
		// Lost the race to open: the window item now holds someone
		// else's window (or vanished); loop on what it holds.
	}
}

// errWindowGone marks, within consumeWindow, a forward chain that ended at
// no live window.
var errWindowGone = errors.New("throttlekit: memcached: forwarded window gone")

// follow reads counter key of limit i's window, which refused an incr or
// decr with refusal. When it holds a forward marker, the chain is followed
// to the live window, which becomes limit i's window, and the window item,
// as the call read it, is pointed at that window (best effort, so that
// later requests skip the chain even when the Seed that forwarded it
// stopped before doing so). It reports whether a live window was found;
// a counter that holds no forward marker returns refusal.
func (c *call) follow(i int, key string, refusal error) (live bool, err error) {
	l := &c.limits[i]
	it, err := c.get(key)
	if err != nil {
		return false, err
	}
	if it == nil {
		c.b.stats.windowsLost.Add(1)
		return false, nil
	}
	if _, ok := parseForward(it.Value); !ok {
		return false, refusal
	}
	w, counter, used, ok, err := c.chase(i, l.win, it)
	if err != nil || !ok {
		return false, err
	}
	l.win, l.counter = w, counter
	l.state, l.known = driver.State{Used: used, End: w.end}, true
	if l.item != nil {
		c.publishWindow(i, l.item, w)
	}
	return true, nil
}

// publishWindow points limit i's window item at incarnation w by
// compare-and-swap over item (the window item as read), best effort: when
// the item changed since, someone else wrote it, and a chain from what
// it names leads on to w or to a later window anyway.
func (c *call) publishWindow(i int, item *memcache.Item, w window) {
	live := time.Duration(w.end-c.nowMs) * time.Millisecond
	next := &memcache.Item{Key: c.keys.window(i), Value: w.encode(), Expiration: expiration(live, 0, c.b.wall), CasID: item.CasID}
	_ = c.roundTrip(func() error { return c.mc.CompareAndSwap(next) })
}

// openWindow opens a fresh window for limit i with the request's units
// already counted: it creates the counter of a new incarnation (add, under
// a fresh random token, so nobody else can hold it), then publishes the
// incarnation in the window item, with add when the snapshot saw no item
// and compare-and-swap over the closed (or countless) one it saw. Only one
// request can publish over a given item state. On losing it deletes its
// unpublished counter, rereads the window item and reports false.
func (c *call) openWindow(i int) (opened bool, err error) {
	l := &c.limits[i]
	n := c.req.Cost
	w := window{end: driver.WindowEnd(&l.limit, c.nowMs), token: newToken()}
	live := time.Duration(w.end-c.nowMs) * time.Millisecond
	counter := c.keys.counter(i, w)
	err = c.roundTrip(func() error {
		return c.mc.Add(&memcache.Item{
			Key:        counter,
			Value:      []byte(strconv.FormatInt(n, 10)),
			Expiration: expiration(live, 1, c.b.wall), // outlives the window item
		})
	})
	if errors.Is(err, memcache.ErrNotStored) {
		// A token collision with a live counter: retry with a new one.
		return false, nil
	}
	if err != nil {
		return false, driver.Errorf("throttlekit: memcached: add counter: %w", err)
	}
	if c.b.hooks.beforePublish != nil {
		c.b.hooks.beforePublish(counter)
	}
	item := &memcache.Item{Key: c.keys.window(i), Value: w.encode(), Expiration: expiration(live, 0, c.b.wall)}
	err = c.roundTrip(func() error {
		if l.item == nil {
			return c.mc.Add(item)
		}
		item.CasID = l.item.CasID
		return c.mc.CompareAndSwap(item)
	})
	opening := undoStep{limit: i, counter: counter, units: n, opened: true, end: w.end}
	if err == nil {
		c.undo = append(c.undo, opening)
		l.item, l.open, l.win = nil, true, w
		l.state, l.known = driver.State{Used: n, End: w.end}, true
		return true, nil
	}
	if !lostRace(err) {
		// A timeout or a broken connection does not say whether the
		// server stored the window item. It may have: then the item names
		// this counter, and deleting it would lose the units of anyone
		// who has read the item since. The rollback gives the units back
		// and retracts the counter only if it then holds nothing.
		c.undo = append(c.undo, opening)
		return false, driver.Errorf("throttlekit: memcached: publish window: %w", err)
	}
	// The server refused the item, so nothing names this counter.
	_ = c.roundTrip(func() error { return c.mc.Delete(counter) })
	c.b.stats.casConflicts.Add(1)
	it, err := c.get(c.keys.window(i))
	if err != nil {
		return false, err
	}
	return false, c.setWindowItem(i, it)
}

// newToken returns a fresh window token: 64 random bits in hex.
func newToken() string {
	return fmt.Sprintf("%016x", rand.Uint64())
}
