package memcachedbackend

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/throttlekit/throttlekit/backend/breaker"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// Defaults of a Backend and of NewClient.
const (
	// DefaultPrefix starts every key unless WithPrefix says otherwise.
	DefaultPrefix = "tk"
	// DefaultCASRetries is how many times a compare-and-swap that lost a
	// race is retried before the call fails with ErrRetriesExhausted. At
	// one clock reading a GCRA item changes at most Burst times before
	// every request is denied without writing, so contention ends on its
	// own; the bound is for pathological cases, and the call's context
	// bounds the time anyway.
	DefaultCASRetries = 50
	// DefaultMaxIdleConns is the connection pool size per server NewClient
	// sets. gomemcache's own default (2) closes and redials connections as
	// soon as more than two goroutines decide at once.
	DefaultMaxIdleConns = 64
	// MaxPrefixLen bounds the escaped key prefix.
	MaxPrefixLen = 40
)

var (
	// ErrRetriesExhausted reports a call that lost more compare-and-swap
	// races than WithCASRetries allows (GCRA writes, window openings,
	// refunds, seeds). The call gives back the units it took (a give-back that
	// fails is counted in Stats.RollbackFailures); the throttler applies
	// the policy's failure mode and passes the error, then wrapped in
	// throttler.ErrBackend, to its Observer. Stats counts it too.
	ErrRetriesExhausted = errors.New("throttlekit: memcached: compare-and-swap retries exhausted")
)

// Backend is a driver.Backend over memcached. It implements Peeker,
// Refunder, Resetter, Pinger and Seeder. It is safe for concurrent use,
// and any number of Backends in any number of processes may share servers
// as long as they use the same prefix and server placement. See the
// package documentation for the design and its guarantees.
type Backend struct {
	client     *memcache.Client
	prefix     string
	casRetries int
	// wall is the host clock used only to turn lifetimes over 30 days into
	// the absolute expirations memcached requires; it decides nothing.
	wall  func() time.Time
	stats struct {
		roundTrips, casConflicts, retriesExhausted, rollbackFailures, windowsLost, openingsRetracted atomic.Uint64
	}

	cfg serverConfig
	// selector places keys on servers (NewClient's, or WithSelector's);
	// nil when the client's placement is unknown, and then whole is the
	// one server every call goes through: the client as given.
	selector *RendezvousSelector
	whole    *server
	// servers holds a *server per address, made on first use (serversMu
	// serializes the making).
	servers   sync.Map
	serversMu sync.Mutex
	// breakers holds the servers' circuit breakers, nil without.
	breakers *breaker.Set
	// turns queues this backend's compare-and-swap writers per identifier
	// (see turns.go).
	turns turns

	hooks testHooks
	// turnsOff makes calls write without waiting for their turn, for tests
	// that measure what the turns change.
	turnsOff bool
}

// testHooks let tests interleave a second client between two round trips
// of a call, which is how races are made reproducible against a real
// server. They are nil outside tests.
type testHooks struct {
	// overLimit runs after a fixed-window incr went over Max, before the
	// units are given back.
	overLimit func()
	// beforeCAS runs after a GCRA item was read, before it is written.
	beforeCAS func()
	// beforePublish runs after a new window's counter (named) was added,
	// before the window item is written to point at it.
	beforePublish func(counter string)
	// beforeRetract runs when a denied or failed call has given back the
	// units of a window it opened and the counter (named) read zero, before
	// it checks the counter again to retract the opening.
	beforeRetract func(counter string)
	// afterGiveBack runs when a rollback has finished, in the goroutine
	// that ran it, whether or not the call waited for it.
	afterGiveBack func()
	// beforeSeedWrite runs when a Seed has read a limit's state and is
	// about to write its merge.
	beforeSeedWrite func()
}

var (
	_ driver.Backend  = (*Backend)(nil)
	_ driver.Peeker   = (*Backend)(nil)
	_ driver.Refunder = (*Backend)(nil)
	_ driver.Resetter = (*Backend)(nil)
	_ driver.Pinger   = (*Backend)(nil)
	_ driver.Seeder   = (*Backend)(nil)
)

// Option configures a Backend (New).
type Option interface {
	apply(*Backend) error
}

// optionFunc adapts a function to Option.
type optionFunc func(*Backend) error

func (f optionFunc) apply(b *Backend) error { return f(b) }

// WithPrefix sets the prefix of every key (DefaultPrefix otherwise). Give
// each application or test its own to keep their state apart; backends
// that share state must share the prefix. It is escaped like identifiers
// and must then be 1 to MaxPrefixLen bytes.
func WithPrefix(prefix string) Option {
	return optionFunc(func(b *Backend) error { b.prefix = prefix; return nil })
}

// WithCASRetries sets how many lost compare-and-swap races a call retries
// (DefaultCASRetries otherwise); zero means one attempt and no retry.
func WithCASRetries(n int) Option {
	return optionFunc(func(b *Backend) error { b.casRetries = n; return nil })
}

// New returns a Backend over client. Build the client with NewClient, or
// with memcache.NewFromSelector over a RendezvousSelector and a Timeout set
// (and give the selector with WithSelector): gomemcache takes no context,
// so the client's Timeout is what bounds each round trip, and the backend
// must know which server holds a key to give each server a circuit breaker
// and a connection pool of its own (see Timeouts and contexts, and Servers,
// in the package documentation). The error wraps driver.ErrInvalidOption.
func New(client *memcache.Client, opts ...Option) (*Backend, error) {
	b := &Backend{client: client, prefix: DefaultPrefix, casRetries: DefaultCASRetries, wall: time.Now,
		cfg: serverConfig{breaker: true}}
	for _, opt := range opts {
		if opt == nil {
			return nil, driver.Errorf("%w: memcached: nil Option", driver.ErrInvalidOption)
		}
		if err := opt.apply(b); err != nil {
			return nil, err
		}
	}
	switch {
	case client == nil:
		return nil, driver.Errorf("%w: nil client", driver.ErrInvalidOption)
	case b.prefix == "":
		return nil, driver.Errorf("%w: empty prefix", driver.ErrInvalidOption)
	case len(driver.EscapeKey(b.prefix)) > MaxPrefixLen:
		return nil, driver.Errorf("%w: prefix longer than %d bytes once escaped", driver.ErrInvalidOption, MaxPrefixLen)
	case b.casRetries < 0:
		return nil, driver.Errorf("%w: negative CAS retries %d", driver.ErrInvalidOption, b.casRetries)
	}
	b.prefix = driver.EscapeKey(b.prefix)
	if err := b.setUpServers(); err != nil {
		return nil, err
	}
	return b, nil
}

// NewClient returns a gomemcache client over servers placed by a
// RendezvousSelector, whose every round trip (dial, write, read) is bounded
// by timeout (throttler.DefaultCallTimeout when zero or less), with
// DefaultMaxIdleConns connections kept per server. The error wraps
// driver.ErrInvalidOption.
func NewClient(timeout time.Duration, servers ...string) (*memcache.Client, error) {
	sel, err := NewRendezvousSelector(servers...)
	if err != nil {
		return nil, err
	}
	c := memcache.NewFromSelector(sel)
	if timeout <= 0 {
		timeout = throttler.DefaultCallTimeout
	}
	c.Timeout = timeout
	c.MaxIdleConns = DefaultMaxIdleConns
	registerSelector(c, sel)
	return c, nil
}

// CheckConfig implements driver.ConfigChecker: the client's Timeout must
// be at most the throttler's call timeout. gomemcache takes no context, so
// each round trip runs its whole Timeout whatever the call's deadline, and
// a longer Timeout makes every call against a silent server last it
// instead of the call timeout (see "Timeouts and contexts" in the package
// documentation). A zero callTimeout (calls bound by the caller's context
// alone) accepts any Timeout. A Backend New did not build passes: its calls
// fail with ErrNotInitialized.
func (b *Backend) CheckConfig(callTimeout time.Duration) error {
	if b.ready() != nil {
		return nil
	}
	if client := b.giveBackBudget(); callTimeout > 0 && client > callTimeout {
		return driver.Errorf("%w: memcached: client Timeout %v is longer than the throttler's call timeout %v (WithCallTimeout): keep it at most the call timeout, as NewClient(timeout, ...) sets it",
			driver.ErrInvalidOption, client, callTimeout)
	}
	return nil
}

var _ driver.ConfigChecker = (*Backend)(nil)

// Stats are a Backend's counters since it was built.
type Stats struct {
	// RoundTrips counts requests sent to servers: one per gomemcache call
	// (a multi-key get of one subject's keys is one, as they share a
	// server).
	RoundTrips uint64
	// CASConflicts counts compare-and-swap or add writes that lost a race
	// and were retried or given up.
	CASConflicts uint64
	// RetriesExhausted counts calls that failed with ErrRetriesExhausted.
	RetriesExhausted uint64
	// RollbackFailures counts units a denied or failed call could not
	// give back, and windows it opened and could not check for
	// retraction (a server error, or a server silent for the give-back's
	// whole budget): they stay counted, or open, until their window
	// closes, which can deny, never over-admit.
	RollbackFailures uint64
	// WindowsLost counts the times an open fixed window was found without
	// its counter (evicted). The next decision reopens such a window as a
	// fresh one; a peek reports it as absent.
	WindowsLost uint64
	// OpeningsRetracted counts windows that a denied (or failed) call had
	// opened and closed again, because nobody else counted in them by the
	// time it gave its units back (see "Concurrency" in the package
	// documentation).
	OpeningsRetracted uint64
}

// Stats returns the backend's counters (zero for a Backend New did not
// build).
func (b *Backend) Stats() Stats {
	if b == nil {
		return Stats{}
	}
	return Stats{
		RoundTrips:        b.stats.roundTrips.Load(),
		CASConflicts:      b.stats.casConflicts.Load(),
		RetriesExhausted:  b.stats.retriesExhausted.Load(),
		RollbackFailures:  b.stats.rollbackFailures.Load(),
		WindowsLost:       b.stats.windowsLost.Load(),
		OpeningsRetracted: b.stats.openingsRetracted.Load(),
	}
}

// ready reports a Backend that New did not build: its zero value (or a nil
// pointer) has no client and no clock to compute expirations with.
func (b *Backend) ready() error {
	if b == nil || b.client == nil || b.wall == nil || b.prefix == "" {
		return driver.Errorf("%w: memcachedbackend.Backend not built by New", driver.ErrNotInitialized)
	}
	return nil
}

// giveBackBudget bounds a rollback: one client Timeout (gomemcache's
// default when the client has none), counted from the rollback's start and
// independent of the caller's context, so that a call cancelled or timed
// out mid-way still gives back what it took, within a bounded time.
func (b *Backend) giveBackBudget() time.Duration {
	if b.client.Timeout > 0 {
		return b.client.Timeout
	}
	return memcache.DefaultTimeout
}

// Decide applies req to its identifier's policy: allowed only if every
// limit allows; then every limit consumes req.Cost, otherwise none does
// (units taken tentatively are given back). See the package documentation
// for the steps and for what concurrency can and cannot do.
func (b *Backend) Decide(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	if req.Cost == 0 {
		return b.Peek(ctx, req)
	}
	return b.decide(ctx, req, false)
}

// decide is Decide for a caller that holds the identifier's turn already
// (held), or not.
func (b *Backend) decide(ctx context.Context, req driver.Request, held bool) (driver.Outcome, error) {
	c, err := b.newCall(ctx, req)
	if err != nil {
		return driver.Outcome{}, err
	}
	c.holdsTurn, c.borrowed = held, held
	defer c.endTurn()
	return c.decide()
}

// Peek returns the identifier's states without writing anything: one
// round trip for the window and GCRA items, one more for the counters of
// open windows.
func (b *Backend) Peek(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	c, err := b.newCall(ctx, req)
	if err != nil {
		return driver.Outcome{}, err
	}
	if err := c.snapshot(); err != nil {
		return driver.Outcome{}, err
	}
	if err := c.readCounters(); err != nil {
		return driver.Outcome{}, err
	}
	states := c.states()
	allowed := driver.Decide(c.policy, req.Now, req.Cost, states)
	return driver.Outcome{Allowed: allowed, States: states}, nil
}

// Refund gives back up to req.Cost units of the current windows: decr on
// each open window's counter (memcached stops at 0; a counter a Seed
// forwarded is followed to the window that replaced it), and TAT -= Cost*T, not
// below now, on each GCRA item by compare-and-swap. Closed windows are left
// alone. Limits are refunded one after another, not atomically.
func (b *Backend) Refund(ctx context.Context, req driver.Request) (driver.Outcome, error) {
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
	for i := range c.limits {
		l := &c.limits[i]
		if l.cas {
			if err := c.refundCAS(i, req.Cost); err != nil {
				return driver.Outcome{}, err
			}
			continue
		}
		if err := c.refundWindow(i, req.Cost); err != nil {
			return driver.Outcome{}, err
		}
	}
	return driver.Outcome{Allowed: true, States: c.states()}, nil
}

// refundWindow gives back up to n units of fixed-window limit i's open
// window, following the window a Seed replaced it with.
func (c *call) refundWindow(i int, n int64) error {
	l := &c.limits[i]
	for follows := 0; l.open; {
		// No committed count exceeds Max, so giving back more takes
		// nothing more; the clamp also keeps a retracted counter far above
		// retractedFloor.
		key := c.keys.counter(i, l.win)
		v, err := c.incrDecr("decr", key, min(n, l.limit.Max))
		if serverRefused(err) && follows < maxForwards {
			follows++
			live, err := c.follow(i, key, err)
			if err != nil {
				return err
			}
			if !live {
				l.open, l.state = false, driver.State{}
			}
			continue
		}
		switch {
		case errors.Is(err, memcache.ErrCacheMiss), err == nil && v >= retractedFloor:
			l.open, l.state = false, driver.State{}
		case err != nil:
			return err
		default:
			l.state, l.known = driver.State{Used: v, End: l.win.end}, true
		}
		return nil
	}
	return nil
}

// Reset deletes the identifier's window items, the counters they name
// (and those these forward to, see "Seeding"), and its GCRA and
// sliding-window items under p, whatever they hold (so it also clears
// values this package cannot read). A request racing the reset may still
// count in the window it read before; the next window starts fresh.
func (b *Backend) Reset(ctx context.Context, p *driver.Policy, identifier string) error {
	c, err := b.newCall(ctx, driver.Request{Policy: p, Identifier: identifier})
	if err != nil {
		return err
	}
	var windowKeys []string
	for i := range c.limits {
		if !c.limits[i].cas {
			windowKeys = append(windowKeys, c.keys.window(i))
		}
	}
	var items map[string]*memcache.Item
	if len(windowKeys) > 0 {
		err := c.roundTrip(func() (err error) {
			items, err = c.mc.GetMulti(windowKeys)
			return err
		})
		if err != nil {
			return driver.Errorf("throttlekit: memcached: get: %w", err)
		}
	}
	var doomed []string
	for i := range c.limits {
		if c.limits[i].cas {
			doomed = append(doomed, c.keys.cas(i))
			continue
		}
		// The window item first, so that new requests start afresh at
		// once; requests that read it before finish in its counter or find
		// it gone.
		doomed = append(doomed, c.keys.window(i))
		if it := items[c.keys.window(i)]; it != nil {
			if w, ok := parseWindow(it.Value); ok {
				doomed = append(doomed, c.forwardChain(i, w)...)
			}
		}
	}
	for _, key := range doomed {
		err := c.roundTrip(func() error { return c.mc.Delete(key) })
		if err != nil && !errors.Is(err, memcache.ErrCacheMiss) {
			return driver.Errorf("throttlekit: memcached: delete: %w", err)
		}
	}
	return nil
}

// forwardChain returns the counter of incarnation w of limit i and, when
// a Seed forwarded it, the counters it forwards to, in order: one round
// trip per counter read. It stops at the first counter that holds no
// forward marker or cannot be read.
func (c *call) forwardChain(i int, w window) []string {
	keys := []string{c.keys.counter(i, w)}
	for range maxForwards {
		it, err := c.get(keys[len(keys)-1])
		if err != nil || it == nil {
			break
		}
		next, ok := parseForward(it.Value)
		if !ok {
			break
		}
		keys = append(keys, c.keys.counter(i, next))
	}
	return keys
}
