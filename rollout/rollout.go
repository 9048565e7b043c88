package rollout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"time"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// Mode says how a Backend uses the backend that does not serve an
// identifier.
type Mode int

const (
	// SplitMode (the default) sends each identifier's requests only to the
	// backend that serves it. When an identifier may have moved (the split
	// changed within its policy's horizon), its state is first carried over
	// from the other backend (seeding), so that a move keeps its windows.
	SplitMode Mode = iota
	// MirrorMode decides on the serving backend and then writes the states
	// it decided to the other backend too (driver.Seeder), so that both
	// hold the same windows and moving an identifier keeps them: neither a
	// reset nor a doubled quota.
	MirrorMode
	// ShadowMode decides on the serving backend, runs the same decision on
	// the other one and counts where they disagree. The other backend's
	// verdict is never used.
	ShadowMode
)

// String returns "split", "mirror" or "shadow".
func (m Mode) String() string {
	switch m {
	case SplitMode:
		return "split"
	case MirrorMode:
		return "mirror"
	case ShadowMode:
		return "shadow"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// mirrorAttempts bounds the tries to record units on a secondary backend
// that races with other writers.
const mirrorAttempts = 3

// Backend is a driver.Backend over an old and a new backend. For every
// request its FlagSource says which of the two serves the identifier; the
// Mode says what the other one sees. It implements Peeker, Refunder,
// Resetter, Pinger and Leaser, forwarding each as its doc says. It is safe for
// concurrent use.
type Backend struct {
	backends    [2]driver.Backend
	source      FlagSource
	mode        Mode
	fallback    Side
	onMismatch  func(Mismatch)
	onSecondary func(error)
	stats       counters

	// Seeding (split mode): the splits in force lately, and the
	// identifiers already carried over. seeds is nil when seeding is off.
	seeding    bool
	seedMemory int
	seeds      *seedMemory
	historyMu  sync.Mutex
	history    atomic.Pointer[history]
}

// Option configures a Backend (New, Upgrade, UpgradeKeys).
type Option interface {
	apply(*Backend) error
}

// optionFunc adapts a function to Option.
type optionFunc func(*Backend) error

func (f optionFunc) apply(b *Backend) error { return f(b) }

// WithMode sets the mode; the default is SplitMode.
func WithMode(m Mode) Option {
	return optionFunc(func(b *Backend) error {
		if m < SplitMode || m > ShadowMode {
			return driver.Errorf("%w: rollout: WithMode(%d): unknown mode", driver.ErrInvalidOption, int(m))
		}
		b.mode = m
		return nil
	})
}

// WithDefaultSide sets the backend that serves every identifier while the
// flag source has no answer yet (its Split returns nil); the default is
// SideOld.
func WithDefaultSide(s Side) Option {
	return optionFunc(func(b *Backend) error {
		if s != SideOld && s != SideNew {
			return driver.Errorf("%w: rollout: WithDefaultSide(%d): unknown side", driver.ErrInvalidOption, int(s))
		}
		b.fallback = s
		return nil
	})
}

// WithMismatchHandler sets a function called, in ShadowMode, with every
// decision on which the two backends disagree. It runs on the request path:
// it must be fast and safe for concurrent use.
func WithMismatchHandler(f func(Mismatch)) Option {
	return optionFunc(func(b *Backend) error { b.onMismatch = f; return nil })
}

// WithSecondaryErrorHandler sets a function called with every failure of the
// secondary backend in MirrorMode and ShadowMode. The error wraps ErrSecondary and the backend's own error.
// It runs on the request path: it must be fast and safe for concurrent use.
// Such failures are counted in Stats whether or not a handler is set.
func WithSecondaryErrorHandler(f func(error)) Option {
	return optionFunc(func(b *Backend) error { b.onSecondary = f; return nil })
}

// WithSeeding turns seeding on (the default) or off, in split and mirror
// modes. With it, an identifier that may have been served by the other
// backend within its policy's horizon (the split changed lately, or this
// process started lately) has its state read there and merged into its
// serving backend before the decision, once per horizon: a move keeps its
// windows, and in mirror mode so does a deploy at a percentage above 0,
// before the stores have converged. Off, a moved identifier starts afresh
// on its new backend in split mode. Seeding needs the
// serving backend to implement driver.Seeder; without it, decisions go on
// unseeded and Stats counts them.
func WithSeeding(on bool) Option {
	return optionFunc(func(b *Backend) error { b.seeding = on; return nil })
}

// WithSeedMemory bounds the number of (policy, identifier) pairs a Backend
// remembers as seeded, DefaultSeedMemory unless set. A pair forgotten
// early is only looked up again, at the cost of a round trip.
func WithSeedMemory(entries int) Option {
	return optionFunc(func(b *Backend) error {
		if entries < 1 {
			return driver.Errorf("%w: rollout: WithSeedMemory(%d): fewer than one entry", driver.ErrInvalidOption, entries)
		}
		b.seedMemory = entries
		return nil
	})
}

// New returns a Backend that moves identifiers from oldBackend to newBackend
// as source says. The error wraps driver.ErrInvalidOption.
func New(oldBackend, newBackend driver.Backend, source FlagSource, opts ...Option) (*Backend, error) {
	b := &Backend{backends: [2]driver.Backend{oldBackend, newBackend}, source: source,
		seeding: true, seedMemory: DefaultSeedMemory}
	for _, opt := range opts {
		if opt == nil {
			return nil, driver.Errorf("%w: rollout: nil Option", driver.ErrInvalidOption)
		}
		if err := opt.apply(b); err != nil {
			return nil, err
		}
	}
	switch {
	case oldBackend == nil || newBackend == nil:
		return nil, driver.Errorf("%w: rollout: nil backend", driver.ErrInvalidOption)
	case source == nil:
		return nil, driver.Errorf("%w: rollout: nil flag source", driver.ErrInvalidOption)
	case b.mode < SplitMode || b.mode > ShadowMode:
		return nil, driver.Errorf("%w: rollout: unknown mode %d", driver.ErrInvalidOption, int(b.mode))
	case b.fallback != SideOld && b.fallback != SideNew:
		return nil, driver.Errorf("%w: rollout: unknown default side %d", driver.ErrInvalidOption, int(b.fallback))
	case b.seedMemory < 1:
		return nil, driver.Errorf("%w: rollout: seed memory of %d entries", driver.ErrInvalidOption, b.seedMemory)
	}
	if b.seeding && b.mode != ShadowMode {
		b.seeds = newSeedMemory(b.seedMemory)
	}
	return b, nil
}

// Mode returns the backend's mode.
func (b *Backend) Mode() Mode { return b.mode }

// Backends returns the old and the new backend.
func (b *Backend) Backends() (oldBackend, newBackend driver.Backend) {
	return b.backends[SideOld], b.backends[SideNew]
}

// Source returns the FlagSource the Backend routes by, for status pages
// and metrics (its Split is the split in force).
func (b *Backend) Source() FlagSource { return b.source }

// Side returns the backend that serves identifier now: the flag source's
// split, or the default side before the source has an answer.
func (b *Backend) Side(identifier string) Side {
	if b.source == nil {
		return b.fallback
	}
	if sp := b.source.Split(); sp != nil {
		return sp.Side(identifier)
	}
	return b.fallback
}

// ready reports whether b was built by New.
func (b *Backend) ready() error {
	if b == nil || b.source == nil || b.backends[SideOld] == nil || b.backends[SideNew] == nil {
		return driver.Errorf("%w: rollout.Backend not built by New", driver.ErrNotInitialized)
	}
	return nil
}

// route is Side for a decision at now, counting decisions routed by the
// default and recording changes of split for seeding.
func (b *Backend) route(identifier string, now time.Time) Side {
	r := b.observe(now)
	if r.split == nil {
		b.stats.defaultRouted.Add(1)
	}
	return r.side(identifier)
}

// Decide implements driver.Backend. The serving backend decides. In
// SplitMode it first takes over the identifier's state from the other
// backend when the identifier may have moved (see WithSeeding). In
// MirrorMode, after a decision of cost > 0, allowed or denied, the other
// backend is written the states the serving one decided (driver.Seeder;
// a secondary without it replays the allowed units instead). In ShadowMode
// the other backend then decides the same request and the two outcomes are
// compared. Failures of the other backend never change the outcome
// returned.
func (b *Backend) Decide(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	if err := b.ready(); err != nil {
		return driver.Outcome{}, err
	}
	side := b.route(req.Identifier, req.Now)
	if b.mode == SplitMode {
		if b.seeds == nil {
			return b.backends[side].Decide(ctx, req)
		}
		return b.seeded(ctx, side, req, false)
	}
	var (
		out driver.Outcome
		err error
	)
	if b.mode == MirrorMode && b.seeds != nil {
		out, err = b.seeded(ctx, side, req, false)
	} else {
		out, err = b.backends[side].Decide(ctx, req)
	}
	if err != nil {
		return out, err
	}
	// The serving backend's outcome may live in req.Buffer: the second
	// backend must not write over it.
	req.Buffer = nil
	if b.mode == MirrorMode {
		if req.Cost > 0 {
			decided := int64(0)
			if out.Allowed {
				decided = req.Cost
			}
			if !b.carry(ctx, side.other(), req, out, decided) && out.Allowed {
				b.mirror(ctx, side.other(), req)
			}
		}
		return out, nil
	}
	b.shadow(ctx, side, req, out)
	return out, nil
}

// Take implements driver.Taker: the serving backend takes (its own Take, or
// driver.TakeWith's rounds of a peek and a decision), after seeding in
// SplitMode as Decide does, and the other one sees the units granted as it
// sees a decision of that cost: written the serving backend's states in
// MirrorMode, compared in ShadowMode (a take that granted nothing is
// compared as a denied request of one unit).
func (b *Backend) Take(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	if err := b.ready(); err != nil {
		return driver.Outcome{}, err
	}
	side := b.route(req.Identifier, req.Now)
	if b.mode == SplitMode {
		if b.seeds == nil {
			return driver.TakeWith(ctx, b.backends[side], req)
		}
		return b.seeded(ctx, side, req, true)
	}
	var (
		out driver.Outcome
		err error
	)
	if b.mode == MirrorMode && b.seeds != nil {
		out, err = b.seeded(ctx, side, req, true)
	} else {
		out, err = driver.TakeWith(ctx, b.backends[side], req)
	}
	if err != nil {
		return out, err
	}
	req.Buffer = nil // out may live in it
	req.Cost = max(out.Granted, 1)
	if b.mode == MirrorMode {
		if !b.carry(ctx, side.other(), req, out, out.Granted) && out.Granted > 0 {
			b.mirror(ctx, side.other(), req)
		}
		return out, nil
	}
	b.shadow(ctx, side, req, out)
	return out, nil
}

// mirror records req.Cost units, already allowed on the serving backend, on
// the backend of side. The secondary decides as usual, so it takes them
// whole when it has room; when it has less (its state diverged, say it held
// counts from before mirroring began), it takes as many as it can hold, so
// that it is at least as full as its limits allow. Units it cannot take are
// counted as a shortfall.
func (b *Backend) mirror(ctx context.Context, side Side, req driver.Request) {
	secondary := b.backends[side]
	cost := req.Cost
	for attempt := 0; attempt < mirrorAttempts && cost > 0; attempt++ {
		try := req
		try.Cost = cost
		out, err := secondary.Decide(ctx, try)
		if err != nil {
			b.secondaryFailed(side, "mirror", err)
			break
		}
		if out.Allowed {
			b.stats.mirrored.Add(1)
			if cost < req.Cost {
				b.shortfall(req.Cost - cost)
			}
			return
		}
		// Denied: the secondary is fuller than the primary. What it can
		// still hold is the smallest Remaining over its limits; a racing
		// writer may take it first, hence the bounded retries.
		room := headroom(req, out.States)
		cost = min(room, cost)
	}
	b.shortfall(req.Cost)
}

func (b *Backend) shortfall(units int64) {
	b.stats.mirrorShortfalls.Add(1)
	b.stats.mirrorShortfallUnits.Add(uint64(units))
}

// headroom returns how many units one request could still consume at
// req.Now under every limit of req.Policy, given the states a backend
// reported.
func headroom(req driver.Request, states []driver.State) int64 {
	return driver.Headroom(req.Policy, req.Now, states)
}

// Peek implements driver.Peeker: the serving backend answers, through
// its own Peek when it has one, otherwise through Decide with cost 0 (the
// throttler's fallback). In SplitMode with seeding, when the identifier may
// have moved and has not been seeded yet, the other backend is read too and
// its state merged into the answer as a seeded decision would see it,
// without writing anything. Mirror and shadow modes ask the serving
// backend only.
func (b *Backend) Peek(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	if err := b.ready(); err != nil {
		return driver.Outcome{}, err
	}
	req.Cost = 0
	side := b.Side(req.Identifier)
	out, err := driver.PeekWith(ctx, b.backends[side], req)
	if err != nil || !b.needsSeed(req, side, driver.Horizon(req.Policy)) || len(out.States) != len(req.Policy.Limits) {
		return out, err
	}
	given, gerr := b.lookAcross(ctx, side.other(), req)
	if gerr != nil {
		b.secondaryFailed(side.other(), "seed", gerr)
		return out, nil
	}
	if given != nil {
		states := append([]driver.State(nil), out.States...)
		driver.Merge(req.Policy, req.Now, states, given)
		out.States = states
	}
	return out, nil
}

// Nonblocking implements driver.Nonblocking: true when both backends are
// nonblocking (in-process stores), so that the throttler gives their
// decisions no call timeout.
func (b *Backend) Nonblocking() bool {
	if b.ready() != nil {
		return false
	}
	for _, backend := range b.backends {
		nb, ok := backend.(driver.Nonblocking)
		if !ok || !nb.Nonblocking() {
			return false
		}
	}
	return true
}

// Refund implements driver.Refunder. The serving backend refunds and its
// answer is returned. In MirrorMode and ShadowMode the other backend, which
// recorded the units too, refunds them as well; its failure is counted and
// reported, never returned. A refund gives back up to req.Cost units and
// never goes below zero, so a secondary that recorded fewer units (a mirror
// shortfall, a shadow that denied) may end emptier than the primary.
//
// Fallback: a serving backend without Refunder makes Refund return an error
// wrapping errors.ErrUnsupported; a secondary without it is skipped.
func (b *Backend) Refund(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	if err := b.ready(); err != nil {
		return driver.Outcome{}, err
	}
	side := b.Side(req.Identifier)
	rf, ok := b.backends[side].(driver.Refunder)
	if !ok {
		return driver.Outcome{}, driver.Errorf("throttlekit: rollout: %w: %s backend cannot refund", errors.ErrUnsupported, side)
	}
	out, err := rf.Refund(ctx, req)
	if err != nil || b.mode == SplitMode {
		return out, err
	}
	req.Buffer = nil // out may live in it
	if rf, ok := b.backends[side.other()].(driver.Refunder); ok {
		if _, err := rf.Refund(ctx, req); err != nil {
			b.secondaryFailed(side.other(), "refund", err)
		}
	}
	return out, nil
}

// Reset implements driver.Resetter. It resets the identifier on both
// backends, whichever serves it, so that a later move finds nothing stale.
// The error joins the failures of either backend; a backend without
// Resetter gives an error wrapping errors.ErrUnsupported.
func (b *Backend) Reset(ctx context.Context, p *driver.Policy, identifier string) error {
	if err := b.ready(); err != nil {
		return err
	}
	var errs [2]error
	for side, backend := range b.backends {
		rs, ok := backend.(driver.Resetter)
		if !ok {
			errs[side] = driver.Errorf("throttlekit: rollout: %w: %s backend cannot reset", errors.ErrUnsupported, Side(side))
			continue
		}
		if err := rs.Reset(ctx, p, identifier); err != nil {
			errs[side] = driver.Errorf("throttlekit: rollout: %s backend: %w", Side(side), err)
		}
	}
	return errors.Join(errs[:]...)
}

// Acquire implements driver.Leaser. The serving backend decides. In
// MirrorMode and ShadowMode, a lease it acquired is then taken on the other
// backend too, best effort, so that an identifier moved while its requests
// are in flight finds them counted there: a secondary that refuses (it is
// fuller) counts as a mirror shortfall in MirrorMode, one that fails as a
// secondary error, and neither changes the outcome. Shadow mode does not
// compare lease outcomes.
//
// Fallback: a serving backend without Leaser gives an error wrapping
// errors.ErrUnsupported; a secondary without one is skipped.
func (b *Backend) Acquire(ctx context.Context, req driver.LeaseRequest) (driver.LeaseOutcome, error) {
	if err := b.ready(); err != nil {
		return driver.LeaseOutcome{}, err
	}
	side := b.route(req.Identifier, req.Now)
	lr, ok := b.backends[side].(driver.Leaser)
	if !ok {
		return driver.LeaseOutcome{}, driver.Errorf("throttlekit: rollout: %w: %s backend has no concurrency leases", errors.ErrUnsupported, side)
	}
	out, err := lr.Acquire(ctx, req)
	if err != nil || b.mode == SplitMode || !out.Acquired {
		return out, err
	}
	if other, ok := b.backends[side.other()].(driver.Leaser); ok {
		mirrored, err := other.Acquire(ctx, req)
		switch {
		case err != nil:
			b.secondaryFailed(side.other(), "acquire", err)
		case b.mode != MirrorMode:
		case mirrored.Acquired:
			b.stats.mirrored.Add(1)
		default:
			b.shortfall(1)
		}
	}
	return out, nil
}

// Release implements driver.Leaser. The serving backend releases and its
// answer is returned. In MirrorMode and ShadowMode the other backend,
// which took the lease too, releases it as well. In SplitMode the other
// backend is asked only when the serving one did not hold the lease: it
// was acquired before the identifier moved (or has expired), and the
// backend that served it then holds it. Failures of the other backend are
// counted and reported, never returned.
//
// Fallback: a serving backend without Leaser gives an error wrapping
// errors.ErrUnsupported; a secondary without one is skipped.
func (b *Backend) Release(ctx context.Context, req driver.LeaseRequest) (driver.LeaseOutcome, error) {
	if err := b.ready(); err != nil {
		return driver.LeaseOutcome{}, err
	}
	side := b.Side(req.Identifier)
	lr, ok := b.backends[side].(driver.Leaser)
	if !ok {
		return driver.LeaseOutcome{}, driver.Errorf("throttlekit: rollout: %w: %s backend has no concurrency leases", errors.ErrUnsupported, side)
	}
	out, err := lr.Release(ctx, req)
	if err != nil || b.mode == SplitMode && out.Held {
		return out, err
	}
	if other, ok := b.backends[side.other()].(driver.Leaser); ok {
		moved, err := other.Release(ctx, req)
		if err != nil {
			b.secondaryFailed(side.other(), "release", err)
		} else if b.mode == SplitMode && moved.Held {
			return moved, nil
		}
	}
	return out, nil
}

// Ping implements driver.Pinger. It pings both backends, because the
// split can send any identifier to either of them at any moment without a
// deploy, and the flag source when it implements driver.Pinger (an Unleash
// source that cannot fetch its toggle). The error joins every failure; a
// backend without Pinger counts as reachable (the throttler's fallback).
func (b *Backend) Ping(ctx context.Context) error {
	if err := b.ready(); err != nil {
		return err
	}
	var errs [3]error
	for side, backend := range b.backends {
		if pg, ok := backend.(driver.Pinger); ok {
			if err := pg.Ping(ctx); err != nil {
				errs[side] = driver.Errorf("throttlekit: rollout: %s backend: %w", Side(side), err)
			}
		}
	}
	if pg, ok := b.source.(driver.Pinger); ok {
		if err := pg.Ping(ctx); err != nil {
			errs[2] = driver.Errorf("throttlekit: rollout: flag source: %w", err)
		}
	}
	return errors.Join(errs[:]...)
}

// Close implements driver.Closer: it closes both backends, each that
// implements driver.Closer, and joins their errors. The flag source stays
// the caller's to close, as it may feed other backends.
func (b *Backend) Close() error {
	if b == nil {
		return nil
	}
	var errs [2]error
	for side, backend := range b.backends {
		if c, ok := backend.(driver.Closer); ok {
			if err := c.Close(); err != nil {
				errs[side] = driver.Errorf("throttlekit: rollout: %s backend: %w", Side(side), err)
			}
		}
	}
	return errors.Join(errs[:]...)
}

// CheckConfig implements driver.ConfigChecker: it asks both backends, each
// that implements it, and joins their errors, each naming its side.
func (b *Backend) CheckConfig(callTimeout time.Duration) error {
	if b == nil {
		return nil
	}
	var errs [2]error
	for side, backend := range b.backends {
		if err := driver.CheckConfig(backend, callTimeout); err != nil {
			errs[side] = driver.Errorf("throttlekit: rollout: %s backend: %w", Side(side), err)
		}
	}
	return errors.Join(errs[:]...)
}

// SetLogger implements driver.LoggerSetter: it passes l to both backends
// and to the flag source, each that implements driver.LoggerSetter. The
// Backend logs nothing of its own: secondary failures go to the handler of
// WithSecondaryErrorHandler.
func (b *Backend) SetLogger(l *slog.Logger) {
	if b == nil {
		return
	}
	for _, backend := range b.backends {
		if ls, ok := backend.(driver.LoggerSetter); ok {
			ls.SetLogger(l)
		}
	}
	if ls, ok := b.source.(driver.LoggerSetter); ok {
		ls.SetLogger(l)
	}
}

// secondaryFailed counts and reports a failure of the backend of side that
// does not decide anything.
func (b *Backend) secondaryFailed(side Side, op string, err error) {
	b.stats.secondaryErrors.Add(1)
	if b.onSecondary != nil {
		b.onSecondary(driver.Errorf("%w: %s backend, %s: %w", ErrSecondary, side, op, err))
	}
}

var (
	_ driver.Backend  = (*Backend)(nil)
	_ driver.Peeker   = (*Backend)(nil)
	_ driver.Refunder = (*Backend)(nil)
	_ driver.Taker    = (*Backend)(nil)
	_ driver.Resetter = (*Backend)(nil)
	_ driver.Pinger   = (*Backend)(nil)
	_ driver.Closer   = (*Backend)(nil)
	_ driver.Leaser   = (*Backend)(nil)
	_ driver.Seeder   = (*Backend)(nil)

	_ driver.Nonblocking   = (*Backend)(nil)
	_ driver.LoggerSetter  = (*Backend)(nil)
	_ driver.ConfigChecker = (*Backend)(nil)
)

// counters are the Backend's statistics. Split mode touches none of them on
// the hot path (bar decisions routed by the default), so that counting adds
// no shared-memory traffic to the plain route.
type counters struct {
	defaultRouted        atomic.Uint64
	mirrored             atomic.Uint64
	mirrorShortfalls     atomic.Uint64
	mirrorShortfallUnits atomic.Uint64
	secondaryErrors      atomic.Uint64
	compared             atomic.Uint64
	mismatches           atomic.Uint64
	allowedDenied        atomic.Uint64
	deniedAllowed        atomic.Uint64
	remainingDiffers     atomic.Uint64
	resetDiffers         atomic.Uint64
	seedStats
}
