package throttler

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Defaults of a Throttler.
const (
	// DefaultTimeout bounds each backend call unless WithTimeout or the
	// policy's WithCallTimeout says otherwise.
	DefaultTimeout = 100 * time.Millisecond
	// DefaultDegradedRetryAfter is the RetryAfter of a request denied by
	// FailClosed because the backend failed.
	DefaultDegradedRetryAfter = time.Second
)

// ErrNoBackend reports a Throttler built without a backend.
var ErrNoBackend = errors.New("throttler: no backend")

// Throttler decides requests against policies, delegating storage to a
// Backend. It owns everything that is the same for every store: input
// validation, the clock, per-call timeouts, failure modes, observation and
// the arithmetic that turns stored state into a Result. It is safe for
// concurrent use.
type Throttler struct {
	backend       Backend
	clock         Clock
	observer      Observer
	timeout       time.Duration
	degradedRetry time.Duration
}

// Option configures a Throttler.
type Option func(*Throttler)

// WithClock sets the clock that supplies now for every decision; the
// default is SystemClock.
func WithClock(c Clock) Option { return func(t *Throttler) { t.clock = c } }

// WithObserver sets where events go; the default is SlogObserver on
// slog.Default(). Use MultiObserver to send them to several places.
func WithObserver(o Observer) Option { return func(t *Throttler) { t.observer = o } }

// WithTimeout bounds every backend call of policies without a timeout of
// their own; the default is DefaultTimeout. Zero or less leaves calls bound
// only by the caller's context.
func WithTimeout(d time.Duration) Option { return func(t *Throttler) { t.timeout = d } }

// WithDegradedRetryAfter sets the RetryAfter of requests denied by
// FailClosed; the default is DefaultDegradedRetryAfter.
func WithDegradedRetryAfter(d time.Duration) Option {
	return func(t *Throttler) { t.degradedRetry = d }
}

// New returns a Throttler over b.
func New(b Backend, opts ...Option) *Throttler {
	t := &Throttler{backend: b, clock: SystemClock{}, observer: SlogObserver{}, timeout: DefaultTimeout,
		degradedRetry: DefaultDegradedRetryAfter}
	for _, opt := range opts {
		opt(t)
	}
	if t.clock == nil {
		t.clock = SystemClock{}
	}
	if t.observer == nil {
		t.observer = NopObserver{}
	}
	if t.degradedRetry <= 0 {
		t.degradedRetry = DefaultDegradedRetryAfter
	}
	return t
}

// Backend returns the throttler's backend.
func (t *Throttler) Backend() Backend { return t.backend }

// Clock returns the throttler's clock.
func (t *Throttler) Clock() Clock { return t.clock }

// Allow decides a request of cost 1. It is shorthand for AllowN(ctx, p, id, 1).
func (t *Throttler) Allow(ctx context.Context, p *Policy, id string) (Result, error) {
	return t.AllowN(ctx, p, id, 1)
}

// AllowN decides a request of cost units for identifier id under policy p,
// at the throttler clock's now.
//
// A denial is not an error: err is nil and r.Allowed is false. err is
// non-nil only for invalid input (ErrInvalidPolicy, ErrInvalidIdentifier,
// ErrInvalidCost), for a cost above a limit's capacity (ErrCostExceedsLimit,
// with r.NeverAllowed set), or when ctx itself is done. A backend failure
// is not returned as an error either: the policy's failure mode decides,
// r.Degraded is set, r.Err holds the failure and the observer is told.
func (t *Throttler) AllowN(ctx context.Context, p *Policy, id string, cost int64) (Result, error) {
	if err := t.check(p, id, cost); err != nil {
		return Result{}, err
	}
	return t.decide(ctx, p, id, cost)
}

// Peek returns the result a cost-0 request would get, without changing any
// state. Backends that implement Peeker may answer it from a replica.
func (t *Throttler) Peek(ctx context.Context, p *Policy, id string) (Result, error) {
	if err := t.check(p, id, 0); err != nil {
		return Result{}, err
	}
	now, err := t.now()
	if err != nil {
		return Result{}, err
	}
	req := Request{Policy: p, Identifier: id, Now: now}
	out, lat, err := t.call(ctx, p, func(ctx context.Context) (Outcome, error) {
		if pk, ok := t.backend.(Peeker); ok {
			return pk.Peek(ctx, req)
		}
		return t.backend.Decide(ctx, req)
	})
	return t.finish(ctx, OpPeek, req, out, lat, err)
}

// Refund gives back up to n units of the identifier's current windows (see
// the package function Refund) and returns the state after it, as a peek
// would report it. Use it to charge at the start of a request and refund
// when the response turns out to be free, such as a 304 Not Modified.
//
// A backend failure is returned as an error wrapping ErrBackend; a backend
// without Refunder gives ErrUnsupported.
func (t *Throttler) Refund(ctx context.Context, p *Policy, id string, n int64) (Result, error) {
	if err := t.check(p, id, n); err != nil {
		return Result{}, err
	}
	rf, ok := t.backend.(Refunder)
	if !ok {
		return Result{}, fmt.Errorf("%w: refund", ErrUnsupported)
	}
	now, err := t.now()
	if err != nil {
		return Result{}, err
	}
	req := Request{Policy: p, Identifier: id, Cost: n, Now: now}
	out, lat, err := t.call(ctx, p, func(ctx context.Context) (Outcome, error) { return rf.Refund(ctx, req) })
	if err != nil {
		t.observer.Observe(Event{Op: OpRefund, Policy: p.name, Err: err, Latency: lat})
		return Result{}, err
	}
	r := Evaluate(p, req.Now, 0, true, out.States)
	r.Identifier = id
	t.observer.Observe(Event{Op: OpRefund, Policy: p.name, Result: &r, Latency: lat})
	return r, nil
}

// Reset forgets the identifier's state for policy p. A backend failure is
// returned as an error wrapping ErrBackend; a backend without Resetter gives
// ErrUnsupported.
func (t *Throttler) Reset(ctx context.Context, p *Policy, id string) error {
	if err := t.check(p, id, 0); err != nil {
		return err
	}
	rs, ok := t.backend.(Resetter)
	if !ok {
		return fmt.Errorf("%w: reset", ErrUnsupported)
	}
	_, lat, err := t.callStates(ctx, p, false, func(ctx context.Context) (Outcome, error) {
		return Outcome{}, rs.Reset(ctx, p, id)
	})
	t.observer.Observe(Event{Op: OpReset, Policy: p.name, Err: err, Latency: lat})
	return err
}

// Ping checks that the backend's store is reachable, within the throttler's
// timeout. Backends without Pinger are taken to be reachable.
func (t *Throttler) Ping(ctx context.Context) error {
	if t.backend == nil {
		return ErrNoBackend
	}
	pg, ok := t.backend.(Pinger)
	if !ok {
		return nil
	}
	ctx, cancel := t.callContext(ctx, nil)
	defer cancel()
	if err := pg.Ping(ctx); err != nil {
		return wrapBackend(err)
	}
	return nil
}

// now reads the clock and checks the reading (ErrClockOutOfRange).
func (t *Throttler) now() (time.Time, error) {
	now := t.clock.Now()
	return now, checkTime(now)
}

func (t *Throttler) check(p *Policy, id string, cost int64) error {
	if t.backend == nil {
		return ErrNoBackend
	}
	if err := p.validate(); err != nil {
		return err
	}
	if err := ValidateIdentifier(id); err != nil {
		return err
	}
	if cost < 0 {
		return fmt.Errorf("%w: %d is negative", ErrInvalidCost, cost)
	}
	return nil
}

// decide runs one validated decision.
func (t *Throttler) decide(ctx context.Context, p *Policy, id string, cost int64) (Result, error) {
	now, err := t.now()
	if err != nil {
		return Result{}, err
	}
	req := Request{Policy: p, Identifier: id, Cost: cost, Now: now}
	if cost > p.capacity() {
		return t.neverAllowed(ctx, req)
	}
	out, lat, err := t.call(ctx, p, func(ctx context.Context) (Outcome, error) { return t.backend.Decide(ctx, req) })
	return t.finish(ctx, OpAllow, req, out, lat, err)
}

// finish turns a backend outcome, or its failure, into a Result.
func (t *Throttler) finish(ctx context.Context, op Op, req Request, out Outcome, lat time.Duration, err error) (Result, error) {
	if err != nil && ctx.Err() != nil {
		// The caller gave up: there is nobody to apply a failure mode for.
		return Result{}, ctx.Err()
	}
	var r Result
	if err != nil {
		r = t.degraded(req, err)
	} else {
		r = Evaluate(req.Policy, req.Now, req.Cost, out.Allowed, out.States)
	}
	r.Identifier = req.Identifier
	t.observer.Observe(Event{Op: op, Policy: req.Policy.name, Result: &r, Err: r.Err, Latency: lat})
	return r, nil
}

// neverAllowed answers a request whose cost exceeds a limit's capacity: it
// reads the current state (so the figures are true), changes nothing and
// reports RetryAfter = Never.
func (t *Throttler) neverAllowed(ctx context.Context, req Request) (Result, error) {
	peek := req
	peek.Cost = 0
	out, lat, err := t.call(ctx, req.Policy, func(ctx context.Context) (Outcome, error) {
		if pk, ok := t.backend.(Peeker); ok {
			return pk.Peek(ctx, peek)
		}
		return t.backend.Decide(ctx, peek)
	})
	r := Evaluate(req.Policy, req.Now, req.Cost, false, out.States)
	if err != nil {
		r.Degraded, r.Err = true, err
	}
	r.Identifier, r.NeverAllowed, r.RetryAfter = req.Identifier, true, Never
	t.observer.Observe(Event{Op: OpAllow, Policy: req.Policy.name, Result: &r, Err: err, Latency: lat})
	return r, fmt.Errorf("%w: cost %d, limit %q holds %d", ErrCostExceedsLimit, req.Cost, r.Binding, r.Limit)
}

// degraded builds the result of a failed backend call from the policy's
// failure mode: the figures of a fresh window after this request (fail
// open), or a denial with nothing remaining (fail closed).
func (t *Throttler) degraded(req Request, err error) Result {
	p := req.Policy
	_, fresh := Decide(p, req.Now, req.Cost, make([]State, len(p.limits)))
	r := Evaluate(p, req.Now, req.Cost, true, fresh)
	r.Degraded, r.Err = true, err
	if p.failure == FailClosed {
		r.Allowed = false
		r.RetryAfter = t.degradedRetry
		r.ResetAt = req.Now.Add(t.degradedRetry)
		r.Remaining, r.Used = 0, r.Limit
		for i := range r.Limits {
			l := &r.Limits[i]
			l.Allowed, l.Remaining, l.Used, l.RetryAfter = false, 0, l.Limit, t.degradedRetry
		}
	}
	return r
}

// call runs one backend call under the per-call timeout and checks what it
// returned.
func (t *Throttler) call(ctx context.Context, p *Policy, f func(context.Context) (Outcome, error)) (Outcome, time.Duration, error) {
	return t.callStates(ctx, p, true, f)
}

// callStates is call; wantStates says whether the reply must carry one state
// per limit (every operation but Reset).
func (t *Throttler) callStates(ctx context.Context, p *Policy, wantStates bool, f func(context.Context) (Outcome, error)) (Outcome, time.Duration, error) {
	ctx, cancel := t.callContext(ctx, p)
	defer cancel()
	start := time.Now()
	out, err := f(ctx)
	lat := time.Since(start)
	if err == nil && wantStates && len(out.States) != len(p.limits) {
		err = fmt.Errorf("%w: %d states for %d limits", ErrBadReply, len(out.States), len(p.limits))
	}
	if err != nil {
		return Outcome{}, lat, wrapBackend(err)
	}
	return out, lat, nil
}

func (t *Throttler) callContext(ctx context.Context, p *Policy) (context.Context, context.CancelFunc) {
	d := t.timeout
	if p != nil && p.timeout > 0 {
		d = p.timeout
	}
	if d <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

func wrapBackend(err error) error {
	if errors.Is(err, ErrBackend) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrBackend, err)
}

// capacity is the largest cost any request under p can ever be allowed.
func (p *Policy) capacity() int64 {
	c := p.limits[0].capacity()
	for _, l := range p.limits[1:] {
		c = min(c, l.capacity())
	}
	return c
}
