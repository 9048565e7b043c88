package memcachedbackend

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// This file holds one operation on one identifier: what it read, what it
// took, and the round trips it makes.

// call is one operation on one identifier's policy: what was read, what was
// consumed, what must be undone on denial.
type call struct {
	b      *Backend
	ctx    context.Context
	req    driver.Request
	policy *driver.Policy
	keys   keys
	nowMs  int64
	nowUs  int64
	limits []limitCall
	// undo lists the units this call took, in order, for a rollback.
	undo []undoStep
	// srv is the server that holds every key of the call, and mc its
	// client.
	srv *server
	mc  *memcache.Client
	// holdsTurn is set while the call holds its identifier's turn (see
	// turns.go); borrowed marks a turn its caller holds and will end.
	holdsTurn, borrowed bool
}

// limitCall is what a call knows of one limit.
type limitCall struct {
	limit driver.Limit
	// cas marks a limit whose state is one item written by compare-and-swap
	// (GCRA, sliding window) rather than a window item and counters.
	cas bool
	// item is the window item (fixed) or the CAS item as last read, with
	// its CAS id; nil when absent.
	item *memcache.Item
	// open reports a fixed window open at now; win is its incarnation
	// (the one its counter forwards to, once followed).
	open bool
	win  window
	// counter is win's counter as last read, with its CAS id; nil when it
	// was not read.
	counter *memcache.Item
	// state is the best-known state; known reports that a fixed window's
	// Used was read or returned by the server.
	state driver.State
	known bool
	// consumed reports that this call's units are counted in the fixed
	// window; retracted, that the call opened the window and, denied,
	// closed it again.
	consumed, retracted bool
}

// undoStep is units to give back: a counter to decr or a GCRA limit to
// refund. opened marks a window the call opened itself, with its end.
type undoStep struct {
	limit   int
	counter string // empty for GCRA
	units   int64
	opened  bool
	end     int64
}

func (b *Backend) newCall(ctx context.Context, req driver.Request) (*call, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	// The throttler validated the request; this keeps a direct caller that
	// did not from sending nonsense to the servers.
	if !req.Policy.Valid() {
		return nil, driver.Errorf("%w: nil or zero policy", driver.ErrInvalidPolicy)
	}
	if req.Identifier == "" || req.Cost < 0 {
		return nil, driver.Errorf("%w: empty identifier or negative cost", driver.ErrInvalidOption)
	}
	c := &call{
		b: b, ctx: ctx, req: req, policy: req.Policy,
		keys:  newKeys(b.prefix, req.Policy, req.Identifier),
		nowMs: req.Now.UnixMilli(), nowUs: req.Now.UnixMicro(),
		limits: make([]limitCall, len(req.Policy.Limits)),
	}
	srv, err := b.serverOf(c.keys.route)
	if err != nil {
		return nil, err
	}
	c.srv, c.mc = srv, srv.client
	for i := range c.limits {
		l := req.Policy.Limits[i]
		c.limits[i] = limitCall{limit: l, cas: l.Algorithm == driver.GCRA || l.Algorithm == driver.SlidingWindow}
	}
	return c, nil
}

// roundTrip runs one gomemcache call on the call's server, which the
// client's Timeout bounds, unless the call's context is already done:
// gomemcache cannot be interrupted, so the context is honoured between
// round trips. The server's breaker, when open, answers at once with an
// error wrapping breaker.ErrOpen.
func (c *call) roundTrip(f func() error) error {
	if err := c.ctx.Err(); err != nil {
		return err
	}
	return c.srv.do(func() error {
		c.b.stats.roundTrips.Add(1)
		return f()
	})
}

// snapshot reads every window and GCRA item of the policy in one round
// trip (they share a server under RendezvousSelector).
func (c *call) snapshot() error {
	keys := make([]string, len(c.limits))
	for i := range c.limits {
		if c.limits[i].cas {
			keys[i] = c.keys.cas(i)
		} else {
			keys[i] = c.keys.window(i)
		}
	}
	var items map[string]*memcache.Item
	err := c.roundTrip(func() (err error) {
		items, err = c.mc.GetMulti(keys)
		return err
	})
	if err != nil {
		return driver.Errorf("throttlekit: memcached: get: %w", err)
	}
	for i := range c.limits {
		l := &c.limits[i]
		if l.cas {
			if err := c.setCASItem(i, items[c.keys.cas(i)]); err != nil {
				return err
			}
		} else if err := c.setWindowItem(i, items[c.keys.window(i)]); err != nil {
			return err
		}
	}
	return nil
}

// setWindowItem records a read of limit i's window item (nil: absent).
func (c *call) setWindowItem(i int, it *memcache.Item) error {
	l := &c.limits[i]
	l.item, l.open, l.win, l.known, l.state, l.counter = it, false, window{}, false, driver.State{}, nil
	if it == nil {
		return nil
	}
	w, ok := parseWindow(it.Value)
	if !ok {
		return driver.Errorf("%w: window item of limit %q holds %q", driver.ErrBadReply, l.limit.Name, clip(it.Value))
	}
	if w.end > c.nowMs {
		l.open, l.win, l.state = true, w, driver.State{End: w.end}
	}
	return nil
}

// setCASItem records a read of limit i's GCRA or sliding-window item
// (nil: absent).
func (c *call) setCASItem(i int, it *memcache.Item) error {
	l := &c.limits[i]
	l.item, l.state = it, driver.State{}
	if it == nil {
		return nil
	}
	if l.limit.Algorithm == driver.SlidingWindow {
		s, ok := parseSliding(it.Value)
		if !ok {
			return driver.Errorf("%w: sliding-window item of limit %q holds %q", driver.ErrBadReply, l.limit.Name, clip(it.Value))
		}
		l.state = s
		return nil
	}
	tat, ok := parseInt(it.Value)
	if !ok {
		return driver.Errorf("%w: GCRA item of limit %q holds %q", driver.ErrBadReply, l.limit.Name, clip(it.Value))
	}
	l.state = driver.State{End: tat}
	return nil
}

// readCounters reads, in one round trip, the counters of the open windows
// whose Used is not known yet, and follows those a Seed forwarded (one
// round trip per hop). A missing counter means the window lost its count
// to eviction, a retracted one that its opener closed it again: the window
// then counts as absent.
func (c *call) readCounters() error {
	var keys []string
	for i := range c.limits {
		if l := &c.limits[i]; !l.cas && l.open && !l.known {
			keys = append(keys, c.keys.counter(i, l.win))
		}
	}
	if len(keys) == 0 {
		return nil
	}
	var items map[string]*memcache.Item
	err := c.roundTrip(func() (err error) {
		items, err = c.mc.GetMulti(keys)
		return err
	})
	if err != nil {
		return driver.Errorf("throttlekit: memcached: get counters: %w", err)
	}
	for i := range c.limits {
		l := &c.limits[i]
		if l.cas || !l.open || l.known {
			continue
		}
		if err := c.setCounter(i, items[c.keys.counter(i, l.win)]); err != nil {
			return err
		}
	}
	return nil
}

// setCounter records a read of the counter of limit i's open window (nil:
// absent), following forward markers: the window becomes the incarnation
// the chain ends at, or absent.
func (c *call) setCounter(i int, it *memcache.Item) error {
	l := &c.limits[i]
	w, it, used, live, err := c.chase(i, l.win, it)
	if err != nil {
		return err
	}
	if !live {
		l.open, l.state, l.known, l.counter = false, driver.State{}, false, nil
		return nil
	}
	l.win, l.counter = w, it
	l.state, l.known = driver.State{Used: used, End: w.end}, true
	return nil
}

// maxForwards bounds the forward markers one read follows. Each Seed that
// replaces a window adds one and then points the window item past it, so
// a chain is as long as the replacements made since the window item was
// last written: a handful under the heaviest contention.
const maxForwards = 64

// chase reads on from it, the counter of incarnation w of limit i (nil:
// absent), through forward markers: it returns the incarnation whose
// counter holds a count, that counter's item and the count, with live
// true; live is false when the chain ends at a counter that was evicted
// or retracted, or forwards to a window already closed at now.
func (c *call) chase(i int, w window, it *memcache.Item) (_ window, _ *memcache.Item, used int64, live bool, _ error) {
	l := &c.limits[i]
	for hops := 0; ; hops++ {
		if it == nil {
			c.b.stats.windowsLost.Add(1)
			return w, nil, 0, false, nil
		}
		if v, ok := parseInt(it.Value); ok {
			if v >= retractedFloor {
				return w, nil, 0, false, nil
			}
			return w, it, v, true, nil
		}
		next, ok := parseForward(it.Value)
		if !ok {
			return w, nil, 0, false, driver.Errorf("%w: counter of limit %q holds %q", driver.ErrBadReply, l.limit.Name, clip(it.Value))
		}
		if next.end <= c.nowMs {
			return next, nil, 0, false, nil
		}
		if hops >= maxForwards {
			c.b.stats.retriesExhausted.Add(1)
			return w, nil, 0, false, driver.Errorf("%w: more than %d forwarded windows in a row", ErrRetriesExhausted, maxForwards)
		}
		w = next
		var err error
		if it, err = c.get(c.keys.counter(i, w)); err != nil {
			return w, nil, 0, false, err
		}
	}
}

// serverRefused reports an error by which the server refused an operation
// it received (a CLIENT_ERROR reply, such as an incr on a value that is
// not a number), as opposed to a failure to reach it.
func serverRefused(err error) bool {
	return err != nil && strings.Contains(err.Error(), "client error")
}

// forwarded reports whether counter key holds a forward marker: a Seed
// replaced its window (one round trip).
func (c *call) forwarded(key string) bool {
	it, err := c.get(key)
	if err != nil || it == nil {
		return false
	}
	_, ok := parseForward(it.Value)
	return ok
}

// forget drops what the call read, before it reads again. It has written
// nothing yet.
func (c *call) forget() {
	for i := range c.limits {
		c.limits[i] = limitCall{limit: c.limits[i].limit, cas: c.limits[i].cas}
	}
}

// states returns the best-known state of every limit.
func (c *call) states() []driver.State {
	s := make([]driver.State, len(c.limits))
	for i := range c.limits {
		s[i] = c.limits[i].state
	}
	return s
}

// decide runs Decide's steps; see the package documentation. A call that
// writes by compare-and-swap takes its identifier's turn first (see
// turns.go), once its snapshot says it may write: a denial on the snapshot
// waits for nobody. When a turn of the identifier ended between the
// snapshot and the call's turn, a writer of this process may have changed
// what it read, and it reads again under the turn.
func (c *call) decide() (driver.Outcome, error) {
	var ended *atomic.Uint64
	var seen uint64
	for {
		if c.needsTurn() {
			ended = c.b.turns.endedTurns(c.keys.route)
			seen = ended.Load()
		}
		if err := c.snapshot(); err != nil {
			return driver.Outcome{}, err
		}
		// Writes start only when the snapshot leaves a chance: a request
		// that would open a window must not open it if another limit
		// denies (SPEC: a denied request opens nothing), and a GCRA limit
		// that already denies makes every write pointless.
		mustCheck := false
		for i := range c.limits {
			l := &c.limits[i]
			if !l.cas && !l.open || l.cas && !c.casAllows(i, l.state) || c.req.Cost > l.limit.Capacity {
				mustCheck = true
			}
		}
		if mustCheck {
			if err := c.readCounters(); err != nil {
				return driver.Outcome{}, err
			}
			states := c.states()
			if !driver.Decide(c.policy, c.req.Now, c.req.Cost, append([]driver.State(nil), states...)) {
				return driver.Outcome{Allowed: false, States: states}, nil
			}
		}
		if !c.needsTurn() {
			break
		}
		if err := c.takeTurn(); err != nil {
			return driver.Outcome{}, err
		}
		if ended.Load() == seen {
			break
		}
		c.forget() // and read again, holding the turn: needsTurn is false now
	}
	// Units are taken in three ranks, each in policy order (see
	// "Concurrency"): fixed windows that did not start at now, then GCRA
	// limits, then fixed windows that start at now, which is where every
	// anchored window this request opens is.
	for i := range c.limits {
		if c.limits[i].cas || c.startsNow(i) {
			continue
		}
		if out, stop, err := c.settle(c.consumeWindow(i, true)); stop {
			return out, err
		}
	}
	for i := range c.limits {
		if !c.limits[i].cas {
			continue
		}
		allowed, err := c.consumeCAS(i)
		if out, stop, err := c.settle(stepOf(allowed), err); stop {
			return out, err
		}
	}
	for i := range c.limits {
		if l := &c.limits[i]; l.cas || l.consumed {
			continue
		}
		if out, stop, err := c.settle(c.consumeWindow(i, false)); stop {
			return out, err
		}
	}
	return driver.Outcome{Allowed: true, States: c.states()}, nil
}

// step is what taking units from one limit came to.
type step int

func stepOf(allowed bool) step {
	if allowed {
		return stepPassed
	}
	return stepDenied
}

// settle turns a step into the end of the decision when it denied or
// failed, giving back every unit taken.
func (c *call) settle(s step, err error) (out driver.Outcome, stop bool, _ error) {
	switch {
	case err != nil:
		c.rollback()
		return driver.Outcome{}, true, err
	case s == stepDenied:
		return c.deny(), true, nil
	}
	return driver.Outcome{}, false, nil
}

// incrDecr runs incr or decr by n on key and returns the new value.
func (c *call) incrDecr(verb, key string, n int64) (int64, error) {
	var v uint64
	err := c.roundTrip(func() (err error) {
		if verb == "incr" {
			v, err = c.mc.Increment(key, uint64(n))
		} else {
			v, err = c.mc.Decrement(key, uint64(n))
		}
		return err
	})
	if errors.Is(err, memcache.ErrCacheMiss) {
		return 0, err
	}
	if err != nil {
		return 0, driver.Errorf("throttlekit: memcached: %s: %w", verb, err)
	}
	if v > math.MaxInt64 {
		return 0, driver.Errorf("%w: %s returned %d", driver.ErrBadReply, verb, v)
	}
	return int64(v), nil
}

// get reads one item; a miss is (nil, nil).
func (c *call) get(key string) (*memcache.Item, error) {
	var it *memcache.Item
	err := c.roundTrip(func() (err error) {
		it, err = c.mc.Get(key)
		return err
	})
	if errors.Is(err, memcache.ErrCacheMiss) {
		return nil, nil
	}
	if err != nil {
		return nil, driver.Errorf("throttlekit: memcached: get: %w", err)
	}
	return it, nil
}

// backoff waits a random time before retry attempt+1 of a lost
// compare-and-swap, up to 50 µs doubled per attempt and at most 5 ms, so
// that racing writers spread out instead of colliding again; it returns
// early with the context's error.
func (c *call) backoff(attempt int) error {
	limit := min(50*time.Microsecond<<min(attempt, 7), 5*time.Millisecond)
	t := time.NewTimer(time.Duration(rand.Int64N(int64(limit))) + 1)
	defer t.Stop()
	select {
	case <-c.ctx.Done():
		return c.ctx.Err()
	case <-t.C:
		return nil
	}
}

// exhausted counts and returns a retries-exhausted failure.
func (c *call) exhausted() error {
	c.b.stats.retriesExhausted.Add(1)
	return driver.Errorf("%w after %d retries", ErrRetriesExhausted, c.b.casRetries)
}

// lostRace reports whether a conditional write failed because the item
// changed (CAS conflict), exists (add) or vanished (CAS after eviction).
func lostRace(err error) bool {
	return errors.Is(err, memcache.ErrNotStored) || errors.Is(err, memcache.ErrCASConflict) ||
		errors.Is(err, memcache.ErrCacheMiss)
}

// clip shortens a stored value for an error message.
func clip(v []byte) string {
	if len(v) > 40 {
		return string(v[:40]) + "..."
	}
	return string(v)
}

// Ping checks that every server answers a version request, each within the
// client's Timeout. It asks them one after another, stops at the first that
// fails, and checks ctx only before the first: a hung server costs one
// client Timeout, past ctx if need be. A server whose breaker is open fails
// at once with an error wrapping breaker.ErrOpen.
func (b *Backend) Ping(ctx context.Context) error {
	if err := b.ready(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	err := b.each(func(s *server) error {
		return s.do(func() error {
			b.stats.roundTrips.Add(1)
			return s.client.Ping()
		})
	})
	if err != nil {
		return driver.Errorf("throttlekit: memcached: ping: %w", err)
	}
	return nil
}

const (
	stepPassed   step = iota // the limit allows; the units are taken
	stepDenied               // the limit denies; its units are taken until rollback
	stepDeferred             // the window needs opening at now: it moves to the last rank
)

// Retracted counters. A retracted counter holds retractedValue. Live
// counts stay far below retractedFloor, and incr, decr and Refund's
// clamped decr move a counter by at most driver.MaxQuota (2^40) each,
// so a retracted counter stays at or above the floor for millions of
// operations, more than its window's life sees: every reader takes a value
// there for a retracted window, absent.
const (
	retractedValue = int64(1) << 62
	retractedFloor = int64(1) << 61
)
