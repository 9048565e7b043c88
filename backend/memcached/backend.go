package memcachedbackend

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
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
	// refunds). The call gives back the units it took (a give-back that
	// fails is counted in Stats.RollbackFailures); the throttler applies
	// the policy's failure mode and passes the error, then wrapped in
	// throttler.ErrBackend, to its Observer. Stats counts it too.
	ErrRetriesExhausted = errors.New("memcached: compare-and-swap retries exhausted")
)

// Backend is a driver.Backend over memcached. It implements Peeker,
// Refunder, Resetter and Pinger. It is safe for concurrent use, and any
// number of Backends in any number of processes may share servers as long
// as they use the same prefix and server placement. See the package
// documentation for the design and its guarantees.
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
	hooks testHooks
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
}

var (
	_ driver.Backend  = (*Backend)(nil)
	_ driver.Peeker   = (*Backend)(nil)
	_ driver.Refunder = (*Backend)(nil)
	_ driver.Resetter = (*Backend)(nil)
	_ driver.Pinger   = (*Backend)(nil)
)

// Option configures a Backend.
type Option func(*Backend)

// WithPrefix sets the prefix of every key (DefaultPrefix otherwise). Give
// each application or test its own to keep their state apart; backends
// that share state must share the prefix. It is escaped like identifiers
// and must then be 1 to MaxPrefixLen bytes.
func WithPrefix(prefix string) Option { return func(b *Backend) { b.prefix = prefix } }

// WithCASRetries sets how many lost compare-and-swap races a call retries
// (DefaultCASRetries otherwise); zero means one attempt and no retry.
func WithCASRetries(n int) Option { return func(b *Backend) { b.casRetries = n } }

// New returns a Backend over client. Build the client with NewClient, or
// with memcache.NewFromSelector over a RendezvousSelector and a Timeout set:
// gomemcache takes no context, so the client's Timeout is what bounds each
// round trip (see the package documentation). The error wraps
// driver.ErrInvalidOption.
func New(client *memcache.Client, opts ...Option) (*Backend, error) {
	b := &Backend{client: client, prefix: DefaultPrefix, casRetries: DefaultCASRetries, wall: time.Now}
	for _, opt := range opts {
		opt(b)
	}
	switch {
	case client == nil:
		return nil, fmt.Errorf("%w: nil client", driver.ErrInvalidOption)
	case b.prefix == "":
		return nil, fmt.Errorf("%w: empty prefix", driver.ErrInvalidOption)
	case len(driver.EscapeKey(b.prefix)) > MaxPrefixLen:
		return nil, fmt.Errorf("%w: prefix longer than %d bytes once escaped", driver.ErrInvalidOption, MaxPrefixLen)
	case b.casRetries < 0:
		return nil, fmt.Errorf("%w: negative CAS retries %d", driver.ErrInvalidOption, b.casRetries)
	}
	b.prefix = driver.EscapeKey(b.prefix)
	return b, nil
}

// NewClient returns a gomemcache client over servers placed by a
// RendezvousSelector, whose every round trip (dial, write, read) is bounded
// by timeout (throttler.DefaultCallTimeout when zero or less), with
// DefaultMaxIdleConns connections kept per server. The error wraps
// driver.ErrInvalidOption.
func NewClient(timeout time.Duration, servers ...string) (*memcache.Client, error) {
	if len(servers) == 0 {
		return nil, fmt.Errorf("%w: no servers", driver.ErrInvalidOption)
	}
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
	return c, nil
}

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
		return fmt.Errorf("%w: memcachedbackend.Backend not built by New", driver.ErrNotInitialized)
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
	c, err := b.newCall(ctx, req)
	if err != nil {
		return driver.Outcome{}, err
	}
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
// each open window's counter (memcached stops at 0), and TAT -= Cost*T, not
// below now, on each GCRA item by compare-and-swap. Closed windows are left
// alone. Limits are refunded one after another, not atomically.
func (b *Backend) Refund(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	c, err := b.newCall(ctx, req)
	if err != nil {
		return driver.Outcome{}, err
	}
	if err := c.snapshot(); err != nil {
		return driver.Outcome{}, err
	}
	for i := range c.limits {
		l := &c.limits[i]
		if l.gcra {
			if err := c.refundGCRA(i, req.Cost); err != nil {
				return driver.Outcome{}, err
			}
			continue
		}
		if !l.open {
			continue
		}
		// No committed count exceeds Max, so giving back more takes
		// nothing more; the clamp also keeps a retracted counter far above
		// retractedFloor.
		v, err := c.incrDecr("decr", c.keys.counter(i, l.win), min(req.Cost, l.limit.Max))
		switch {
		case errors.Is(err, memcache.ErrCacheMiss), err == nil && v >= retractedFloor:
			l.open, l.state = false, driver.State{}
		case err != nil:
			return driver.Outcome{}, err
		default:
			l.state, l.known = driver.State{Used: v, End: l.win.end}, true
		}
	}
	return driver.Outcome{Allowed: true, States: c.states()}, nil
}

// Reset deletes the identifier's window items, the counters they name and
// its GCRA items under p, whatever they hold (so it also clears values
// this package cannot read). A request racing the reset may still count in
// the window it read before; the next window starts fresh.
func (b *Backend) Reset(ctx context.Context, p *driver.Policy, identifier string) error {
	c, err := b.newCall(ctx, driver.Request{Policy: p, Identifier: identifier})
	if err != nil {
		return err
	}
	var windowKeys []string
	for i := range c.limits {
		if !c.limits[i].gcra {
			windowKeys = append(windowKeys, c.keys.window(i))
		}
	}
	var items map[string]*memcache.Item
	if len(windowKeys) > 0 {
		err := c.roundTrip(func() (err error) {
			items, err = b.client.GetMulti(windowKeys)
			return err
		})
		if err != nil {
			return fmt.Errorf("memcached: get: %w", err)
		}
	}
	var doomed []string
	for i := range c.limits {
		if c.limits[i].gcra {
			doomed = append(doomed, c.keys.gcra(i))
			continue
		}
		// The window item first, so that new requests start afresh at
		// once; requests that read it before finish in its counter or find
		// it gone.
		doomed = append(doomed, c.keys.window(i))
		if it := items[c.keys.window(i)]; it != nil {
			if w, ok := parseWindow(it.Value); ok {
				doomed = append(doomed, c.keys.counter(i, w))
			}
		}
	}
	for _, key := range doomed {
		err := c.roundTrip(func() error { return b.client.Delete(key) })
		if err != nil && !errors.Is(err, memcache.ErrCacheMiss) {
			return fmt.Errorf("memcached: delete: %w", err)
		}
	}
	return nil
}

// Ping checks that every server answers a version request, each within the
// client's Timeout. It asks them one after another, stops at the first that
// fails, and checks ctx only before the first: a hung server costs one
// client Timeout, past ctx if need be.
func (b *Backend) Ping(ctx context.Context) error {
	if err := b.ready(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	b.stats.roundTrips.Add(1)
	if err := b.client.Ping(); err != nil {
		return fmt.Errorf("memcached: ping: %w", err)
	}
	return nil
}

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
}

// limitCall is what a call knows of one limit.
type limitCall struct {
	limit driver.Limit
	gcra  bool
	// item is the window item (fixed) or the GCRA item as last read, with
	// its CAS id; nil when absent.
	item *memcache.Item
	// open reports a fixed window open at now; win is its incarnation.
	open bool
	win  window
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
		return nil, fmt.Errorf("%w: nil or zero policy", driver.ErrInvalidPolicy)
	}
	if req.Identifier == "" || req.Cost < 0 {
		return nil, fmt.Errorf("%w: empty identifier or negative cost", driver.ErrInvalidOption)
	}
	c := &call{
		b: b, ctx: ctx, req: req, policy: req.Policy,
		keys:  newKeys(b.prefix, req.Policy, req.Identifier),
		nowMs: req.Now.UnixMilli(), nowUs: req.Now.UnixMicro(),
		limits: make([]limitCall, len(req.Policy.Limits)),
	}
	for i := range c.limits {
		l := req.Policy.Limits[i]
		c.limits[i] = limitCall{limit: l, gcra: l.Algorithm == driver.GCRA}
	}
	return c, nil
}

// roundTrip runs one gomemcache call, which the client's Timeout bounds,
// unless the call's context is already done: gomemcache cannot be
// interrupted, so the context is honoured between round trips.
func (c *call) roundTrip(f func() error) error {
	if err := c.ctx.Err(); err != nil {
		return err
	}
	c.b.stats.roundTrips.Add(1)
	return f()
}

// snapshot reads every window and GCRA item of the policy in one round
// trip (they share a server under RendezvousSelector).
func (c *call) snapshot() error {
	keys := make([]string, len(c.limits))
	for i := range c.limits {
		if c.limits[i].gcra {
			keys[i] = c.keys.gcra(i)
		} else {
			keys[i] = c.keys.window(i)
		}
	}
	var items map[string]*memcache.Item
	err := c.roundTrip(func() (err error) {
		items, err = c.b.client.GetMulti(keys)
		return err
	})
	if err != nil {
		return fmt.Errorf("memcached: get: %w", err)
	}
	for i := range c.limits {
		l := &c.limits[i]
		if l.gcra {
			if err := c.setGCRAItem(i, items[c.keys.gcra(i)]); err != nil {
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
	l.item, l.open, l.win, l.known, l.state = it, false, window{}, false, driver.State{}
	if it == nil {
		return nil
	}
	w, ok := parseWindow(it.Value)
	if !ok {
		return fmt.Errorf("%w: window item of limit %q holds %q", driver.ErrBadReply, l.limit.Name, clip(it.Value))
	}
	if w.end > c.nowMs {
		l.open, l.win, l.state = true, w, driver.State{End: w.end}
	}
	return nil
}

// setGCRAItem records a read of limit i's GCRA item (nil: absent).
func (c *call) setGCRAItem(i int, it *memcache.Item) error {
	l := &c.limits[i]
	l.item, l.state = it, driver.State{}
	if it == nil {
		return nil
	}
	tat, ok := parseInt(it.Value)
	if !ok {
		return fmt.Errorf("%w: GCRA item of limit %q holds %q", driver.ErrBadReply, l.limit.Name, clip(it.Value))
	}
	l.state = driver.State{End: tat}
	return nil
}

// readCounters reads, in one round trip, the counters of the open windows
// whose Used is not known yet. A missing counter means the window lost its
// count to eviction, a retracted one that its opener closed it again: the
// window then counts as absent.
func (c *call) readCounters() error {
	var keys []string
	for i := range c.limits {
		if l := &c.limits[i]; !l.gcra && l.open && !l.known {
			keys = append(keys, c.keys.counter(i, l.win))
		}
	}
	if len(keys) == 0 {
		return nil
	}
	var items map[string]*memcache.Item
	err := c.roundTrip(func() (err error) {
		items, err = c.b.client.GetMulti(keys)
		return err
	})
	if err != nil {
		return fmt.Errorf("memcached: get counters: %w", err)
	}
	for i := range c.limits {
		l := &c.limits[i]
		if l.gcra || !l.open || l.known {
			continue
		}
		it := items[c.keys.counter(i, l.win)]
		if it == nil {
			c.b.stats.windowsLost.Add(1)
			l.open, l.state = false, driver.State{}
			continue
		}
		used, ok := parseInt(it.Value)
		if !ok {
			return fmt.Errorf("%w: counter of limit %q holds %q", driver.ErrBadReply, l.limit.Name, clip(it.Value))
		}
		if used >= retractedFloor {
			l.open, l.state = false, driver.State{}
			continue
		}
		l.state, l.known = driver.State{Used: used, End: l.win.end}, true
	}
	return nil
}

// states returns the best-known state of every limit.
func (c *call) states() []driver.State {
	s := make([]driver.State, len(c.limits))
	for i := range c.limits {
		s[i] = c.limits[i].state
	}
	return s
}

// decide runs Decide's steps; see the package documentation.
func (c *call) decide() (driver.Outcome, error) {
	if err := c.snapshot(); err != nil {
		return driver.Outcome{}, err
	}
	// Writes start only when the snapshot leaves a chance: a request that
	// would open a window must not open it if another limit denies (SPEC:
	// a denied request opens nothing), and a GCRA limit that already
	// denies makes every write pointless.
	mustCheck := false
	for i := range c.limits {
		l := &c.limits[i]
		if !l.gcra && !l.open || l.gcra && !c.gcraAllows(i, l.state) || c.req.Cost > l.limit.Capacity {
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
	// Units are taken in three ranks, each in policy order (see
	// "Concurrency"): fixed windows that did not start at now, then GCRA
	// limits, then fixed windows that start at now, which is where every
	// anchored window this request opens is.
	for i := range c.limits {
		if c.limits[i].gcra || c.startsNow(i) {
			continue
		}
		if out, stop, err := c.settle(c.consumeWindow(i, true)); stop {
			return out, err
		}
	}
	for i := range c.limits {
		if !c.limits[i].gcra {
			continue
		}
		allowed, err := c.consumeGCRA(i)
		if out, stop, err := c.settle(stepOf(allowed), err); stop {
			return out, err
		}
	}
	for i := range c.limits {
		if l := &c.limits[i]; l.gcra || l.consumed {
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

const (
	stepPassed   step = iota // the limit allows; the units are taken
	stepDenied               // the limit denies; its units are taken until rollback
	stepDeferred             // the window needs opening at now: it moves to the last rank
)

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
	for opens := 0; ; {
		if l.open {
			key := c.keys.counter(i, l.win)
			v, err := c.incrDecr("incr", key, n)
			evicted := errors.Is(err, memcache.ErrCacheMiss)
			if evicted || err == nil && v >= retractedFloor {
				// The window item names a counter that is gone (evicted)
				// or retracted: the window counts as absent. Reopen it
				// rather than recreate the counter, so no incarnation ever
				// counts from zero twice (see "Eviction"). Units an incr
				// added to a retracted counter count nowhere.
				if evicted {
					c.b.stats.windowsLost.Add(1)
				}
				l.open, l.state, l.known = false, driver.State{}, false
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
		return c.b.client.Add(&memcache.Item{
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
		return false, fmt.Errorf("memcached: add counter: %w", err)
	}
	if c.b.hooks.beforePublish != nil {
		c.b.hooks.beforePublish(counter)
	}
	item := &memcache.Item{Key: c.keys.window(i), Value: w.encode(), Expiration: expiration(live, 0, c.b.wall)}
	err = c.roundTrip(func() error {
		if l.item == nil {
			return c.b.client.Add(item)
		}
		item.CasID = l.item.CasID
		return c.b.client.CompareAndSwap(item)
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
		return false, fmt.Errorf("memcached: publish window: %w", err)
	}
	// The server refused the item, so nothing names this counter.
	_ = c.roundTrip(func() error { return c.b.client.Delete(counter) })
	c.b.stats.casConflicts.Add(1)
	it, err := c.get(c.keys.window(i))
	if err != nil {
		return false, err
	}
	return false, c.setWindowItem(i, it)
}

// gcraAllows reports whether GCRA limit i alone allows the request on
// state s, by the reference arithmetic.
func (c *call) gcraAllows(i int, s driver.State) bool {
	states := make([]driver.State, len(c.limits))
	states[i] = s
	allowed := driver.Decide(c.policy, c.req.Now, c.req.Cost, states)
	return allowed
}

// consumeGCRA takes the request's units from GCRA limit i by
// compare-and-swap (add when absent), rereading and recomputing after each
// lost race. It reports false when the limit denies on the state read.
func (c *call) consumeGCRA(i int) (allowed bool, err error) {
	l := &c.limits[i]
	for attempt := 0; ; attempt++ {
		states := make([]driver.State, len(c.limits))
		states[i] = l.state
		next := append([]driver.State(nil), states...)
		allowed := driver.Decide(c.policy, c.req.Now, c.req.Cost, next)
		if !allowed {
			return false, nil
		}
		if c.b.hooks.beforeCAS != nil {
			c.b.hooks.beforeCAS()
		}
		err := c.writeGCRA(i, next[i].End)
		if err == nil {
			c.undo = append(c.undo, undoStep{limit: i, units: c.req.Cost})
			return true, nil
		}
		if !lostRace(err) {
			return false, err
		}
		c.b.stats.casConflicts.Add(1)
		if attempt >= c.b.casRetries {
			return false, c.exhausted()
		}
		if err := c.backoff(attempt); err != nil {
			return false, err
		}
		if err := c.rereadGCRA(i); err != nil {
			return false, err
		}
	}
}

// refundGCRA gives back n units of GCRA limit i (reference Refund
// arithmetic) by compare-and-swap, rereading after each lost race.
func (c *call) refundGCRA(i int, n int64) error {
	l := &c.limits[i]
	for attempt := 0; ; attempt++ {
		if l.item == nil {
			return nil
		}
		states := make([]driver.State, len(c.limits))
		states[i] = l.state
		driver.Refund(c.policy, c.req.Now, n, states)
		next := states[i]
		if next == l.state {
			return nil
		}
		err := c.writeGCRA(i, next.End)
		if err == nil {
			l.state = next
			return nil
		}
		if !lostRace(err) {
			return err
		}
		c.b.stats.casConflicts.Add(1)
		if attempt >= c.b.casRetries {
			return c.exhausted()
		}
		if err := c.backoff(attempt); err != nil {
			return err
		}
		if err := c.rereadGCRA(i); err != nil {
			return err
		}
	}
}

// writeGCRA stores tat for limit i over the item last read: add when it
// was absent, compare-and-swap otherwise.
func (c *call) writeGCRA(i int, tat int64) error {
	l := &c.limits[i]
	live := time.Duration(tat-c.nowUs) * time.Microsecond
	item := &memcache.Item{Key: c.keys.gcra(i), Value: []byte(strconv.FormatInt(tat, 10)),
		Expiration: expiration(live, 0, c.b.wall)}
	err := c.roundTrip(func() error {
		if l.item == nil {
			return c.b.client.Add(item)
		}
		item.CasID = l.item.CasID
		return c.b.client.CompareAndSwap(item)
	})
	if err != nil {
		return fmt.Errorf("memcached: write GCRA: %w", err)
	}
	l.item, l.state = nil, driver.State{End: tat}
	return nil
}

// rereadGCRA reads limit i's GCRA item again after a lost race.
func (c *call) rereadGCRA(i int) error {
	it, err := c.get(c.keys.gcra(i))
	if err != nil {
		return err
	}
	return c.setGCRAItem(i, it)
}

// deny gives back every unit the call took and returns the denial with
// every limit's state: fixed windows it touched as they were just before
// its units (absent when it opened them and retracted the opening), GCRA
// limits as the rollback left them, and the windows it did not reach read
// now (one round trip), so that the throttler can name the right binding
// limit. When the call's context ends before the give-back does, the
// states are computed from what the call knows.
func (c *call) deny() driver.Outcome {
	before := c.statesBeforeUnits()
	if !c.rollback() {
		return driver.Outcome{Allowed: false, States: before}
	}
	for _, u := range c.undo {
		if u.counter == "" {
			continue
		}
		l := &c.limits[u.limit]
		if l.retracted {
			l.open, l.state = false, driver.State{}
			continue
		}
		l.state = before[u.limit]
	}
	if err := c.readCounters(); err != nil {
		// The verdict stands; only those limits' figures are unknown.
		for i := range c.limits {
			if l := &c.limits[i]; !l.gcra && l.open && !l.known {
				l.state = driver.State{}
			}
		}
	}
	return driver.Outcome{Allowed: false, States: c.states()}
}

// statesBeforeUnits returns the best-known states with this call's units
// taken out again by the reference arithmetic; open windows whose count
// was not read are unknown (zero), as when reading them fails.
func (c *call) statesBeforeUnits() []driver.State {
	states := c.states()
	for i := range c.limits {
		if l := &c.limits[i]; !l.gcra && l.open && !l.known {
			states[i] = driver.State{}
		}
	}
	for _, u := range c.undo {
		if u.counter != "" {
			states[u.limit].Used = max(states[u.limit].Used-u.units, 0)
			continue
		}
		one := make([]driver.State, len(states))
		one[u.limit] = states[u.limit]
		driver.Refund(c.policy, c.req.Now, u.units, one)
		states[u.limit] = one[u.limit]
	}
	return states
}

// rollback gives back, newest first, every unit the call took, and
// retracts each window the call opened that nobody else counts in (see
// retract). It reports whether it finished.
//
// The give-back runs on a budget of its own (giveBackBudget), not on the
// call's context: a call denied or failed because its context ended must
// still give its units back, or a denial would consume. It runs in a
// goroutine of its own, and rollback waits for it only while the call's
// context lasts, so that a call still returns promptly once its context
// is done; the call then belongs to that goroutine. A give-back that fails
// (a server error, the budget spent) is counted in
// Stats.RollbackFailures; its units stay spent until their window closes,
// which can deny, never over-admit.
func (c *call) rollback() (finished bool) {
	if len(c.undo) == 0 {
		return true
	}
	callerCtx := c.ctx
	ctx, cancel := context.WithTimeout(context.WithoutCancel(callerCtx), c.b.giveBackBudget())
	c.ctx = ctx
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer cancel()
		c.giveBack()
		if c.b.hooks.afterGiveBack != nil {
			c.b.hooks.afterGiveBack()
		}
	}()
	select {
	case <-done:
	case <-callerCtx.Done():
		select {
		case <-done:
		default:
			return false
		}
	}
	c.ctx = callerCtx
	return true
}

// giveBack is rollback's work; see rollback.
func (c *call) giveBack() {
	for j := len(c.undo) - 1; j >= 0; j-- {
		u := c.undo[j]
		var err error
		if u.counter == "" {
			if err = c.rereadGCRA(u.limit); err == nil {
				err = c.refundGCRA(u.limit, u.units)
			}
		} else {
			var left int64
			left, err = c.incrDecr("decr", u.counter, u.units)
			switch {
			case errors.Is(err, memcache.ErrCacheMiss):
				err = nil // evicted: nothing left to give back or retract
			case err == nil && u.opened && left == 0:
				err = c.retract(u)
			}
		}
		if err != nil {
			c.b.stats.rollbackFailures.Add(1)
		}
	}
}

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

// retract closes again window u.limit, which this call opened and whose
// units it has just given back, when nobody else counts in it: it reads
// the counter with its CAS id and, if it still holds zero, swaps in
// retractedValue. Any incr since the read changes the CAS id, so the swap
// fails exactly when someone counted in between; then, or when the
// counter holds units of others, the window stays open, theirs. After a
// swap, the window item still names the counter, and every request takes
// the window for absent and opens a new one (by compare-and-swap over that
// item), as after an eviction.
func (c *call) retract(u undoStep) error {
	if c.b.hooks.beforeRetract != nil {
		c.b.hooks.beforeRetract(u.counter)
	}
	live := time.Duration(u.end-c.nowMs) * time.Millisecond
	for attempt := 0; ; attempt++ {
		it, err := c.get(u.counter)
		if err != nil || it == nil {
			return err // nil when evicted: the window counts as absent already
		}
		if v, ok := parseInt(it.Value); !ok || v != 0 {
			return nil // someone else's units: their window now
		}
		it.Value = []byte(strconv.FormatInt(retractedValue, 10))
		it.Expiration = expiration(live, 1, c.b.wall)
		err = c.roundTrip(func() error { return c.b.client.CompareAndSwap(it) })
		if err == nil {
			c.b.stats.openingsRetracted.Add(1)
			c.limits[u.limit].retracted = true
			return nil
		}
		if errors.Is(err, memcache.ErrCacheMiss) {
			return nil
		}
		if !lostRace(err) {
			return fmt.Errorf("memcached: retract window: %w", err)
		}
		c.b.stats.casConflicts.Add(1)
		if attempt >= c.b.casRetries {
			// Not a failed call: the verdict stands, the window stays.
			return fmt.Errorf("%w while retracting a window", ErrRetriesExhausted)
		}
		if err := c.backoff(attempt); err != nil {
			return err
		}
	}
}

// incrDecr runs incr or decr by n on key and returns the new value.
func (c *call) incrDecr(verb, key string, n int64) (int64, error) {
	var v uint64
	err := c.roundTrip(func() (err error) {
		if verb == "incr" {
			v, err = c.b.client.Increment(key, uint64(n))
		} else {
			v, err = c.b.client.Decrement(key, uint64(n))
		}
		return err
	})
	if errors.Is(err, memcache.ErrCacheMiss) {
		return 0, err
	}
	if err != nil {
		return 0, fmt.Errorf("memcached: %s: %w", verb, err)
	}
	if v > math.MaxInt64 {
		return 0, fmt.Errorf("%w: %s returned %d", driver.ErrBadReply, verb, v)
	}
	return int64(v), nil
}

// get reads one item; a miss is (nil, nil).
func (c *call) get(key string) (*memcache.Item, error) {
	var it *memcache.Item
	err := c.roundTrip(func() (err error) {
		it, err = c.b.client.Get(key)
		return err
	})
	if errors.Is(err, memcache.ErrCacheMiss) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("memcached: get: %w", err)
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
	return fmt.Errorf("%w after %d retries", ErrRetriesExhausted, c.b.casRetries)
}

// lostRace reports whether a conditional write failed because the item
// changed (CAS conflict), exists (add) or vanished (CAS after eviction).
func lostRace(err error) bool {
	return errors.Is(err, memcache.ErrNotStored) || errors.Is(err, memcache.ErrCASConflict) ||
		errors.Is(err, memcache.ErrCacheMiss)
}

// newToken returns a fresh window token: 64 random bits in hex.
func newToken() string {
	return fmt.Sprintf("%016x", rand.Uint64())
}

// clip shortens a stored value for an error message.
func clip(v []byte) string {
	if len(v) > 40 {
		return string(v[:40]) + "..."
	}
	return string(v)
}
