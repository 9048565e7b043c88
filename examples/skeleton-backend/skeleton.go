// Package skeleton is the smallest complete throttlekit backend: a map under
// one mutex, storing one driver.State per (policy, identifier, limit). It is
// the starting point docs/BACKENDS.md walks through. Copy it, replace the
// map with your store, and keep skeleton_test.go: it runs the conformance
// suite and the state-level differential on it.
//
// Every decision is a package driver function (Decide, Refund, Take, Seed,
// AcquireLease, ReleaseLease) applied to the stored states under the lock
// that guards them. That lock covers one policy name and one identifier at
// least; this skeleton takes one lock for everything, which is correct and
// simple, and slow only under heavy contention.
package skeleton

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// The capabilities the skeleton implements; each is optional but Backend.
var (
	_ driver.Backend     = (*Store)(nil)
	_ driver.Peeker      = (*Store)(nil)
	_ driver.Refunder    = (*Store)(nil)
	_ driver.Resetter    = (*Store)(nil)
	_ driver.Taker       = (*Store)(nil)
	_ driver.Seeder      = (*Store)(nil)
	_ driver.Leaser      = (*Store)(nil)
	_ driver.Pinger      = (*Store)(nil)
	_ driver.Nonblocking = (*Store)(nil)
	_ driver.Closer      = (*Store)(nil)
)

// sweepEvery is how many new rows the store writes between two sweeps.
const sweepEvery = 1024

// Store is an in-process backend. Build it with New; the zero Store is not
// usable.
type Store struct {
	mu     sync.Mutex
	rows   map[rowKey]*row
	leases map[leaseKey]*leaseRow
	grace  time.Duration
	clock  func() time.Time // the store's own clock, for garbage collection only
	added  int              // rows added since the last sweep
	closed bool
}

// rowKey is one limit's state for one identifier under one policy name.
// Separate fields need no escaping: only a store that joins the parts into
// one string (a Redis key, a file name) needs driver.EscapeKey.
type rowKey struct{ policy, limit, id string }

type row struct {
	state driver.State
	// expires is when the state may be deleted, on the store's clock.
	expires time.Time
}

type leaseKey struct{ limit, id string }

type leaseRow struct {
	leases  map[string]int64 // lease ID -> expiry, Unix ms in request time
	expires time.Time        // on the store's clock
}

// New returns an empty Store that keeps states driver.DefaultExpiryGrace
// after they stop mattering.
func New() *Store {
	return &Store{rows: map[rowKey]*row{}, leases: map[leaseKey]*leaseRow{},
		grace: driver.DefaultExpiryGrace, clock: time.Now}
}

// begin checks the call and takes the lock; the caller must call s.mu.Unlock.
func (s *Store) begin(ctx context.Context) error {
	if s == nil || s.rows == nil {
		return fmt.Errorf("%w: skeleton.Store not built by New", driver.ErrNotInitialized)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return driver.ErrClosed
	}
	return nil
}

// update loads the identifier's states for req.Policy, applies step to
// them and stores what changed, all under the lock: one atomic step.
func (s *Store) update(ctx context.Context, req driver.Request, step func(states []driver.State) bool) (driver.Outcome, error) {
	if !req.Policy.Valid() {
		return driver.Outcome{}, driver.ErrInvalidPolicy
	}
	if err := s.begin(ctx); err != nil {
		return driver.Outcome{}, err
	}
	defer s.mu.Unlock()
	states := req.States()[:len(req.Policy.Limits)]
	for i := range states {
		states[i] = driver.State{}
		if r := s.rows[s.key(req, i)]; r != nil {
			states[i] = r.state
		}
	}
	before := append([]driver.State(nil), states...)
	allowed := step(states)
	for i := range states {
		if states[i] != before[i] {
			s.store(req, i, states[i])
		}
	}
	return driver.Outcome{Allowed: allowed, States: states}, nil
}

func (s *Store) key(req driver.Request, i int) rowKey {
	return rowKey{req.Policy.Name, req.Policy.Limits[i].Key, req.Identifier}
}

// store writes limit i's state and its expiry. The state stops mattering
// at its End (fixed windows, Unix ms), its TAT (GCRA, Unix µs) or End +
// Window (sliding). That moment is in request time; the remaining life
// (end - req.Now) plus the grace is counted on the store's clock, as a TTL
// is, so that a request whose clock runs ahead cannot get live states of
// others swept.
func (s *Store) store(req driver.Request, i int, st driver.State) {
	l := &req.Policy.Limits[i]
	endMs := st.End
	switch l.Algorithm {
	case driver.GCRA:
		endMs = (st.End + 999) / 1000
	case driver.SlidingWindow:
		endMs += l.WindowMillis
	}
	life := time.Duration(max(endMs-req.Now.UnixMilli(), 0)) * time.Millisecond
	k := s.key(req, i)
	r := s.rows[k]
	if r == nil {
		s.maybeSweep()
		r = &row{}
		s.rows[k] = r
	}
	r.state, r.expires = st, s.clock().Add(life+s.grace)
}

// maybeSweep deletes, every sweepEvery new rows, the rows whose expiry has
// passed on the store's clock. It runs under the lock, so it never deletes
// a row that a decision is updating.
func (s *Store) maybeSweep() {
	if s.added++; s.added < sweepEvery {
		return
	}
	s.added = 0
	now := s.clock()
	for k, r := range s.rows {
		if !r.expires.After(now) {
			delete(s.rows, k)
		}
	}
	for k, r := range s.leases {
		if !r.expires.After(now) {
			delete(s.leases, k)
		}
	}
}

// Decide implements driver.Backend with driver.Decide.
func (s *Store) Decide(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	return s.update(ctx, req, func(states []driver.State) bool {
		return driver.Decide(req.Policy, req.Now, req.Cost, states)
	})
}

// Peek implements driver.Peeker: Decide of cost 0 changes nothing, and its
// verdict is what a peek reports.
func (s *Store) Peek(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	req.Cost = 0
	return s.Decide(ctx, req)
}

// Refund implements driver.Refunder with driver.Refund; Allowed is true.
func (s *Store) Refund(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	return s.update(ctx, req, func(states []driver.State) bool {
		driver.Refund(req.Policy, req.Now, req.Cost, states)
		return true
	})
}

// Take implements driver.Taker with driver.Take.
func (s *Store) Take(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	var granted int64
	out, err := s.update(ctx, req, func(states []driver.State) bool {
		granted = driver.Take(req.Policy, req.Now, req.Cost, states)
		return granted > 0
	})
	out.Granted = granted
	return out, err
}

// Seed implements driver.Seeder with driver.Seed, reporting the states held
// before it in Outcome.Prior.
func (s *Store) Seed(ctx context.Context, req driver.Request, given []driver.State) (driver.Outcome, error) {
	if req.Policy.Valid() {
		if err := driver.CheckGiven(req.Policy, given); err != nil {
			return driver.Outcome{}, err
		}
	}
	var prior []driver.State
	out, err := s.update(ctx, req, func(states []driver.State) bool {
		prior = append([]driver.State(nil), states...)
		return driver.Seed(req.Policy, req.Now, req.Cost, states, given)
	})
	out.Prior = prior
	return out, err
}

// Reset implements driver.Resetter: it forgets the identifier's states for
// p's limits. The states of limits an earlier definition of p had and p
// dropped stay, and expire on their own: the map is keyed per limit, and
// finding them would take a scan of every row (docs/BACKENDS.md, "Close
// and Reset", says when a backend should forget them too).
func (s *Store) Reset(ctx context.Context, p *driver.Policy, id string) error {
	if !p.Valid() {
		return driver.ErrInvalidPolicy
	}
	if err := s.begin(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	for i := range p.Limits {
		delete(s.rows, rowKey{p.Name, p.Limits[i].Key, id})
	}
	return nil
}

// Acquire implements driver.Leaser with driver.AcquireLease.
func (s *Store) Acquire(ctx context.Context, req driver.LeaseRequest) (driver.LeaseOutcome, error) {
	return s.lease(ctx, req, driver.AcquireLease)
}

// Release implements driver.Leaser with driver.ReleaseLease.
func (s *Store) Release(ctx context.Context, req driver.LeaseRequest) (driver.LeaseOutcome, error) {
	return s.lease(ctx, req, driver.ReleaseLease)
}

func (s *Store) lease(ctx context.Context, req driver.LeaseRequest,
	op func(*driver.ConcurrencyLimit, map[string]int64, string, time.Time) driver.LeaseOutcome) (driver.LeaseOutcome, error) {
	if err := req.Check(); err != nil {
		return driver.LeaseOutcome{}, err
	}
	if err := s.begin(ctx); err != nil {
		return driver.LeaseOutcome{}, err
	}
	defer s.mu.Unlock()
	k := leaseKey{req.Limit.Key, req.Identifier}
	r := s.leases[k]
	if r == nil {
		s.maybeSweep()
		r = &leaseRow{leases: map[string]int64{}}
		s.leases[k] = r
	}
	out := op(req.Limit, r.leases, req.Lease, req.Now)
	latest := req.Now.UnixMilli()
	for _, exp := range r.leases {
		latest = max(latest, exp)
	}
	life := time.Duration(latest-req.Now.UnixMilli()) * time.Millisecond
	r.expires = s.clock().Add(life + s.grace)
	return out, nil
}

// Ping implements driver.Pinger: an in-process store is always reachable.
func (s *Store) Ping(ctx context.Context) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	s.mu.Unlock()
	return nil
}

// Nonblocking implements driver.Nonblocking: calls take a lock and never
// wait on I/O, so the throttler sets no per-call timeout.
func (s *Store) Nonblocking() bool { return true }

// Close implements driver.Closer: it drops every state, and later calls
// return driver.ErrClosed.
func (s *Store) Close() error {
	if s == nil || s.rows == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	clear(s.rows)
	clear(s.leases)
	return nil
}
