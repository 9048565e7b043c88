package memorybackend

import (
	"context"
	"errors"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// ErrFull reports that the backend holds its maximum number of identifiers
// and none of them could be swept. The throttler applies the policy's
// failure mode to the request that met it; identifiers already held keep
// exact counts.
var ErrFull = errors.New("throttlekit: memory: identifier limit reached")

const (
	shardCount = 1 << shardBits
	// minSweepInterval is the fewest inserts between two sweeps of a shard.
	minSweepInterval = 64
	// gracePeriod keeps state this long after it stops mattering, as stored
	// TTLs do on the other backends, so that a throttler whose clock is up
	// to 30 s behind another's never sees live state vanish.
	gracePeriod = 30 * time.Second
	// sweepInterval is the shortest time between two sweeps of every shard.
	sweepInterval = time.Second
)

var (
	_ driver.Backend     = (*Backend)(nil)
	_ driver.Peeker      = (*Backend)(nil)
	_ driver.Refunder    = (*Backend)(nil)
	_ driver.Resetter    = (*Backend)(nil)
	_ driver.Pinger      = (*Backend)(nil)
	_ driver.Nonblocking = (*Backend)(nil)
	_ driver.Taker       = (*Backend)(nil)
	_ driver.Leaser      = (*Backend)(nil)
	_ driver.Seeder      = (*Backend)(nil)

	_ driver.ConfigChecker = (*Backend)(nil)
)

// Clock is where the backend reads the time its garbage collection runs on;
// a throttler.Clock (such as *throttlertest.ManualClock) is one.
type Clock interface{ Now() time.Time }

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

// Backend is an in-process backend for a throttler. It is exact under any
// concurrency: one identifier's states are read, decided and written under
// one lock. The zero value is not usable; call New.
type Backend struct {
	seed  maphash.Seed
	max   int64
	sweep Clock
	// configErr is the error of the first option New could not apply:
	// every call returns it (see Option).
	configErr error
	held      atomic.Int64
	swept     atomic.Int64 // sweep-clock time (Unix ms) of the last sweep of every shard
	shards    [shardCount]shard
}

type shard struct {
	mu sync.Mutex
	// ids maps an identifier to the states it holds under every policy
	// name: one lookup, keyed by the identifier alone and with the hash
	// that picked the shard, finds them.
	ids table
	// leases holds the concurrency leases; nil until the first one.
	leases  map[leaseKey]*leaseSet
	inserts int
	// peak is the most identifiers ids has held since it last shrank. A
	// sweep that leaves a quarter of that or less moves the survivors to
	// an array their size, and the old one's memory goes.
	peak int
}

// shrinkAbove is the smallest peak worth a copy after a sweep.
const shrinkAbove = 1024

// leaseKey names one identifier's leases under one concurrency limit.
type leaseKey struct{ limit, id string }

// leaseSet holds one identifier's leases under one concurrency limit.
type leaseSet struct {
	// leases maps a lease ID to its expiry (Unix ms, request time).
	leases map[string]int64
	// expires is when every lease has expired, on the sweep clock (Unix
	// ms).
	expires int64
}

// idEntry holds one identifier's entries, one per policy name it has state
// under; the first inline, since most identifiers are limited by one
// policy. Each entry is one (policy, identifier) pair of Len.
type idEntry struct {
	id    string
	first entry // first.policy is "" once its pair is gone
	more  []*entry
}

// entry holds every limit state stored for one identifier under one policy
// name, keyed by the limit's storage key. A policy redefined under the same
// name finds the states of the limits it kept, and the states of the limits
// it dropped stay as they were for the old definition.
type entry struct {
	policy string
	// head is the first limit's slot, in line with the entry so that a
	// one-limit policy's state is where its entry is; rest holds the
	// others. A slot's key is never empty once stored.
	head slot
	rest []slot
	// expires is when every state stops mattering, on the sweep clock
	// (Unix ms).
	expires int64
}

// slot is one limit's state, under the limit's storage key.
type slot struct {
	key   string
	state driver.State
}

// find returns the entry of the policy name, or nil.
func (ie *idEntry) find(policy string) *entry {
	if ie.first.policy == policy {
		return &ie.first
	}
	for _, e := range ie.more {
		if e.policy == policy {
			return e
		}
	}
	return nil
}

// add returns a new, empty entry for the policy name, which ie does not
// hold.
func (ie *idEntry) add(policy string) *entry {
	if ie.first.policy == "" {
		ie.first = entry{policy: policy}
		return &ie.first
	}
	e := &entry{policy: policy}
	ie.more = append(ie.more, e)
	return e
}

// remove deletes the entry of the policy name and reports whether there
// was one.
func (ie *idEntry) remove(policy string) bool {
	if ie.first.policy == policy {
		ie.first = entry{}
		return true
	}
	for i, e := range ie.more {
		if e.policy == policy {
			ie.more = append(ie.more[:i], ie.more[i+1:]...)
			ie.more[len(ie.more):cap(ie.more)][0] = nil
			return true
		}
	}
	return false
}

// empty reports whether ie holds no pair.
func (ie *idEntry) empty() bool { return ie.first.policy == "" && len(ie.more) == 0 }

// sweep deletes the entries that stopped mattering by cutoff and returns
// how many it deleted.
func (ie *idEntry) sweep(cutoff int64) int {
	n := 0
	if ie.first.policy != "" && ie.first.expires <= cutoff {
		ie.first = entry{}
		n++
	}
	kept := ie.more[:0]
	for _, e := range ie.more {
		if e.expires <= cutoff {
			n++
			continue
		}
		kept = append(kept, e)
	}
	clear(ie.more[len(kept):])
	ie.more = kept
	if len(kept) == 0 {
		ie.more = nil
	}
	return n
}

// Option configures a Backend (New). New has no error result, so an option
// out of range is kept as the Backend's configuration error: CheckConfig
// returns it (throttler.New and WithLocalFallback's throttler refuse the
// Backend) and every call fails with it.
type Option interface {
	apply(*Backend) error
}

// optionFunc adapts a function to Option.
type optionFunc func(*Backend) error

func (f optionFunc) apply(b *Backend) error { return f(b) }

// WithSweepClock sets the clock that garbage collection runs on; the
// default is the wall clock. It never decides anything: requests carry their
// own now. A state's lifetime is measured from the request that stored it
// (its window's end minus that request's now) and then counted on this
// clock, as a TTL is on a server, so a request whose clock runs far ahead
// of the others cannot sweep their live state. Tests that move a
// ManualClock and want sweeps to follow pass it here too.
// A nil c means the wall clock.
func WithSweepClock(c Clock) Option {
	return optionFunc(func(b *Backend) error { b.sweep = c; return nil })
}

// WithMaxIdentifiers bounds how many (policy, identifier) pairs, and
// (concurrency limit, identifier) pairs holding leases, the backend holds;
// 0, the default, means no bound. When the bound is reached, a
// request that would store a new pair first sweeps every closed state (at
// most once per second of the sweep clock); if
// nothing can be swept, that request fails with ErrFull and its policy's
// failure mode decides it. Pairs already held are never evicted, so a flood
// of new identifiers cannot reset anybody's count. A negative n is a
// configuration error (see Option): it is more likely a bug than a wish for
// no bound, which is 0.
func WithMaxIdentifiers(n int) Option {
	return optionFunc(func(b *Backend) error {
		if n < 0 {
			return driver.Errorf("%w: memory: WithMaxIdentifiers(%d) is negative; 0 means no bound", driver.ErrInvalidOption, n)
		}
		b.max = int64(n)
		return nil
	})
}

// New returns an empty Backend.
func New(opts ...Option) *Backend {
	b := &Backend{seed: maphash.MakeSeed(), sweep: wallClock{}}
	b.swept.Store(neverSwept)
	for _, opt := range opts {
		if opt == nil {
			continue
		}
		if err := opt.apply(b); err != nil && b.configErr == nil {
			b.configErr = err
		}
	}
	if b.sweep == nil {
		b.sweep = wallClock{}
	}
	return b
}

func (b *Backend) ready() error {
	if b == nil || b.sweep == nil {
		return driver.Errorf("%w: memory: Backend not built by New", driver.ErrNotInitialized)
	}
	return b.configErr
}

// CheckConfig implements driver.ConfigChecker: it returns the error of the
// first option New could not apply (ErrInvalidOption), or nil. The call
// timeout does not matter to a store in process. A Backend New did not
// build passes: its calls fail with ErrNotInitialized.
func (b *Backend) CheckConfig(time.Duration) error {
	if b == nil {
		return nil
	}
	return b.configErr
}

// check reports what makes req unusable: a Backend not built by New, a
// context already done, a policy not built by driver.NewPolicy.
func (b *Backend) check(ctx context.Context, req *driver.Request) error {
	if err := b.ready(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if !req.Policy.Valid() {
		return driver.ErrInvalidPolicy
	}
	return nil
}

// neverSwept marks a backend that has not swept every shard yet.
const neverSwept = -1 << 63

// Len returns the number of (policy, identifier) pairs held, swept or not,
// and of (concurrency limit, identifier) pairs holding leases.
func (b *Backend) Len() int { return int(b.held.Load()) }

// Decide implements driver.Backend.
func (b *Backend) Decide(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	// update's work, spelled out so that the outcome is built once, here.
	if err := b.check(ctx, &req); err != nil {
		return driver.Outcome{}, err
	}
	if allowed, states, needsRoom := b.tryUpdate(&req, nil); !needsRoom {
		return driver.Outcome{Allowed: allowed, States: states}, nil
	}
	return b.update(ctx, &req, nil)
}

// Take implements driver.Taker: driver.Take on the identifier's states,
// under the same lock as Decide.
func (b *Backend) Take(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	var granted int64
	out, err := b.update(ctx, &req, func(states []driver.State) bool {
		granted = driver.Take(req.Policy, req.Now, req.Cost, states)
		return granted > 0
	})
	out.Granted = granted
	return out, err
}

// Seed implements driver.Seeder: driver.Seed on the identifier's states,
// under the same lock as Decide, with the states held before it in
// Outcome.Prior.
func (b *Backend) Seed(ctx context.Context, req driver.Request, given []driver.State) (driver.Outcome, error) {
	if req.Policy.Valid() {
		if err := driver.CheckGiven(req.Policy, given); err != nil {
			return driver.Outcome{}, err
		}
	}
	var prior []driver.State
	out, err := b.update(ctx, &req, func(states []driver.State) bool {
		prior = append(prior[:0], states...)
		return driver.Seed(req.Policy, req.Now, req.Cost, states, given)
	})
	if err != nil {
		return out, err
	}
	out.Prior = prior
	return out, nil
}

// Peek implements driver.Peeker: the states stored for the identifier,
// read under its lock, changing nothing.
func (b *Backend) Peek(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	if err := b.check(ctx, &req); err != nil {
		return driver.Outcome{}, err
	}
	states := req.States()[:len(req.Policy.Limits)]
	clear(states)
	h := b.hash(req.Identifier)
	sh := b.shardOf(h)
	sh.mu.Lock()
	if ie := sh.ids.get(h, req.Identifier); ie != nil {
		if e := ie.find(req.Policy.Name); e != nil {
			e.load(req.Policy, states)
		}
	}
	sh.mu.Unlock()
	return driver.Outcome{Allowed: driver.Decide(req.Policy, req.Now, 0, states), States: states}, nil
}

// Nonblocking implements driver.Nonblocking: calls take a lock and never
// wait on anything else.
func (b *Backend) Nonblocking() bool { return true }

// Refund implements driver.Refunder.
func (b *Backend) Refund(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	return b.update(ctx, &req, func(states []driver.State) bool {
		driver.Refund(req.Policy, req.Now, req.Cost, states)
		return true
	})
}

// Reset implements driver.Resetter.
func (b *Backend) Reset(ctx context.Context, p *driver.Policy, id string) error {
	if err := b.ready(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	h := b.hash(id)
	sh := b.shardOf(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if i := sh.ids.find(h, id); i >= 0 {
		if ie := sh.ids.slots[i].ie; ie.remove(p.Name) {
			b.held.Add(-1)
			if ie.empty() {
				sh.ids.deleteAt(i)
			}
		}
	}
	return nil
}

// Ping implements driver.Pinger; an in-process store is always reachable.
func (b *Backend) Ping(ctx context.Context) error {
	if err := b.ready(); err != nil {
		return err
	}
	return ctx.Err()
}

// Acquire implements driver.Leaser: driver.AcquireLease on the
// identifier's leases under the limit, under the identifier's lock. A new
// (limit, identifier) pair counts against WithMaxIdentifiers like a policy's.
func (b *Backend) Acquire(ctx context.Context, req driver.LeaseRequest) (driver.LeaseOutcome, error) {
	if err := b.checkLease(ctx, req); err != nil {
		return driver.LeaseOutcome{}, err
	}
	key := leaseKey{req.Limit.Key, req.Identifier}
	out, needsRoom := b.tryAcquire(key, req)
	if !needsRoom {
		return out, nil
	}
	if b.sweepAll() {
		if out, needsRoom = b.tryAcquire(key, req); !needsRoom {
			return out, nil
		}
	}
	return driver.LeaseOutcome{}, driver.Errorf("%w: %d pairs held", ErrFull, b.held.Load())
}

// tryAcquire reports needsRoom when the identifier holds no lease set yet
// and the backend is full.
func (b *Backend) tryAcquire(key leaseKey, req driver.LeaseRequest) (out driver.LeaseOutcome, needsRoom bool) {
	sh := b.shardForID(key.id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	set := sh.leases[key]
	if set == nil {
		if b.max > 0 && b.held.Load() >= b.max {
			return driver.LeaseOutcome{}, true
		}
		sh.inserts++
		if sh.inserts >= max(minSweepInterval, (sh.ids.n+len(sh.leases))/2) {
			b.sweepLocked(sh, b.sweep.Now().UnixMilli())
		}
		if sh.leases == nil {
			sh.leases = make(map[leaseKey]*leaseSet)
		}
		set = &leaseSet{leases: make(map[string]int64, 1)}
		sh.leases[key] = set
		b.held.Add(1)
	}
	out = driver.AcquireLease(req.Limit, set.leases, req.Lease, req.Now)
	if out.Acquired {
		// The lease's remaining life in request time, counted from now on
		// the sweep clock, as entry.store counts a window's.
		life := set.leases[req.Lease] - req.Now.UnixMilli()
		set.expires = max(set.expires, b.sweep.Now().UnixMilli()+life)
	}
	return out, false
}

// Release implements driver.Leaser: driver.ReleaseLease under the
// identifier's lock. A lease set left empty stays until it is swept, so
// that a busy identifier does not make a new one per request.
func (b *Backend) Release(ctx context.Context, req driver.LeaseRequest) (driver.LeaseOutcome, error) {
	if err := b.checkLease(ctx, req); err != nil {
		return driver.LeaseOutcome{}, err
	}
	key := leaseKey{req.Limit.Key, req.Identifier}
	sh := b.shardForID(key.id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	set := sh.leases[key]
	if set == nil {
		return driver.LeaseOutcome{}, nil
	}
	return driver.ReleaseLease(req.Limit, set.leases, req.Lease, req.Now), nil
}

func (b *Backend) checkLease(ctx context.Context, req driver.LeaseRequest) error {
	if err := b.ready(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return req.Check()
}

// update applies step to the identifier's states under the shard lock and
// stores the result when it changed anything. A nil step is driver.Decide
// of req, the hot path, without a closure.
func (b *Backend) update(ctx context.Context, req *driver.Request, step func([]driver.State) bool) (driver.Outcome, error) {
	if err := b.check(ctx, req); err != nil {
		return driver.Outcome{}, err
	}
	allowed, states, needsRoom := b.tryUpdate(req, step)
	if !needsRoom {
		return driver.Outcome{Allowed: allowed, States: states}, nil
	}
	if b.sweepAll() {
		if allowed, states, needsRoom = b.tryUpdate(req, step); !needsRoom {
			return driver.Outcome{Allowed: allowed, States: states}, nil
		}
	}
	return driver.Outcome{}, driver.Errorf("%w: %d pairs held", ErrFull, b.held.Load())
}

// inlineStates is the most states tryUpdate keeps a copy of on the stack.
const inlineStates = 8

// tryUpdate returns the verdict and the states after it, or reports
// needsRoom when the update must store a new pair and the backend is full.
func (b *Backend) tryUpdate(req *driver.Request, step func([]driver.State) bool) (allowed bool, states []driver.State, needsRoom bool) {
	p := req.Policy
	states = req.States()[:len(p.Limits)]
	h := b.hash(req.Identifier)
	sh := b.shardOf(h)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	ie := sh.ids.get(h, req.Identifier)
	var e *entry
	if ie != nil {
		e = ie.find(p.Name)
	}
	if e != nil {
		e.load(p, states)
	} else {
		clear(states)
	}
	var inline [inlineStates]driver.State
	var before []driver.State
	if len(states) <= inlineStates {
		before = inline[:len(states)]
	} else {
		before = make([]driver.State, len(states))
	}
	copy(before, states)
	if step == nil {
		allowed = driver.Decide(p, req.Now, req.Cost, states)
	} else {
		allowed = step(states)
	}
	if !changed(before, states) {
		return allowed, states, false
	}
	if e == nil {
		if b.max > 0 && b.held.Load() >= b.max {
			return false, nil, true
		}
		// Sweep before inserting: the new entry has no expiry yet, and a
		// sweep after the insert would delete it.
		sh.inserts++
		if sh.inserts >= max(minSweepInterval, sh.ids.n/2) {
			b.sweepLocked(sh, b.sweep.Now().UnixMilli())
			ie = sh.ids.get(h, req.Identifier) // the sweep may have deleted it
		}
		if ie == nil {
			ie = &idEntry{id: req.Identifier}
			sh.ids.put(h, ie)
			sh.peak = max(sh.peak, sh.ids.n)
		}
		e = ie.add(p.Name)
		b.held.Add(1)
	}
	e.store(p, states, req.Now, b.sweep)
	return allowed, states, false
}

// sweepAll sweeps every shard, at most once per second of the sweep clock.
// It reports whether it swept.
func (b *Backend) sweepAll() bool {
	nowMs := b.sweep.Now().UnixMilli()
	last := b.swept.Load()
	recent := last != neverSwept && nowMs >= last && nowMs-last < sweepInterval.Milliseconds()
	if recent || !b.swept.CompareAndSwap(last, nowMs) {
		return false
	}
	for i := range b.shards {
		sh := &b.shards[i]
		sh.mu.Lock()
		b.sweepLocked(sh, nowMs)
		sh.mu.Unlock()
	}
	return true
}

// sweepLocked deletes the shard's entries whose state stopped mattering at
// least gracePeriod before nowMs, on the sweep clock.
func (b *Backend) sweepLocked(sh *shard, nowMs int64) {
	sh.inserts = 0
	cutoff := nowMs - gracePeriod.Milliseconds()
	sh.ids.sweep(func(ie *idEntry) bool {
		if n := ie.sweep(cutoff); n > 0 {
			b.held.Add(-int64(n))
		}
		return !ie.empty()
	})
	for k, set := range sh.leases {
		if set.expires <= cutoff {
			delete(sh.leases, k)
			b.held.Add(-1)
		}
	}
	if sh.leases != nil && len(sh.leases) == 0 {
		sh.leases = nil // a map never shrinks: let a drained one go
	}
	if n := sh.ids.n; sh.peak >= shrinkAbove && n <= sh.peak/4 {
		sh.ids.fit()
		sh.peak = n
	}
}

func (b *Backend) shardForID(id string) *shard { return b.shardOf(b.hash(id)) }

// hash returns the identifier's hash, which picks its shard (its low
// shardBits bits) and its place in the shard's table (the others).
func (b *Backend) hash(id string) uint64 { return maphash.String(b.seed, id) }

func (b *Backend) shardOf(h uint64) *shard { return &b.shards[h%shardCount] }

// load copies the entry's state of each of p's limits into states.
func (e *entry) load(p *driver.Policy, states []driver.State) {
	for i := range p.Limits {
		states[i] = e.lookup(i, p.Limits[i].Key)
	}
}

// slots returns the number of slots held.
func (e *entry) slots() int {
	if e.head.key == "" {
		return 0
	}
	return 1 + len(e.rest)
}

// slot returns the j-th slot, j < e.slots().
func (e *entry) slot(j int) *slot {
	if j == 0 {
		return &e.head
	}
	return &e.rest[j-1]
}

// find returns the slot of key, looked for first at index i (where it is
// unless the policy was redefined), or nil.
func (e *entry) find(i int, key string) *slot {
	n := e.slots()
	if i < n {
		if sl := e.slot(i); sl.key == key {
			return sl
		}
	}
	for j := range n {
		if sl := e.slot(j); sl.key == key {
			return sl
		}
	}
	return nil
}

// add appends a slot for key, which e does not hold, and returns it.
func (e *entry) add(key string) *slot {
	if e.head.key == "" {
		e.head = slot{key: key}
		return &e.head
	}
	e.rest = append(e.rest, slot{key: key})
	return &e.rest[len(e.rest)-1]
}

// lookup returns the state of key, looked for first at index i; the zero
// State when the entry holds none.
func (e *entry) lookup(i int, key string) driver.State {
	if sl := e.find(i, key); sl != nil {
		return sl.state
	}
	return driver.State{}
}

// store records the states of p's limits decided at reqNow, keeping the
// states of limits p does not have, and extends the moment every state
// stops mattering, on the sweep clock. That clock is read only when a
// state's end moves (a window opens, a GCRA state advances), not on every
// decision within an open window.
func (e *entry) store(p *driver.Policy, states []driver.State, reqNow time.Time, sweep Clock) {
	reqMs := reqNow.UnixMilli()
	sweepMs := int64(0)
	for i := range p.Limits {
		l := &p.Limits[i]
		sl := e.find(i, l.Key)
		if sl == nil {
			sl = e.add(l.Key)
		}
		moved := sl.state.End != states[i].End
		sl.state = states[i]
		if !moved && e.expires != 0 {
			continue
		}
		end := states[i].End
		switch l.Algorithm {
		case driver.GCRA:
			end = (end + 999) / 1000 // the TAT is in microseconds
		case driver.SlidingWindow:
			end += l.WindowMillis // the next window weighs this one's count
		}
		if sweepMs == 0 {
			sweepMs = sweep.Now().UnixMilli()
		}
		// The remaining life of this state, in request time, counted from
		// now on the sweep clock.
		e.expires = max(e.expires, sweepMs+end-reqMs)
	}
}

func changed(a, b []driver.State) bool {
	for i := range a {
		if a[i] != b[i] {
			return true
		}
	}
	return false
}
