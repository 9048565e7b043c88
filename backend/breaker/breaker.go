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
var ErrOpen = errors.New("throttlekit: circuit breaker open")

// Defaults of the options.
const (
	DefaultFailures = 5
	DefaultOpenFor  = 500 * time.Millisecond
	DefaultLogEvery = 10 * time.Second
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

// Option configures breakers.
type Option func(*config)

type config struct {
	failures  int
	openFor   time.Duration
	logEvery  time.Duration
	logger    *slog.Logger
	loggerSet bool
	onChange  func(server string, from, to State)
}

// WithFailures sets how many consecutive failed calls open a breaker
// (DefaultFailures unless set; at least 1).
func WithFailures(n int) Option { return func(c *config) { c.failures = n } }

// WithOpenFor sets how long an open breaker rejects calls before it lets a
// probe through (DefaultOpenFor unless set). It bounds how long a returned
// server goes unused.
func WithOpenFor(d time.Duration) Option { return func(c *config) { c.openFor = d } }

// WithLogEvery sets how often an open breaker logs the calls it rejected
// (DefaultLogEvery unless set).
func WithLogEvery(d time.Duration) Option { return func(c *config) { c.logEvery = d } }

// WithLogger sets where state changes are logged (slog.Default() unless
// set; nil logs nothing).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.logger, c.loggerSet = l, true }
}

// WithStateChange registers f to be called on every state change, for
// metrics. It runs while the breaker's lock is held: it must be quick and
// must not call back into the breaker.
func WithStateChange(f func(server string, from, to State)) Option {
	return func(c *config) { c.onChange = f }
}

func newConfig(opts []Option) (config, error) {
	c := config{failures: DefaultFailures, openFor: DefaultOpenFor, logEvery: DefaultLogEvery}
	for _, o := range opts {
		if o == nil {
			return config{}, fmt.Errorf("%w: nil breaker option", driver.ErrInvalidOption)
		}
		o(&c)
	}
	switch {
	case c.failures < 1:
		return config{}, fmt.Errorf("%w: breaker failures %d, want at least 1", driver.ErrInvalidOption, c.failures)
	case c.openFor <= 0:
		return config{}, fmt.Errorf("%w: breaker open period %v, want > 0", driver.ErrInvalidOption, c.openFor)
	case c.logEvery <= 0:
		return config{}, fmt.Errorf("%w: breaker log interval %v, want > 0", driver.ErrInvalidOption, c.logEvery)
	}
	if !c.loggerSet {
		c.logger = slog.Default()
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
	b := &Breaker{server: server, cfg: c, openErr: fmt.Errorf("%w: %s", ErrOpen, server)}
	failures := uint32(c.failures)
	b.cb = gobreaker.NewTwoStepCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        server,
		MaxRequests: 1,
		Timeout:     c.openFor,
		ReadyToTrip: func(n gobreaker.Counts) bool { return n.ConsecutiveFailures >= failures },
		IsExcluded:  func(err error) bool { return errors.Is(err, context.Canceled) },
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
func (b *Breaker) Allow() (done func(failure error), err error) {
	done, err = b.cb.Allow()
	if err != nil {
		b.reject()
		return nil, b.openErr
	}
	return done, nil
}

// reject counts a rejected call and, at most every logEvery, logs how many
// calls the open breaker answered since its last line.
func (b *Breaker) reject() {
	b.rejected.Add(1)
	b.sinceLine.Add(1)
	l := b.cfg.logger
	if l == nil {
		return
	}
	now := time.Now().UnixNano()
	last := b.lastLine.Load()
	if now-last < int64(b.cfg.logEvery) || !b.lastLine.CompareAndSwap(last, now) {
		return
	}
	opened := b.openedAt.Load()
	if opened == 0 {
		return
	}
	l.LogAttrs(context.Background(), slog.LevelWarn, "throttlekit: circuit breaker still open",
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
	l := b.cfg.logger
	now := time.Now().UnixNano()
	switch {
	case from == Closed && to == Open:
		b.openedAt.Store(now)
		b.lastLine.Store(now)
		b.sinceLine.Store(0)
		b.failedProbe.Store(0)
		if l != nil {
			l.LogAttrs(context.Background(), slog.LevelWarn, "throttlekit: circuit breaker opened",
				slog.String("server", b.server),
				slog.Int("consecutive_failures", b.cfg.failures),
				slog.Duration("probe_every", b.cfg.openFor))
		}
	case from == HalfOpen && to == Open:
		b.failedProbe.Add(1)
		if l != nil {
			l.LogAttrs(context.Background(), slog.LevelDebug, "throttlekit: circuit breaker probe failed",
				slog.String("server", b.server))
		}
	case to == Closed:
		opened := b.openedAt.Swap(0)
		if l != nil && opened != 0 {
			l.LogAttrs(context.Background(), slog.LevelInfo, "throttlekit: circuit breaker closed",
				slog.String("server", b.server),
				slog.Duration("was_open", time.Duration(now-opened).Round(time.Millisecond)),
				slog.Uint64("rejected", b.sinceLine.Swap(0)))
		}
	default: // open -> half-open
		if l != nil {
			l.LogAttrs(context.Background(), slog.LevelDebug, "throttlekit: circuit breaker half-open",
				slog.String("server", b.server))
		}
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
