package memcachedbackend

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/throttlekit/throttlekit/internal/hrw"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// This file holds the turns: at most one compare-and-swap writer per
// identifier and policy within a Backend, served in arrival order
// (docs/BACKENDS.md, "Compare-and-swap stores", rule 2).
//
// Without them, the callers of one hot identifier race each other's
// compare-and-swap writes: whoever's write lands first wins again and
// again, and an unlucky caller loses round after round (up to
// WithCASRetries) while its latency grows. With them, the callers of one
// process write one after another and lose races only to other processes,
// whose writers the jittered backoff spreads out. A sync.Mutex would not
// do: it promises no order, and a goroutine that just arrived can take it
// ahead of one that has waited for several round trips.

// turns gives a Backend's calls of one route (one identifier under one
// policy) one turn at a time, in the order they asked: per route, a queue
// of channels, the first one closed.
type turns struct {
	mu     sync.Mutex // held for bookkeeping only, never across a round trip
	queues map[string][]chan struct{}
	// ended counts the turns ended, per stripe of routes: a call that read
	// its items before a turn of its stripe ended (a write of this process
	// may have changed them) reads them again once it holds its turn. A
	// stripe shared with another route costs a read, never a wrong one.
	ended [turnStripes]atomic.Uint64
}

// turnStripes is how many counters of ended turns a Backend keeps.
const turnStripes = 1024

// endedTurns returns the counter of ended turns of route's stripe.
func (t *turns) endedTurns(route string) *atomic.Uint64 {
	return &t.ended[hrw.Hash(route)%turnStripes]
}

// wait returns once every caller of route that asked before it has called
// done, or ctx's error if ctx ends first. After nil the caller must call
// done(route) when its writes are over, whatever their result.
func (t *turns) wait(ctx context.Context, route string) error {
	ch := make(chan struct{})
	t.mu.Lock()
	if t.queues == nil {
		t.queues = map[string][]chan struct{}{}
	}
	q := append(t.queues[route], ch)
	t.queues[route] = q
	t.mu.Unlock()
	if len(q) == 1 {
		return nil // nobody ahead: the turn is ours at once
	}

	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		t.mu.Lock()
		defer t.mu.Unlock()
		if q := t.queues[route]; q[0] == ch {
			t.pass(route) // the turn came as ctx ended: give it to the next
		} else {
			t.queues[route] = slices.DeleteFunc(q, func(c chan struct{}) bool { return c == ch })
		}
		return ctx.Err()
	}
}

// done ends route's current turn.
func (t *turns) done(route string) {
	t.endedTurns(route).Add(1)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.pass(route)
}

// pass gives route's turn to the next caller in line; t.mu is held.
func (t *turns) pass(route string) {
	q := t.queues[route][1:]
	if len(q) == 0 {
		delete(t.queues, route)
		return
	}
	t.queues[route] = q
	close(q[0])
}

// needsTurn reports whether the call must hold its identifier's turn
// before it writes: it does not yet, and its policy has a limit written by
// compare-and-swap (GCRA, sliding window). Fixed windows are counted by
// incr, which never loses a race, and opened at most once per window, so
// a policy of fixed windows alone never waits.
func (c *call) needsTurn() bool {
	if c.holdsTurn || c.b.turnsOff {
		return false
	}
	for i := range c.limits {
		if c.limits[i].cas {
			return true
		}
	}
	return false
}

// takeTurn waits for the identifier's turn.
func (c *call) takeTurn() error {
	if err := c.b.turns.wait(c.ctx, c.keys.route); err != nil {
		return driver.Errorf("throttlekit: memcached: waiting for the identifier's turn: %w", err)
	}
	c.holdsTurn = true
	return nil
}

// endTurn passes the identifier's turn on, when the call holds it and did
// not borrow it from its caller.
func (c *call) endTurn() {
	if c.holdsTurn && !c.borrowed {
		c.b.turns.done(c.keys.route)
	}
	c.holdsTurn = false
}
