package breaker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// ErrOpen reports a call answered by an open breaker without reaching its
// server. The error names the server; it wraps ErrOpen.
var ErrOpen = errors.New("throttlekit: breaker: circuit breaker open")

// Defaults of the options, chosen by measurement (docs/DESIGN.md,
// "Outages"): on a healthy Redis with both cores of the machine busy
// (stress-ng --cpu 2), 16 goroutines decided 581,135 times in 60 s, 15 of
// them timed out, and the default rule opened no breaker; a store that
// stops answering still trips it within about a quarter of a second. An
// open period of 250 ms puts a returned server back in use within about
// that much (one probe), and within twice that when a probe meets the
// last moment of the outage.
const (
	DefaultFailures   = 5
	DefaultFailingFor = 250 * time.Millisecond
	DefaultOpenFor    = 250 * time.Millisecond
	DefaultLogEvery   = 10 * time.Second
)

// State is a breaker's state.
type State int

// The states of a breaker.
const (
	// Closed: calls go to the server.
	Closed State = iota
	// HalfOpen: one probe goes to the server; other calls are rejected.
	HalfOpen
	// Open: every call is rejected with ErrOpen.
	Open
)

// String returns "closed", "half-open" or "open".
func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case HalfOpen:
		return "half-open"
	case Open:
		return "open"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// Option configures breakers (New, NewSet, Wrap).
type Option interface {
	apply(*config) error
}

// optionFunc adapts a function to Option.
type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	failures   int
	failingFor time.Duration
	openFor    time.Duration
	logEvery   time.Duration
	logger     *slog.Logger // given to WithLogger
	loggerSet  bool         // WithLogger was given: SetLogger changes nothing
	onChange   func(server string, from, to State)

	// log is where lines go, read at log time and shared by the breakers
	// of a Set; nil means slog.Default().
	log *atomic.Pointer[slog.Logger]
}

// logTo returns where the breakers of c log now.
func (c *config) logTo() *slog.Logger {
	if c.log != nil {
		if l := c.log.Load(); l != nil {
			return l
		}
	}
	return slog.Default()
}

// setLogger stores l (nil: log nothing), unless WithLogger was given.
func (c *config) setLogger(l *slog.Logger) {
	if c.loggerSet || c.log == nil {
		return
	}
	c.log.Store(driver.LoggerOrDiscard(l))
}

// WithFailures sets how many consecutive failed calls a breaker needs
// before it opens (DefaultFailures unless set; at least 1). See
// WithFailingFor for the other half of the trip rule.
func WithFailures(n int) Option {
	return optionFunc(func(c *config) error { c.failures = n; return nil })
}

// WithFailingFor sets how long a run of consecutive failed calls must last,
// from its first failure to its latest, before the breaker opens
// (DefaultFailingFor unless set; 0 opens on the count alone). A breaker
// therefore opens only when both WithFailures calls in a row failed and
// the server has answered none of the calls that ended during d: an outage,
// not a slow moment. On a loaded machine the calls in flight when the
// process or the server is descheduled all time out together, a run of
// failures that lasts microseconds however many they are; a success ends
// the run.
func WithFailingFor(d time.Duration) Option {
	return optionFunc(func(c *config) error { c.failingFor = d; return nil })
}

// WithOpenFor sets how long an open breaker rejects calls before it lets a
// probe through (DefaultOpenFor unless set). It bounds how long a returned
// server goes unused.
func WithOpenFor(d time.Duration) Option {
	return optionFunc(func(c *config) error { c.openFor = d; return nil })
}

// WithLogEvery sets how often an open breaker logs the calls it rejected
// (DefaultLogEvery unless set).
func WithLogEvery(d time.Duration) Option {
	return optionFunc(func(c *config) error { c.logEvery = d; return nil })
}

// WithLogger sets where state changes are logged; nil logs nothing. It
// wins over SetLogger: with it, Set.SetLogger and Backend.SetLogger (and so
// throttler.WithLogger) leave these breakers' logger alone. Without it, the
// breakers log to slog.Default() until SetLogger is called.
func WithLogger(l *slog.Logger) Option {
	return optionFunc(func(c *config) error { c.logger, c.loggerSet = l, true; return nil })
}

// WithStateChange registers f to be called on every state change, for
// metrics. It runs while the breaker's lock is held: it must be quick and
// must not call back into the breaker.
func WithStateChange(f func(server string, from, to State)) Option {
	return optionFunc(func(c *config) error { c.onChange = f; return nil })
}

func newConfig(opts []Option) (config, error) {
	c := config{failures: DefaultFailures, failingFor: DefaultFailingFor, openFor: DefaultOpenFor, logEvery: DefaultLogEvery}
	for _, o := range opts {
		if o == nil {
			return config{}, driver.Errorf("%w: breaker: nil Option", driver.ErrInvalidOption)
		}
		if err := o.apply(&c); err != nil {
			return config{}, err
		}
	}
	switch {
	case c.failures < 1:
		return config{}, driver.Errorf("%w: breaker: failures %d, want at least 1", driver.ErrInvalidOption, c.failures)
	case c.failingFor < 0:
		return config{}, driver.Errorf("%w: breaker: failing period %v, want >= 0", driver.ErrInvalidOption, c.failingFor)
	case c.openFor <= 0:
		return config{}, driver.Errorf("%w: breaker: open period %v, want > 0", driver.ErrInvalidOption, c.openFor)
	case c.logEvery <= 0:
		return config{}, driver.Errorf("%w: breaker: log interval %v, want > 0", driver.ErrInvalidOption, c.logEvery)
	}
	c.log = new(atomic.Pointer[slog.Logger])
	if c.loggerSet {
		c.log.Store(driver.LoggerOrDiscard(c.logger))
	}
	return c, nil
}

// Breaker is the circuit breaker of one server. It is safe for concurrent
// use.
type Breaker struct {
	server  string
	cfg     *config
	cb      *gobreaker.TwoStepCircuitBreaker[struct{}]
	openErr error // returned to every rejected call

	rejected    atomic.Uint64 // calls rejected, ever
	openedAt    atomic.Int64  // unix ns when it last opened from closed; 0 while closed
	lastLine    atomic.Int64  // unix ns of the last "still open" line
	sinceLine   atomic.Uint64 // calls rejected since the last line
	failedProbe atomic.Uint64 // probes failed since the last line

	runStart atomic.Int64 // unix ns of the first failure of the current run; 0 after a success

	drainDue atomic.Bool // the drains must run: the breaker opened or is about to probe
	drainMu  sync.Mutex
	drains   []func()
}

// New returns a closed breaker for server, a name used in errors and logs
// (an address, a group name; never a secret). The error wraps
// driver.ErrInvalidOption.
func New(server string, opts ...Option) (*Breaker, error) {
	c, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	return newBreaker(server, &c), nil
}

func newBreaker(server string, c *config) *Breaker {
	b := &Breaker{server: server, cfg: c, openErr: driver.Errorf("%w: %s", ErrOpen, server)}
	failures := uint32(c.failures)
	b.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        server,
		MaxRequests: 1,
		Timeout:     c.openFor,
		ReadyToTrip: func(n gobreaker.Counts) bool {
			if n.ConsecutiveFailures < failures {
				return false
			}
			start := b.runStart.Load()
			return start != 0 && time.Now().UnixNano()-start >= int64(c.failingFor)
		},
		IsExcluded: func(err error) bool { return errors.Is(err, context.Canceled) },
		OnStateChange: func(_ string, from, to gobreaker.State) {
			b.changed(state(from), state(to))
		},
	})
	return b
}

func state(s gobreaker.State) State {
	switch s {
	case gobreaker.StateOpen:
		return Open
	case gobreaker.StateHalfOpen:
		return HalfOpen
	}
	return Closed
}

// Server returns the name the breaker was made for.
func (b *Breaker) Server() string { return b.server }

// State returns the breaker's current state.
func (b *Breaker) State() State { return state(b.cb.State()) }

// Rejected returns how many calls the breaker has rejected since it was
// made.
func (b *Breaker) Rejected() uint64 { return b.rejected.Load() }

// Allow asks whether a call may go to the server. If so, the caller makes
// the call and then calls done with nil for a success, or with the error
// for a failure (context.Canceled counts neither way). If not, Allow
// returns an error wrapping ErrOpen and naming the server, and done is nil.
//
// When the breaker has just opened, and again before the call that is its
// probe goes out, Allow first runs the functions given to AddDrain, so that
// the probe never meets a connection the outage killed.
func (b *Breaker) Allow() (done func(failure error), err error) {
	next, err := b.cb.Allow()
	if b.drainDue.Load() {
		b.drain()
	}
	if err != nil {
		b.reject()
		return nil, b.openErr
	}
	return func(failure error) {
		switch {
		case failure == nil:
			b.runStart.Store(0)
		case errors.Is(failure, context.Canceled):
		default:
			b.runStart.CompareAndSwap(0, time.Now().UnixNano())
		}
		next(failure)
		if b.drainDue.Load() {
			b.drain()
		}
	}, nil
}

// AddDrain registers f to run when the breaker opens and again just before
// each probe, outside the breaker's lock. f should drop the connections to
// the server that sit idle in the client's pool: an outage can kill them
// without the client noticing (a black hole, a restart behind a NAT), and a
// probe that picked one would fail and keep a returned server out of use
// for another open period. f must be quick and safe for concurrent use.
func (b *Breaker) AddDrain(f func()) {
	if f == nil {
		return
	}
	b.drainMu.Lock()
	b.drains = append(b.drains, f)
	b.drainMu.Unlock()
}

// drain runs the drains once per opening or probe.
func (b *Breaker) drain() {
	if !b.drainDue.Swap(false) {
		return
	}
	b.drainMu.Lock()
	fs := b.drains
	b.drainMu.Unlock()
	for _, f := range fs {
		f()
	}
}

// reject counts a rejected call and, at most every logEvery, logs how many
// calls the open breaker answered since its last line.
func (b *Breaker) reject() {
	b.rejected.Add(1)
	b.sinceLine.Add(1)
	now := time.Now().UnixNano()
	last := b.lastLine.Load()
	if now-last < int64(b.cfg.logEvery) || !b.lastLine.CompareAndSwap(last, now) {
		return
	}
	opened := b.openedAt.Load()
	if opened == 0 {
		return
	}
	b.cfg.logTo().LogAttrs(context.Background(), slog.LevelWarn, "throttlekit: circuit breaker still open",
		slog.String("server", b.server),
		slog.Duration("open_for", time.Duration(now-opened).Round(time.Millisecond)),
		slog.Uint64("rejected", b.sinceLine.Swap(0)),
		slog.Uint64("failed_probes", b.failedProbe.Swap(0)),
		slog.Duration("interval", time.Duration(now-last).Round(time.Millisecond)))
}

// changed runs on every state change, under gobreaker's lock.
func (b *Breaker) changed(from, to State) {
	if f := b.cfg.onChange; f != nil {
		f(b.server, from, to)
	}
	if to != Closed { // opened, or about to send its probe
		b.drainDue.Store(true)
	}
	l := b.cfg.logTo()
	now := time.Now().UnixNano()
	switch {
	case from == Closed && to == Open:
		b.openedAt.Store(now)
		b.lastLine.Store(now)
		b.sinceLine.Store(0)
		b.failedProbe.Store(0)
		l.LogAttrs(context.Background(), slog.LevelWarn, "throttlekit: circuit breaker opened",
			slog.String("server", b.server),
			slog.Int("consecutive_failures", b.cfg.failures),
			slog.Duration("probe_every", b.cfg.openFor))
	case from == HalfOpen && to == Open:
		b.failedProbe.Add(1)
		l.LogAttrs(context.Background(), slog.LevelDebug, "throttlekit: circuit breaker probe failed",
			slog.String("server", b.server))
	case to == Closed:
		opened := b.openedAt.Swap(0)
		if opened != 0 {
			l.LogAttrs(context.Background(), slog.LevelInfo, "throttlekit: circuit breaker closed",
				slog.String("server", b.server),
				slog.Duration("was_open", time.Duration(now-opened).Round(time.Millisecond)),
				slog.Uint64("rejected", b.sinceLine.Swap(0)))
		}
	default: // open -> half-open
		l.LogAttrs(context.Background(), slog.LevelDebug, "throttlekit: circuit breaker half-open",
			slog.String("server", b.server))
	}
}

// Status returns the breaker's status.
func (b *Breaker) Status() Status {
	return Status{Server: b.server, State: b.State(), Rejected: b.Rejected()}
}

// Status is one breaker's state, for a debug page or a metric.
type Status struct {
	Server   string
	State    State
	Rejected uint64
}

// Set holds one breaker per server, made on first use with the set's
// options. It is safe for concurrent use.
type Set struct {
	cfg config
	mu  sync.Mutex
	m   map[string]*Breaker
}

// NewSet returns an empty set whose breakers use opts. The error wraps
// driver.ErrInvalidOption.
func NewSet(opts ...Option) (*Set, error) {
	c, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	return &Set{cfg: c, m: map[string]*Breaker{}}, nil
}

// For returns the breaker of server, making it on first use.
func (s *Set) For(server string) *Breaker {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.m[server]
	if !ok {
		b = newBreaker(server, &s.cfg)
		s.m[server] = b
	}
	return b
}

// SetLogger implements driver.LoggerSetter: the set's breakers, those made
// already and those made later, log to l, and nowhere for a nil l. It does
// nothing when the set was made with WithLogger, which wins.
func (s *Set) SetLogger(l *slog.Logger) {
	if s == nil {
		return
	}
	s.cfg.setLogger(l)
}

// Statuses returns every breaker's status, sorted by server.
func (s *Set) Statuses() []Status {
	s.mu.Lock()
	out := make([]Status, 0, len(s.m))
	for _, b := range s.m {
		out = append(out, b.Status())
	}
	s.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Server < out[j].Server })
	return out
}

var _ driver.LoggerSetter = (*Set)(nil)
