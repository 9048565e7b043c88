package memory

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// ErrFull reports that the backend holds its maximum number of identifiers
// and none of them could be swept. The throttler applies the policy's
// failure mode to the request that met it; identifiers already held keep
// exact counts.
var ErrFull = errors.New("memory: identifier limit reached")

// ErrNotInitialized reports a Backend that was not built by New.
var ErrNotInitialized = errors.New("memory: backend not built by New")

const (
	shardCount = 64
	// minSweepInterval is the fewest inserts between two sweeps of a shard.
	minSweepInterval = 64
	// gracePeriod keeps state this long after it stops mattering, as stored
	// TTLs do on the other backends, so a clock a little behind another
	// never sees live state vanish.
	gracePeriod = time.Second
)

var (
	_ throttler.Backend  = (*Backend)(nil)
	_ throttler.Refunder = (*Backend)(nil)
	_ throttler.Resetter = (*Backend)(nil)
	_ throttler.Pinger   = (*Backend)(nil)
)

// Backend is an in-process throttler.Backend. It is exact under any
// concurrency: one identifier's states are read, decided and written under
// one lock. The zero value is not usable; call New.
type Backend struct {
	seed   maphash.Seed
	max    int64
	sweep  throttler.Clock
	held   atomic.Int64
	swept  atomic.Int64 // sweep-clock time (Unix ms) of the last sweep of every shard
	shards [shardCount]shard
}

type shard struct {
	mu      sync.Mutex
	entries map[entryKey]*entry
	inserts int
}

// entryKey names one identifier under one policy.
type entryKey struct{ policy, id string }

type entry struct {
	keys   []string // the policy's limit keys, in the order of states
	states []throttler.State
	// expires is when every state stops mattering, on the sweep clock
	// (Unix ms).
	expires int64
}

// Option configures a Backend.
type Option func(*Backend)

// WithSweepClock sets the clock that garbage collection runs on; the
// default is the wall clock. It never decides anything: requests carry their
// own now. A state's lifetime is measured from the request that stored it
// (its window's end minus that request's now) and then counted on this
// clock, as a TTL is on a server, so a request whose clock runs far ahead
// of the others cannot sweep their live state. Tests that move a
// ManualClock and want sweeps to follow pass it here too.
func WithSweepClock(c throttler.Clock) Option { return func(b *Backend) { b.sweep = c } }

// WithMaxIdentifiers bounds how many (policy, identifier) pairs the backend
// holds; 0, the default, means no bound. When the bound is reached, a
// request that would store a new pair first sweeps every closed state (at
// most once per second of the sweep clock); if
// nothing can be swept, that request fails with ErrFull and its policy's
// failure mode decides it. Pairs already held are never evicted, so a flood
// of new identifiers cannot reset anybody's count.
func WithMaxIdentifiers(n int) Option { return func(b *Backend) { b.max = int64(max(n, 0)) } }

// New returns an empty Backend.
func New(opts ...Option) *Backend {
	b := &Backend{seed: maphash.MakeSeed(), sweep: throttler.SystemClock{}}
	for i := range b.shards {
		b.shards[i].entries = make(map[entryKey]*entry)
	}
	b.swept.Store(neverSwept)
	for _, opt := range opts {
		opt(b)
	}
	if b.sweep == nil {
		b.sweep = throttler.SystemClock{}
	}
	return b
}

func (b *Backend) ready() error {
	if b == nil || b.sweep == nil {
		return ErrNotInitialized
	}
	return nil
}

// neverSwept marks a backend that has not swept every shard yet.
const neverSwept = -1 << 63

// Len returns the number of (policy, identifier) pairs held, swept or not.
func (b *Backend) Len() int { return int(b.held.Load()) }

// Decide implements throttler.Backend.
func (b *Backend) Decide(ctx context.Context, req throttler.Request) (throttler.Outcome, error) {
	return b.update(ctx, req, func(states []throttler.State) (bool, []throttler.State) {
		return throttler.Decide(req.Policy, req.Now, req.Cost, states)
	})
}

// Refund implements throttler.Refunder.
func (b *Backend) Refund(ctx context.Context, req throttler.Request) (throttler.Outcome, error) {
	return b.update(ctx, req, func(states []throttler.State) (bool, []throttler.State) {
		return true, throttler.Refund(req.Policy, req.Now, req.Cost, states)
	})
}

// Reset implements throttler.Resetter.
func (b *Backend) Reset(ctx context.Context, p *throttler.Policy, id string) error {
	if err := b.ready(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	key := entryKey{p.Name(), id}
	sh := b.shardFor(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, ok := sh.entries[key]; ok {
		delete(sh.entries, key)
		b.held.Add(-1)
	}
	return nil
}

// Ping implements throttler.Pinger; an in-process store is always reachable.
func (b *Backend) Ping(ctx context.Context) error {
	if err := b.ready(); err != nil {
		return err
	}
	return ctx.Err()
}

// update applies step to the identifier's states under the shard lock and
// stores the result when it changed anything.
func (b *Backend) update(ctx context.Context, req throttler.Request,
	step func([]throttler.State) (bool, []throttler.State)) (throttler.Outcome, error) {
	if err := b.ready(); err != nil {
		return throttler.Outcome{}, err
	}
	if err := ctx.Err(); err != nil {
		return throttler.Outcome{}, err
	}
	if req.Policy == nil || req.Policy.Len() == 0 {
		return throttler.Outcome{}, throttler.ErrInvalidPolicy
	}
	key := entryKey{req.Policy.Name(), req.Identifier}
	out, needsRoom := b.tryUpdate(key, req, step)
	if !needsRoom {
		return out, nil
	}
	if b.sweepAll() {
		if out, needsRoom = b.tryUpdate(key, req, step); !needsRoom {
			return out, nil
		}
	}
	return throttler.Outcome{}, fmt.Errorf("%w: %d pairs held", ErrFull, b.held.Load())
}

// tryUpdate reports needsRoom when the update must store a new pair and the
// backend is full.
func (b *Backend) tryUpdate(key entryKey, req throttler.Request,
	step func([]throttler.State) (bool, []throttler.State)) (out throttler.Outcome, needsRoom bool) {
	p := req.Policy
	sh := b.shardFor(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.entries[key]
	var states []throttler.State
	if e != nil {
		states = e.statesFor(p)
	} else {
		states = make([]throttler.State, p.Len())
	}
	allowed, next := step(states)
	if !changed(states, next) {
		return throttler.Outcome{Allowed: allowed, States: next}, false
	}
	if e == nil {
		if b.max > 0 && b.held.Load() >= b.max {
			return throttler.Outcome{}, true
		}
		// Sweep before inserting: the new entry has no expiry yet, and a
		// sweep after the insert would delete it.
		sh.inserts++
		if sh.inserts >= max(minSweepInterval, len(sh.entries)/2) {
			b.sweepLocked(sh, b.sweep.Now().UnixMilli())
		}
		e = &entry{}
		sh.entries[key] = e
		b.held.Add(1)
	}
	e.store(p, next, req.Now, b.sweep.Now())
	return throttler.Outcome{Allowed: allowed, States: next}, false
}

// sweepAll sweeps every shard, at most once per second of the sweep clock.
// It reports whether it swept.
func (b *Backend) sweepAll() bool {
	nowMs := b.sweep.Now().UnixMilli()
	last := b.swept.Load()
	recent := last != neverSwept && nowMs >= last && nowMs-last < gracePeriod.Milliseconds()
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
	for k, e := range sh.entries {
		if e.expires <= cutoff {
			delete(sh.entries, k)
			b.held.Add(-1)
		}
	}
}

func (b *Backend) shardFor(k entryKey) *shard {
	return &b.shards[maphash.String(b.seed, k.id)%shardCount]
}

// statesFor returns the entry's states in the order of p's limits. A policy
// redefined under the same name keeps the state of the limits it kept.
func (e *entry) statesFor(p *throttler.Policy) []throttler.State {
	states := make([]throttler.State, p.Len())
	if len(e.keys) == p.Len() {
		same := true
		for i := range e.keys {
			if e.keys[i] != p.LimitKey(i) {
				same = false
				break
			}
		}
		if same {
			copy(states, e.states)
			return states
		}
	}
	for i := range states {
		for j, k := range e.keys {
			if k == p.LimitKey(i) {
				states[i] = e.states[j]
			}
		}
	}
	return states
}

// store records states decided at reqNow, and when they stop mattering on
// the sweep clock, whose reading is sweepNow.
func (e *entry) store(p *throttler.Policy, states []throttler.State, reqNow, sweepNow time.Time) {
	if len(e.keys) != p.Len() {
		e.keys = make([]string, p.Len())
	}
	for i := range e.keys {
		e.keys[i] = p.LimitKey(i)
	}
	e.states = states
	// The longest remaining life of any state, in request time.
	var life int64
	reqMs := reqNow.UnixMilli()
	for i, s := range states {
		end := s.End
		if p.Limit(i).Algorithm == throttler.GCRA {
			end = (s.End + 999) / 1000 // the TAT is in microseconds
		}
		life = max(life, end-reqMs)
	}
	e.expires = sweepNow.UnixMilli() + life
}

func changed(a, b []throttler.State) bool {
	for i := range a {
		if a[i] != b[i] {
			return true
		}
	}
	return false
}
