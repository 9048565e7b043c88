package rollout

import (
	"context"
	"errors"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// DefaultSeedMemory is the number of (policy, identifier) pairs a Backend
// remembers as seeded unless WithSeedMemory says otherwise.
const DefaultSeedMemory = 100_000

// historyDepth bounds the split changes a Backend remembers. Older changes
// are forgotten, and with them the certainty that an identifier never moved
// within a policy's horizon: an identifier is then checked once more.
const historyDepth = 32

// rule is one split in force over a span of time, or the default side when
// the source had no answer yet.
type rule struct {
	split    *Split // nil: the default side
	fallback Side
}

func (r rule) side(identifier string) Side {
	if r.split == nil {
		return r.fallback
	}
	return r.split.Side(identifier)
}

// same reports whether two rules route every identifier alike.
func (r rule) same(o rule) bool {
	switch {
	case r.split == nil || o.split == nil:
		return r.split == nil && o.split == nil && r.fallback == o.fallback
	case r.split.killed || r.split.percent <= 0:
		return o.split.killed || o.split.percent <= 0
	case r.split.percent >= 100:
		return !o.split.killed && o.split.percent >= 100
	}
	return !o.split.killed && r.split.percent == o.split.percent && r.split.groupID == o.split.groupID
}

// change records that before stopped being in force at at; seq numbers
// the changes a Backend has seen, from 1.
type change struct {
	at     time.Time
	before rule
	seq    uint64
}

// history is what a Backend knows of the splits in force: since when it has
// watched the source, the rule in force now and the latest changes. It is
// immutable; a Backend publishes a new one on every change.
type history struct {
	since   time.Time
	current rule
	changes []change // oldest first, at most historyDepth
	seq     uint64   // the latest change's seq, 0 before any
}

// observe returns the rule in force for a decision at now, recording a
// change of split in the history. Routing costs one atomic load when the
// split is unchanged.
func (b *Backend) observe(now time.Time) rule {
	r := rule{split: b.source.Split(), fallback: b.fallback}
	h := b.history.Load()
	if h != nil && h.current.split == r.split {
		return r
	}
	b.historyMu.Lock()
	defer b.historyMu.Unlock()
	h = b.history.Load()
	switch {
	case h == nil:
		b.history.Store(&history{since: now, current: r})
	case h.current.split == r.split:
	case h.current.same(r):
		// A source that publishes an equal split anew: nothing moved.
		next := *h
		next.current = r
		b.history.Store(&next)
	default:
		changes := append(append(make([]change, 0, len(h.changes)+1), h.changes...), change{at: now, before: h.current, seq: h.seq + 1})
		since := h.since
		if n := len(changes) - historyDepth; n > 0 {
			// Forgetting a change loses what was in force before it: the
			// history now starts at the oldest change it still holds.
			since = changes[n-1].at
			changes = changes[n:]
		}
		b.history.Store(&history{since: since, current: r, changes: changes, seq: h.seq + 1})
	}
	return r
}

// mayHaveMoved reports whether identifier may have been served by the
// backend of side other than serving at some moment of the horizon before
// now: when a split in force during (now - horizon, now] sends it there, or
// when the Backend has not watched the source for that long (a process
// that just started cannot know what its peers did).
func (b *Backend) mayHaveMoved(identifier string, serving Side, now time.Time, horizon time.Duration) bool {
	h := b.history.Load()
	// A state written at or before from has stopped counting by now
	// (driver.Horizon), whoever wrote it.
	from := now.Add(-horizon)
	if h == nil || h.since.After(from) {
		return true
	}
	for i := len(h.changes) - 1; i >= 0; i-- {
		c := h.changes[i]
		if !c.at.After(from) {
			break
		}
		if c.before.side(identifier) != serving {
			return true
		}
	}
	return false
}

// seedKey names one identifier under one policy.
type seedKey struct {
	policy     *driver.Policy
	identifier string
}

// seedEntry says that an identifier was carried over to (or found nothing
// to carry to) side, when the history's latest change was seq; it holds
// until until.
type seedEntry struct {
	until time.Time
	seq   uint64
	side  Side
}

// stillServed reports whether every split in force since the change
// numbered seq sends identifier to side, so that a carry made then still
// holds. A history that forgot some of those changes cannot tell.
func (h *history) stillServed(identifier string, side Side, seq uint64) bool {
	if h == nil || h.seq == seq {
		return h != nil
	}
	if len(h.changes) == 0 || h.changes[0].seq > seq+1 {
		return false
	}
	for _, c := range h.changes {
		if c.seq > seq && c.before.side(identifier) != side {
			return false
		}
	}
	return true
}

// seedMemory remembers the identifiers a Backend has seeded (or found
// nothing to seed for), each until its policy's horizon has passed, so that
// an identifier is checked at most once per horizon. It is bounded: when a
// shard is full its expired entries go, then arbitrary ones; a forgotten
// identifier is only checked again, which costs a round trip and changes
// no state.
type seedMemory struct {
	seed   maphash.Seed
	limit  int // entries per shard
	shards [16]seedShard
}

type seedShard struct {
	mu      sync.Mutex
	entries map[seedKey]seedEntry
}

func newSeedMemory(entries int) *seedMemory {
	m := &seedMemory{seed: maphash.MakeSeed(), limit: max(1, entries/16)}
	for i := range m.shards {
		m.shards[i].entries = make(map[seedKey]seedEntry)
	}
	return m
}

func (m *seedMemory) shard(k seedKey) *seedShard {
	return &m.shards[maphash.String(m.seed, k.identifier)%uint64(len(m.shards))]
}

// lookup returns what is remembered of k.
func (m *seedMemory) lookup(k seedKey) (seedEntry, bool) {
	sh := m.shard(k)
	sh.mu.Lock()
	e, ok := sh.entries[k]
	sh.mu.Unlock()
	return e, ok
}

// remember records e for k.
func (m *seedMemory) remember(k seedKey, e seedEntry, now time.Time) {
	sh := m.shard(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, ok := sh.entries[k]; !ok && len(sh.entries) >= m.limit {
		for key, old := range sh.entries {
			if !now.Before(old.until) {
				delete(sh.entries, key)
			}
		}
		for key := range sh.entries {
			if len(sh.entries) < m.limit {
				break
			}
			delete(sh.entries, key)
		}
	}
	sh.entries[k] = e
}

// len returns the number of entries held.
func (m *seedMemory) len() int {
	n := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		n += len(sh.entries)
		sh.mu.Unlock()
	}
	return n
}

// needsSeed reports whether an operation on req's identifier, served by
// side, must first look for state on the other backend, given the horizon
// of req's policy.
func (b *Backend) needsSeed(req driver.Request, side Side, horizon time.Duration) bool {
	if b.mode == ShadowMode || b.seeds == nil {
		return false
	}
	if !b.mayHaveMoved(req.Identifier, side, req.Now, horizon) {
		return false
	}
	e, ok := b.seeds.lookup(seedKey{req.Policy, req.Identifier})
	return !ok || e.side != side || !req.Now.Before(e.until) ||
		!b.history.Load().stillServed(req.Identifier, side, e.seq)
}

// lookAcross reads the identifier's states on the backend of side other:
// its Peek, or Decide with cost 0 when it has none. The read gets half of
// what remains of ctx's deadline, so that a slow or unreachable other
// backend leaves the serving one time to decide. It returns nil when the
// other backend holds nothing that counts at req.Now.
func (b *Backend) lookAcross(ctx context.Context, other Side, req driver.Request) ([]driver.State, error) {
	peek := req
	peek.Cost, peek.Buffer = 0, nil
	if deadline, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, time.Now().Add(time.Until(deadline)/2))
		defer cancel()
	}
	out, err := driver.PeekWith(ctx, b.backends[other], peek)
	if err != nil {
		return nil, err
	}
	if len(out.States) != len(req.Policy.Limits) {
		return nil, driver.ErrBadReply
	}
	for i := range req.Policy.Limits {
		if driver.InForce(&req.Policy.Limits[i], out.States[i], req.Now) != (driver.State{}) {
			return out.States, nil
		}
	}
	return nil, nil
}

// seeded decides req on the backend of side (a take when take is set)
// after carrying the identifier's state over from the other backend, when
// it may have been served there within its policy's horizon: the other
// backend is read, and when it holds anything that counts, the serving
// backend decides with Seed, merging that state in the same atomic step (a
// take merges with a Seed of cost 0 first). One extra round trip, once per
// identifier and policy per horizon at most. When the serving backend is no
// Seeder, or the other one cannot be read, the serving backend decides
// alone and the failure is counted.
func (b *Backend) seeded(ctx context.Context, side Side, req driver.Request, take bool) (driver.Outcome, error) {
	serving := b.backends[side]
	horizon := driver.Horizon(req.Policy)
	if !b.needsSeed(req, side, horizon) {
		return decideOn(ctx, serving, req, take)
	}
	plain := func() (driver.Outcome, error) { return decideOn(ctx, serving, req, take) }
	key := seedKey{req.Policy, req.Identifier}
	// The entry is stamped with the history as it stood before the look
	// across: a change that lands meanwhile makes the next decision look
	// again.
	var seq uint64
	if h := b.history.Load(); h != nil {
		seq = h.seq
	}
	entry := seedEntry{until: req.Now.Add(horizon), seq: seq, side: side}
	b.stats.seedChecks.Add(1)
	sd, ok := serving.(driver.Seeder)
	if !ok {
		b.stats.seedUnsupported.Add(1)
		b.seeds.remember(key, entry, req.Now)
		return plain()
	}
	given, err := b.lookAcross(ctx, side.other(), req)
	if err != nil {
		// Look again a little later, not on every request while the other
		// backend is down.
		b.secondaryFailed(side.other(), "seed", err)
		entry.until = minTime(entry.until, req.Now.Add(seedRetry))
		b.seeds.remember(key, entry, req.Now)
		return plain()
	}
	if given == nil {
		b.seeds.remember(key, entry, req.Now)
		return plain()
	}
	var out driver.Outcome
	if take {
		merge := req
		merge.Cost, merge.Buffer = 0, nil
		if _, err = sd.Seed(ctx, merge, given); err == nil {
			out, err = plain()
		}
	} else {
		out, err = sd.Seed(ctx, req, given)
		out.Prior = nil
	}
	if errors.Is(err, errors.ErrUnsupported) {
		// A decorator whose store cannot take states.
		b.stats.seedUnsupported.Add(1)
		b.seeds.remember(key, entry, req.Now)
		return plain()
	}
	if err != nil {
		return driver.Outcome{}, err
	}
	b.stats.seeded.Add(1)
	b.seeds.remember(key, entry, req.Now)
	return out, nil
}

// decideOn decides req on b: a take when take is set.
func decideOn(ctx context.Context, b driver.Backend, req driver.Request, take bool) (driver.Outcome, error) {
	if take {
		return driver.TakeWith(ctx, b, req)
	}
	return b.Decide(ctx, req)
}

// seedRetry is how long a Backend waits before reading an unreachable other
// backend again for the same identifier.
const seedRetry = time.Second

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// carry makes the secondary backend of side hold the states the primary
// decided (MirrorMode): a Seed of cost 0 with the primary's states, which
// leaves the secondary holding the same windows whenever mirroring began.
// decided is the cost the primary charged (0 for a denial). It reports
// false when the secondary is no Seeder, for the caller to replay instead.
func (b *Backend) carry(ctx context.Context, side Side, req driver.Request, primary driver.Outcome, decided int64) bool {
	sd, ok := b.backends[side].(driver.Seeder)
	if !ok {
		return false
	}
	if len(primary.States) != len(req.Policy.Limits) {
		b.secondaryFailed(side, "mirror", driver.ErrBadReply)
		return true
	}
	// Seed only reads what it is given, so the primary's states (which may
	// live in the throttler's buffer) are passed as they are.
	given := primary.States
	write := req
	write.Cost, write.Buffer = 0, nil
	out, err := sd.Seed(ctx, write, given)
	if errors.Is(err, errors.ErrUnsupported) {
		// A decorator whose store cannot take states: replay instead.
		return false
	}
	if err != nil {
		b.secondaryFailed(side, "mirror", err)
		return true
	}
	b.stats.mirrored.Add(1)
	if diverged(req, out.Prior, given, decided) {
		b.stats.mirrorDiverged.Add(1)
	}
	return true
}

// diverged reports whether a secondary that held prior before a mirrored
// write was apart from the primary: had it decided the same request (cost
// decided, 0 for a denial) itself, some limit would count differently at
// now than the primary's states after the decision. A secondary that
// already held everything the primary's states carry (the merge would change
// nothing) is not apart: that is what two writes for one identifier find
// when they land in the other order than their decisions, the later
// decision's first. A secondary holding a fixed window open at now with
// another End than the primary's is apart even when the merge changes
// nothing: it keeps that End (driver.Merge never moves an open window's
// End), so its clients would be shown another ResetAt until it closes.
func diverged(req driver.Request, prior, primary []driver.State, decided int64) bool {
	p := req.Policy
	if len(prior) != len(p.Limits) {
		return true
	}
	var buf [4]driver.State // policies of up to 4 limits replay on the stack
	replay := append(buf[:0], prior...)
	if !driver.Merge(p, req.Now, replay, primary) && !otherOpenEnd(p, req.Now, prior, primary) {
		return false
	}
	replay = append(replay[:0], prior...)
	if decided > 0 && !driver.Decide(p, req.Now, decided, replay) {
		return true
	}
	for i := range p.Limits {
		l := &p.Limits[i]
		if driver.InForce(l, replay[i], req.Now) != driver.InForce(l, primary[i], req.Now) {
			return true
		}
	}
	return false
}

// otherOpenEnd reports whether some fixed window is open at now in both
// held and given with two different Ends.
func otherOpenEnd(p *driver.Policy, now time.Time, held, given []driver.State) bool {
	if len(held) != len(p.Limits) || len(given) != len(p.Limits) {
		return false
	}
	for i := range p.Limits {
		l := &p.Limits[i]
		if l.Algorithm != driver.FixedWindow && l.Algorithm != driver.AlignedWindow {
			continue
		}
		h, g := driver.InForce(l, held[i], now), driver.InForce(l, given[i], now)
		if h != (driver.State{}) && g != (driver.State{}) && h.End != g.End {
			return true
		}
	}
	return false
}

// seedStats are the seeding counters of a Backend's statistics.
type seedStats struct {
	seedChecks      atomic.Uint64
	seeded          atomic.Uint64
	seedUnsupported atomic.Uint64
	mirrorDiverged  atomic.Uint64
}

// Seed implements driver.Seeder: the serving backend takes the given states
// and decides req.Cost in one step. In MirrorMode the other backend is then
// written the serving backend's states, as after a decision. A serving
// backend without Seeder gives an error wrapping errors.ErrUnsupported.
func (b *Backend) Seed(ctx context.Context, req driver.Request, given []driver.State) (driver.Outcome, error) {
	if err := b.ready(); err != nil {
		return driver.Outcome{}, err
	}
	side := b.route(req.Identifier, req.Now)
	sd, ok := b.backends[side].(driver.Seeder)
	if !ok {
		return driver.Outcome{}, driver.Errorf("throttlekit: rollout: %w: %s backend cannot take states", errors.ErrUnsupported, side)
	}
	out, err := sd.Seed(ctx, req, given)
	if err != nil || b.mode != MirrorMode {
		return out, err
	}
	decided := int64(0)
	if out.Allowed {
		decided = req.Cost
	}
	write := req
	write.Buffer = nil
	if !b.carry(ctx, side.other(), write, out, decided) && decided > 0 {
		b.mirror(ctx, side.other(), write)
	}
	return out, nil
}
