package breaker

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// Backend is a driver.Backend behind one breaker. Every call to the wrapped
// backend goes through the breaker; a call it rejects returns an error
// wrapping ErrOpen at once.
//
// Errors that are not outages (invalid input, states included, a bad
// reply, an unsupported operation, ErrNotInitialized) count as successes:
// the server answered. Everything else counts as a failure. A call the
// caller canceled counts neither way.
type Backend struct {
	next driver.Backend
	br   *Breaker
}

// IdleCloser is implemented by a backend that keeps pooled connections,
// such as memcachedbackend.Backend: CloseIdleConnections closes the
// connections that are not carrying a call, and later calls dial anew.
type IdleCloser interface {
	CloseIdleConnections()
}

// Wrap returns b behind a breaker named server. When b is an IdleCloser,
// its idle connections are closed whenever the breaker opens and before
// each probe (see Breaker.AddDrain), so that the probe after an outage
// dials a fresh connection. The error wraps driver.ErrInvalidOption for a
// bad option, or driver.ErrNotInitialized for a nil b.
func Wrap(b driver.Backend, server string, opts ...Option) (*Backend, error) {
	if b == nil {
		return nil, driver.Errorf("%w: breaker: Wrap of a nil backend", driver.ErrNotInitialized)
	}
	br, err := New(server, opts...)
	if err != nil {
		return nil, err
	}
	if ic, ok := b.(IdleCloser); ok {
		br.AddDrain(ic.CloseIdleConnections)
	}
	return &Backend{next: b, br: br}, nil
}

// Breaker returns the backend's breaker.
func (b *Backend) Breaker() *Breaker { return b.br }

// Breakers returns the status of the backend's breaker, in the form
// redisbackend's Backend.Breakers has, for metrics and debug pages.
func (b *Backend) Breakers() []Status { return []Status{b.br.Status()} }

// Unwrap returns the wrapped backend.
func (b *Backend) Unwrap() driver.Backend { return b.next }

// outage reports whether err says the server failed, as opposed to an answer
// the server gave.
func outage(err error) error {
	switch {
	case err == nil,
		errors.Is(err, driver.ErrInvalidLimit), errors.Is(err, driver.ErrInvalidPolicy),
		errors.Is(err, driver.ErrInvalidOption), errors.Is(err, driver.ErrNotInitialized),
		errors.Is(err, driver.ErrBadReply), errors.Is(err, errors.ErrUnsupported),
		errors.Is(err, driver.ErrClosed), errors.Is(err, driver.ErrInvalidState):
		return nil
	}
	return err
}

func guard[T any](b *Backend, call func() (T, error)) (T, error) {
	if b == nil || b.br == nil {
		var zero T
		return zero, driver.Errorf("%w: breaker: Backend not built by Wrap", driver.ErrNotInitialized)
	}
	done, err := b.br.Allow()
	if err != nil {
		var zero T
		return zero, err
	}
	v, err := call()
	done(outage(err))
	return v, err
}

// Decide implements driver.Backend.
func (b *Backend) Decide(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	return guard(b, func() (driver.Outcome, error) { return b.next.Decide(ctx, req) })
}

// Peek implements driver.Peeker: the wrapped backend's Peek, or its Decide
// with cost 0 when it has none.
func (b *Backend) Peek(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	return guard(b, func() (driver.Outcome, error) {
		if pk, ok := b.next.(driver.Peeker); ok {
			return pk.Peek(ctx, req)
		}
		req.Cost = 0
		return b.next.Decide(ctx, req)
	})
}

// Refund implements driver.Refunder. A wrapped backend without Refunder
// gives an error wrapping errors.ErrUnsupported.
func (b *Backend) Refund(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	return guard(b, func() (driver.Outcome, error) {
		rf, ok := b.next.(driver.Refunder)
		if !ok {
			return driver.Outcome{}, driver.Errorf("throttlekit: breaker: %w: wrapped backend cannot refund", errors.ErrUnsupported)
		}
		return rf.Refund(ctx, req)
	})
}

// Take implements driver.Taker with the wrapped backend's Take, or
// driver.TakeWith's rounds of a peek and a decision, behind the breaker.
func (b *Backend) Take(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	return guard(b, func() (driver.Outcome, error) { return driver.TakeWith(ctx, b.next, req) })
}

// Reset implements driver.Resetter. A wrapped backend without Resetter gives
// an error wrapping errors.ErrUnsupported.
func (b *Backend) Reset(ctx context.Context, p *driver.Policy, identifier string) error {
	_, err := guard(b, func() (struct{}, error) {
		rs, ok := b.next.(driver.Resetter)
		if !ok {
			return struct{}{}, driver.Errorf("throttlekit: breaker: %w: wrapped backend cannot reset", errors.ErrUnsupported)
		}
		return struct{}{}, rs.Reset(ctx, p, identifier)
	})
	return err
}

// Seed implements driver.Seeder: the wrapped backend's Seed, guarded and
// counted like Decide (it is one call to the server). A wrapped backend
// without Seeder gives an error wrapping errors.ErrUnsupported at once,
// whatever the breaker's state, so that a caller can tell it from an
// outage and never learns it through a probe.
func (b *Backend) Seed(ctx context.Context, req driver.Request, given []driver.State) (driver.Outcome, error) {
	if b == nil || b.br == nil {
		return driver.Outcome{}, driver.Errorf("%w: breaker: Backend not built by Wrap", driver.ErrNotInitialized)
	}
	sd, ok := b.next.(driver.Seeder)
	if !ok {
		return driver.Outcome{}, driver.Errorf("throttlekit: breaker: %w: wrapped backend cannot take states", errors.ErrUnsupported)
	}
	return guard(b, func() (driver.Outcome, error) { return sd.Seed(ctx, req, given) })
}

// Nonblocking implements driver.Nonblocking: true when the wrapped backend
// is nonblocking (an in-process store), since the breaker itself never
// waits, so that the throttler gives its calls no call timeout.
func (b *Backend) Nonblocking() bool {
	if b == nil || b.br == nil {
		return false
	}
	nb, ok := b.next.(driver.Nonblocking)
	return ok && nb.Nonblocking()
}

// Acquire implements driver.Leaser. A wrapped backend without Leaser gives
// an error wrapping errors.ErrUnsupported at once, whatever the breaker's
// state.
func (b *Backend) Acquire(ctx context.Context, req driver.LeaseRequest) (driver.LeaseOutcome, error) {
	lr, err := b.leaser()
	if err != nil {
		return driver.LeaseOutcome{}, err
	}
	return guard(b, func() (driver.LeaseOutcome, error) { return lr.Acquire(ctx, req) })
}

// Release implements driver.Leaser. A wrapped backend without Leaser gives
// an error wrapping errors.ErrUnsupported at once.
func (b *Backend) Release(ctx context.Context, req driver.LeaseRequest) (driver.LeaseOutcome, error) {
	lr, err := b.leaser()
	if err != nil {
		return driver.LeaseOutcome{}, err
	}
	return guard(b, func() (driver.LeaseOutcome, error) { return lr.Release(ctx, req) })
}

func (b *Backend) leaser() (driver.Leaser, error) {
	if b == nil || b.br == nil {
		return nil, driver.Errorf("%w: breaker: Backend not built by Wrap", driver.ErrNotInitialized)
	}
	lr, ok := b.next.(driver.Leaser)
	if !ok {
		return nil, driver.Errorf("throttlekit: breaker: %w: wrapped backend cannot lease", errors.ErrUnsupported)
	}
	return lr, nil
}

// Ping implements driver.Pinger. It goes through the breaker too, so that a
// health check sees an open breaker as the outage it is; nil when the
// wrapped backend has no Pinger.
func (b *Backend) Ping(ctx context.Context) error {
	_, err := guard(b, func() (struct{}, error) {
		if pg, ok := b.next.(driver.Pinger); ok {
			return struct{}{}, pg.Ping(ctx)
		}
		return struct{}{}, nil
	})
	return err
}

// SetLogger implements driver.LoggerSetter: the backend's breaker logs to
// l (nowhere for a nil l) unless Wrap was given WithLogger, which wins; then
// the wrapped backend gets l when it implements driver.LoggerSetter.
func (b *Backend) SetLogger(l *slog.Logger) {
	if b == nil || b.br == nil {
		return
	}
	b.br.cfg.setLogger(l)
	if ls, ok := b.next.(driver.LoggerSetter); ok {
		ls.SetLogger(l)
	}
}

// CheckConfig implements driver.ConfigChecker: it asks the wrapped
// backend, when that implements it.
func (b *Backend) CheckConfig(callTimeout time.Duration) error {
	if b == nil {
		return nil
	}
	return driver.CheckConfig(b.next, callTimeout)
}

// Close implements driver.Closer: it closes the wrapped backend when that
// is a Closer.
func (b *Backend) Close() error {
	if b == nil {
		return nil
	}
	if c, ok := b.next.(driver.Closer); ok {
		return c.Close()
	}
	return nil
}

var (
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
