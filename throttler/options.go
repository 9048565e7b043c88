package throttler

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// DefaultCallTimeout bounds each backend call unless WithCallTimeout says
// otherwise.
const DefaultCallTimeout = 100 * time.Millisecond

// FailureMode says what a decision becomes when the backend fails.
type FailureMode int

const (
	// FailOpen allows the request when the backend fails (the default): an
	// outage of the limiter's store does not become an outage of the API.
	FailOpen FailureMode = iota
	// FailClosed denies the request when the backend fails, with a
	// RetryAfter of one second.
	FailClosed
	// FailLocal decides in process while the backend fails, with the same
	// policy scaled down to this process's share (WithLocalFallback), so
	// that an abusive client stays limited and the others pass. It needs
	// WithLocalFallback on the throttler: New refuses it without one, and
	// so does every call with a policy or concurrency limit that chose it
	// on a throttler without one (ErrInvalidOption), rather than deny every
	// request during an outage. When the local store fails too, it fails
	// closed.
	FailLocal
)

// String returns "open", "closed" or "local".
func (m FailureMode) String() string {
	switch m {
	case FailOpen:
		return "open"
	case FailClosed:
		return "closed"
	case FailLocal:
		return "local"
	}
	return fmt.Sprintf("FailureMode(%d)", int(m))
}

// Option configures a Throttler (New) or a Policy (NewPolicy, ParsePolicy).
// WithCallTimeout and WithFailureMode work in both places: given to New they
// set the default of every policy, given to a policy they override it. The
// other options configure a throttler only, and a policy given one fails
// with ErrInvalidOption.
type Option interface {
	apply(*settings) error
}

// settings is what options set, for a throttler or for a policy.
type settings struct {
	forPolicy  bool
	clock      Clock
	logger     *slog.Logger
	loggerSet  bool
	observers  []Observer
	timeout    time.Duration
	timeoutSet bool
	failure    FailureMode
	failureSet bool
	denyCache  *denyCache
	local      driver.Backend
	processes  int
}

type optionFunc struct {
	name          string
	throttlerOnly bool
	f             func(*settings) error
}

func (o optionFunc) apply(s *settings) error {
	if o.throttlerOnly && s.forPolicy {
		return driver.Errorf("%w: %s configures a throttler, not a policy", ErrInvalidOption, o.name)
	}
	return o.f(s)
}

// WithClock sets the clock that supplies now for every decision; the
// default is the wall clock.
func WithClock(c Clock) Option {
	return optionFunc{"WithClock", true, func(s *settings) error {
		if c == nil {
			return driver.Errorf("%w: WithClock(nil)", ErrInvalidOption)
		}
		s.clock = c
		return nil
	}}
}

// WithObserver adds an observer that receives an Event after every
// operation, with the caller's context; it may be given several times.
func WithObserver(o Observer) Option {
	return optionFunc{"WithObserver", true, func(s *settings) error {
		if o == nil {
			return driver.Errorf("%w: WithObserver(nil)", ErrInvalidOption)
		}
		s.observers = append(s.observers, o)
		return nil
	}}
}

// WithLogger sets where backend outages are logged, with the caller's
// context; the default is slog.Default(), and nil turns logging off. An
// outage is logged once, not once per request: a Warn line at its first
// failure, a Warn line every 10 s with the count of failures since the
// previous line, and an Info line once calls succeed again for a second.
// New also hands it to the backend, and to the store of WithLocalFallback,
// when they take a logger, so that their own lines (the Redis
// eviction-policy warning, a breaker's state changes) go to the same
// place.
func WithLogger(l *slog.Logger) Option {
	return optionFunc{"WithLogger", true, func(s *settings) error {
		s.logger, s.loggerSet = l, true
		return nil
	}}
}

// WithCallTimeout bounds each backend call; the default is
// DefaultCallTimeout. Zero leaves calls bound only by the caller's context.
// A policy's own setting overrides the throttler's.
func WithCallTimeout(d time.Duration) Option {
	return optionFunc{"WithCallTimeout", false, func(s *settings) error {
		if d < 0 {
			return driver.Errorf("%w: WithCallTimeout(%v) is negative", ErrInvalidOption, d)
		}
		s.timeout, s.timeoutSet = d, true
		return nil
	}}
}

// WithFailureMode sets what a decision becomes when the backend fails; the
// default is FailOpen. A policy's own setting overrides the throttler's.
func WithFailureMode(m FailureMode) Option {
	return optionFunc{"WithFailureMode", false, func(s *settings) error {
		if m != FailOpen && m != FailClosed && m != FailLocal {
			return driver.Errorf("%w: unknown failure mode %d", ErrInvalidOption, int(m))
		}
		s.failure, s.failureSet = m, true
		return nil
	}}
}

// WithDenyCache remembers up to entries recent denials, so that a request
// that would be denied again is answered in process, with Result.Cached
// set, until the denial's RetryAfter has passed or maxStale, whichever
// comes first. The answer is exact except for refunds and resets made by
// other processes, which it misses for at most maxStale; a Refund or Reset
// through this throttler clears the identifier's entry. It works over every
// backend. Only denials of a cost at least the cached one's are answered
// from the cache.
func WithDenyCache(entries int, maxStale time.Duration) Option {
	return optionFunc{"WithDenyCache", true, func(s *settings) error {
		if entries < 1 || maxStale <= 0 {
			return driver.Errorf("%w: WithDenyCache(%d, %v) needs entries >= 1 and a positive staleness", ErrInvalidOption, entries, maxStale)
		}
		s.denyCache = newDenyCache(entries, maxStale)
		return nil
	}}
}

// WithLocalFallback sets the in-process store that FailLocal decides with
// while the backend fails, typically memorybackend.New(), and the number of
// processes expected to share the load: each limit's quota (Max, and a
// GCRA burst) is divided by processes, rounded up, so that the fleet as a
// whole allows about what the policy allows. It also makes FailLocal the
// throttler's failure mode unless WithFailureMode says otherwise.
func WithLocalFallback(local driver.Backend, processes int) Option {
	return optionFunc{"WithLocalFallback", true, func(s *settings) error {
		if local == nil || processes < 1 {
			return driver.Errorf("%w: WithLocalFallback needs a backend and at least one process", ErrInvalidOption)
		}
		s.local, s.processes = local, processes
		if !s.failureSet {
			s.failure = FailLocal
		}
		return nil
	}}
}

// errLocalWithoutFallback is the error for FailLocal chosen by what (the
// throttler, or a policy) where the throttler has no WithLocalFallback.
func errLocalWithoutFallback(what string) error {
	return driver.Errorf("%w: %s: WithFailureMode(FailLocal) needs WithLocalFallback on the throttler (the in-process store FailLocal decides with); without it every request would be denied during an outage",
		ErrInvalidOption, what)
}

func applyOptions(s *settings, opts []Option) error {
	for _, o := range opts {
		if o == nil {
			return driver.Errorf("%w: nil Option", ErrInvalidOption)
		}
		if err := o.apply(s); err != nil {
			return err
		}
	}
	return nil
}
