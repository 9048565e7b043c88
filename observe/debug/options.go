package debugpage

import (
	"fmt"
	"reflect"
	"time"

	"github.com/throttlekit/throttlekit/backend/breaker"
	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// Defaults of a Handler.
const (
	// DefaultTopK is how many counters the sketch of the heaviest denied
	// identifiers holds, and so how many identifiers the page can show.
	DefaultTopK = 100
	// MaxTopK bounds WithTopK.
	MaxTopK = 100_000
	// DefaultPingTimeout bounds each ping when the page loads.
	DefaultPingTimeout = time.Second
)

// Option configures a Handler. New reports a bad option as an error
// wrapping throttler.ErrInvalidOption.
type Option interface {
	apply(*config) error
}

// optionFunc adapts a function to Option.
type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	backends    []namedBackend
	breakers    []namedBreakers
	rollouts    []namedRollout
	statuses    map[string]func() SourceStatus
	policies    []*throttler.Policy
	k           int
	pingTimeout time.Duration
	clock       throttler.Clock
}

type namedBackend struct {
	name string
	b    driver.Backend
}

type namedBreakers struct {
	name     string
	statuses func() []breaker.Status
}

type namedRollout struct {
	name   string
	b      *rollout.Backend
	status func() SourceStatus // nil unless WithSourceStatus
}

// invalid returns an error wrapping throttler.ErrInvalidOption.
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: debugpage: "+format, append([]any{throttler.ErrInvalidOption}, args...)...)
}

// isNil reports a nil interface or an interface holding a nil pointer,
// map, slice, channel or function.
func isNil(v any) bool {
	if v == nil {
		return true
	}
	switch r := reflect.ValueOf(v); r.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Chan, reflect.Func, reflect.Interface:
		return r.IsNil()
	}
	return false
}

// WithBackend lists a backend under name. On every load the page pings it
// when it implements driver.Pinger, and shows its circuit breakers when it
// reports them: Breakers() []breaker.Status (redisbackend.Backend,
// breaker.Backend) or Breaker() *breaker.Breaker. A rollout.Backend may be
// listed too: its ping covers both sides and its flag source.
func WithBackend(name string, b driver.Backend) Option {
	return optionFunc(func(c *config) error {
		if name == "" || isNil(b) {
			return invalid("WithBackend needs a name and a non-nil backend")
		}
		c.backends = append(c.backends, namedBackend{name, b})
		return nil
	})
}

// WithBreakers adds a source of breaker states under name, for breakers
// no listed backend reports itself.
func WithBreakers(name string, statuses func() []breaker.Status) Option {
	return optionFunc(func(c *config) error {
		if name == "" || statuses == nil {
			return invalid("WithBreakers needs a name and a function")
		}
		c.breakers = append(c.breakers, namedBreakers{name, statuses})
		return nil
	})
}

// WithBreakerSet shows the breakers of set under name.
func WithBreakerSet(name string, set *breaker.Set) Option {
	return optionFunc(func(c *config) error {
		if name == "" || set == nil {
			return invalid("WithBreakerSet needs a name and a non-nil set")
		}
		c.breakers = append(c.breakers, namedBreakers{name, set.Statuses})
		return nil
	})
}

// WithRollout shows a rollout under name: its mode, the split in force
// (percent to the new backend, kill switch, group ID), its flag source's
// health and freshness, and its counters. The source is pinged when it
// implements driver.Pinger; its last fetch is shown when it has a
// LastFetch() time.Time method (unleashflag.Source has one), and more with
// WithSourceStatus.
func WithRollout(name string, b *rollout.Backend) Option {
	return optionFunc(func(c *config) error {
		if name == "" || b == nil {
			return invalid("WithRollout needs a name and a non-nil rollout")
		}
		c.rollouts = append(c.rollouts, namedRollout{name: name, b: b})
		return nil
	})
}

// SourceStatus is what a flag source tells of its freshness, for
// WithSourceStatus. Zero fields are not shown.
type SourceStatus struct {
	// LastFetch is when the source's server last answered.
	LastFetch time.Time
	// LastUpdate is when the source last published a new split.
	LastUpdate time.Time
	// Errors counts the source's errors, such as failed fetches.
	Errors uint64
	// LastError is the latest of them, or nil.
	LastError error
}

// WithSourceStatus gives the rollout listed under name (by WithRollout,
// before or after this option) a function reporting its flag source's
// freshness, read on every load. It lets the page show an Unleash source's
// history without this package importing the Unleash client:
//
//	debugpage.WithSourceStatus("sessions", func() debugpage.SourceStatus {
//		st := src.Status() // src is an *unleashflag.Source
//		return debugpage.SourceStatus{LastFetch: st.LastFetch, LastUpdate: st.LastUpdate,
//			Errors: st.Errors, LastError: st.LastError}
//	})
func WithSourceStatus(name string, status func() SourceStatus) Option {
	return optionFunc(func(c *config) error {
		if name == "" || status == nil {
			return invalid("WithSourceStatus needs a rollout name and a function")
		}
		if c.statuses == nil {
			c.statuses = map[string]func() SourceStatus{}
		}
		c.statuses[name] = status
		return nil
	})
}

// WithPolicies lists policies in use.
func WithPolicies(policies ...*throttler.Policy) Option {
	return optionFunc(func(c *config) error {
		for _, p := range policies {
			if p == nil || p.Name() == "" {
				return invalid("WithPolicies: a nil or zero policy")
			}
		}
		c.policies = append(c.policies, policies...)
		return nil
	})
}

// WithTopK sets how many counters the sketch of the heaviest denied
// identifiers holds, from 1 to MaxTopK (DefaultTopK unless set). It fixes
// the sketch's memory: k entries, whatever the number of identifiers. A
// larger k tightens the error bound, which is at most the denials seen
// divided by k.
func WithTopK(k int) Option {
	return optionFunc(func(c *config) error {
		if k < 1 || k > MaxTopK {
			return invalid("WithTopK(%d): want 1 to %d", k, MaxTopK)
		}
		c.k = k
		return nil
	})
}

// WithPingTimeout bounds each ping (DefaultPingTimeout unless set). A ping
// that has not answered by then is shown as failed and the page is served
// without waiting for it.
func WithPingTimeout(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d <= 0 {
			return invalid("WithPingTimeout(%v): want > 0", d)
		}
		c.pingTimeout = d
		return nil
	})
}

// WithClock sets the clock the page reads its time and the age of a
// source's last fetch with (the wall clock unless set).
func WithClock(clock throttler.Clock) Option {
	return optionFunc(func(c *config) error {
		if isNil(clock) {
			return invalid("WithClock needs a non-nil clock")
		}
		c.clock = clock
		return nil
	})
}
