package throttler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// degradedRetryAfter is the RetryAfter of a request denied by FailClosed.
const degradedRetryAfter = time.Second

// Throttler decides requests against policies, delegating storage to a
// backend. It owns everything that is the same for every store: input
// validation, the clock, per-call timeouts, failure modes, observation and
// the arithmetic that turns stored state into a Result. It is safe for
// concurrent use. The zero Throttler returns ErrNotInitialized from every
// method; build one with New.
type Throttler struct {
	backend     driver.Backend
	name        string // the backend's name in Events
	clock       Clock
	wallClock   bool       // clock is the wall clock: a call's latency is time.Since(now)
	nonblocking bool       // the backend never blocks: no timeout context
	inProcess   bool       // nonblocking, wall clock and no observer: the fast path
	outages     *outageLog // where failures are logged; nil: nowhere
	observers   []Observer
	timeout     time.Duration
	failure     FailureMode
	denies      *denyCache // nil without WithDenyCache
	local       driver.Backend
	processes   int
	shares      sync.Map // *Policy -> *Policy scaled to one process's share
}

// New returns a Throttler over backend b, a value from one of the backend
// packages (memorybackend, redisbackend, memcachedbackend, shardedbackend,
// rollout) or any driver.Backend. Without options it reads the wall clock,
// fails open, bounds each backend call by DefaultCallTimeout and logs
// backend failures to slog.Default(). A nil b, or a typed nil pointer in
// it, is ErrNotInitialized; a bad option is ErrInvalidOption.
func New(b driver.Backend, opts ...Option) (*Throttler, error) {
	if b == nil {
		return nil, driver.Errorf("%w: New: nil backend", ErrNotInitialized)
	}
	if v := reflect.ValueOf(b); v.Kind() == reflect.Pointer && v.IsNil() {
		return nil, driver.Errorf("%w: New: nil %T backend", ErrNotInitialized, b)
	}
	s := settings{clock: wallClock{}, timeout: DefaultCallTimeout}
	if err := applyOptions(&s, opts); err != nil {
		return nil, err
	}
	if s.failure == FailLocal && s.local == nil {
		return nil, errLocalWithoutFallback("New")
	}
	if err := driver.CheckConfig(b, s.timeout); err != nil {
		return nil, err
	}
	if err := driver.CheckConfig(s.local, s.timeout); err != nil {
		return nil, driver.Errorf("WithLocalFallback: %w", err)
	}
	t := &Throttler{backend: b, clock: s.clock, timeout: s.timeout, failure: s.failure,
		observers: s.observers, denies: s.denyCache, local: s.local, processes: s.processes}
	logger := s.logger
	if !s.loggerSet {
		logger = slog.Default()
	}
	if logger != nil {
		t.outages = &outageLog{logger: logger, every: outageLogEvery, quiet: outageQuiet}
	}
	if s.loggerSet {
		// The backend's own lines (store advice, breakers) go where the
		// throttler's go; without WithLogger it keeps slog.Default().
		for _, be := range []driver.Backend{b, s.local} {
			if ls, ok := be.(driver.LoggerSetter); ok {
				ls.SetLogger(logger)
			}
		}
	}
	t.name = backendName(b)
	_, t.wallClock = s.clock.(wallClock)
	if nb, ok := b.(driver.Nonblocking); ok {
		t.nonblocking = nb.Nonblocking()
	}
	t.inProcess = t.nonblocking && t.wallClock && len(t.observers) == 0
	return t, nil
}

// Allow decides a request of cost 1. It is shorthand for AllowN(ctx, p, id, 1).
func (t *Throttler) Allow(ctx context.Context, p *Policy, id string) (r Result, err error) {
	err = t.allowN(ctx, p, id, 1, &r)
	return r, err
}

// AllowN decides a request of cost units for identifier id under policy p,
// at the throttler clock's now.
//
// A denial is not an error: err is nil and r.Allowed is false. err is
// non-nil only for invalid input (ErrInvalidPolicy, ErrInvalidIdentifier,
// ErrInvalidCost, ErrNotInitialized, ErrClockOutOfRange), for a cost above
// a limit's capacity (ErrCostExceedsLimit, with r.NeverAllowed set), or
// when ctx itself is done. A backend failure is not returned as an error
// either: the failure mode decides, r.Degraded is set, r.Err holds the
// failure and the observers are told.
func (t *Throttler) AllowN(ctx context.Context, p *Policy, id string, cost int64) (r Result, err error) {
	err = t.allowN(ctx, p, id, cost, &r)
	return r, err
}

// allowN is AllowN into *r, which is zero on entry. Allow and AllowN are
// small enough to be inlined, so that the caller's Result is the one
// decided into and no copy of it is made on the way back.
func (t *Throttler) allowN(ctx context.Context, p *Policy, id string, cost int64, r *Result) error {
	if err := t.check(p, id, cost); err != nil {
		return err
	}
	return t.decide(ctx, p, id, cost, r)
}

// Peek returns the result a cost-0 request would get, without changing any
// state. A backend may answer it from a replica (Redis groups, and the
// Redis backend with WithReadClient, do).
func (t *Throttler) Peek(ctx context.Context, p *Policy, id string) (Result, error) {
	if err := t.check(p, id, 0); err != nil {
		return Result{}, err
	}
	now, err := t.now()
	if err != nil {
		return Result{}, err
	}
	req := driver.Request{Policy: p.compiled, Identifier: id, Now: now}
	var r Result
	if err := t.run(ctx, opPeek, p, req, &r); err != nil {
		return Result{}, err
	}
	return r, nil
}

// Refund gives back up to n units of the identifier's current windows
// (fixed windows: Used -= n, not below 0; GCRA: the state moves back n
// emission intervals, not before now) and returns the state after it, as a
// peek would report it. A window that has closed is left alone. Use it to
// charge at the start of a request and refund when the response turns out
// to be free, such as a 304 Not Modified.
//
// A backend failure is returned as an error wrapping ErrBackend; a backend
// that cannot refund gives errors.ErrUnsupported.
func (t *Throttler) Refund(ctx context.Context, p *Policy, id string, n int64) (Result, error) {
	if err := t.check(p, id, n); err != nil {
		return Result{}, err
	}
	rf, ok := t.backend.(driver.Refunder)
	if !ok {
		return Result{}, driver.Errorf("%w: %T cannot refund", errors.ErrUnsupported, t.backend)
	}
	now, err := t.now()
	if err != nil {
		return Result{}, err
	}
	req := driver.Request{Policy: p.compiled, Identifier: id, Cost: n, Now: now}
	out, lat, err := t.call(ctx, p, req, func(ctx context.Context) (driver.Outcome, error) { return rf.Refund(ctx, req) })
	if t.denies != nil {
		// After the refund, so that no denial made before it stays cached.
		t.denies.forget(p, id)
	}
	if err != nil {
		t.observe(ctx, "refund", p, req, nil, err, lat)
		return Result{}, err
	}
	r := evaluated(p.compiled, now, 0, true, out.States)
	r.Identifier = id
	t.observe(ctx, "refund", p, req, &r, nil, lat)
	return r, nil
}

// Reset forgets the identifier's state for policy p (an administrator's
// operation). A backend failure is returned as an error wrapping
// ErrBackend; a backend that cannot reset gives errors.ErrUnsupported.
func (t *Throttler) Reset(ctx context.Context, p *Policy, id string) error {
	if err := t.check(p, id, 0); err != nil {
		return err
	}
	rs, ok := t.backend.(driver.Resetter)
	if !ok {
		return driver.Errorf("%w: %T cannot reset", errors.ErrUnsupported, t.backend)
	}
	now, err := t.now()
	if err != nil {
		return err
	}
	if t.denies != nil {
		defer t.denies.forget(p, id)
	}
	req := driver.Request{Policy: p.compiled, Identifier: id, Now: now}
	_, lat, err := t.callStates(ctx, p, req, false, func(ctx context.Context) (driver.Outcome, error) {
		return driver.Outcome{}, rs.Reset(ctx, p.compiled, id)
	})
	t.observe(ctx, "reset", p, req, nil, err, lat)
	return err
}

// Ping checks that the backend's store is reachable, within the call
// timeout. A backend that has no way to check is taken to be reachable.
// The error wraps ErrBackend.
func (t *Throttler) Ping(ctx context.Context) error {
	if t == nil || t.backend == nil {
		return driver.Errorf("%w: zero Throttler (build it with New)", ErrNotInitialized)
	}
	pg, ok := t.backend.(driver.Pinger)
	if !ok {
		return nil
	}
	ctx, cancel := t.callContext(ctx, t.timeout)
	defer cancel()
	if err := pg.Ping(ctx); err != nil {
		return wrapBackend(err)
	}
	return nil
}

// now reads the clock and checks the reading (ErrClockOutOfRange).
func (t *Throttler) now() (time.Time, error) {
	var now time.Time
	if t.wallClock {
		now = time.Now()
	} else {
		now = t.clock.Now()
	}
	// UnixMilli floors, so a reading in the last millisecond before the
	// bound's successor (2200-01-01T00:00:00.000999999Z) has the bound's
	// millisecond: that millisecond goes to checkTime, which compares whole
	// readings, and the fast path stays one integer comparison.
	if ms := now.UnixMilli(); ms < 0 || ms >= driver.MaxUnixMilli {
		return now, checkTime(now)
	}
	return now, nil
}

func (t *Throttler) check(p *Policy, id string, cost int64) error {
	if t == nil || t.backend == nil {
		return driver.Errorf("%w: zero Throttler (build it with New)", ErrNotInitialized)
	}
	if err := p.validate(); err != nil {
		return err
	}
	if t.local == nil && p.over.failureSet && p.over.failure == FailLocal {
		return errLocalWithoutFallback(fmt.Sprintf("policy %q", p.Name()))
	}
	if len(id) == 0 || len(id) > driver.MaxIdentifierLen {
		return driver.Errorf("%w: length %d, want 1 to %d bytes", ErrInvalidIdentifier, len(id), driver.MaxIdentifierLen)
	}
	if cost < 0 {
		return driver.Errorf("%w: %d is negative", ErrInvalidCost, cost)
	}
	return nil
}

func (t *Throttler) peek(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	req.Cost = 0
	if pk, ok := t.backend.(driver.Peeker); ok {
		return pk.Peek(ctx, req)
	}
	return t.backend.Decide(ctx, req)
}

// decide runs one validated decision and sets r to its result. Its error
// is as AllowN's; r is then left zero, but for ErrCostExceedsLimit.
func (t *Throttler) decide(ctx context.Context, p *Policy, id string, cost int64, r *Result) error {
	now, err := t.now()
	if err != nil {
		return err
	}
	req := driver.Request{Policy: p.compiled, Identifier: id, Cost: cost, Now: now}
	if cost > p.compiled.Capacity {
		*r, err = t.neverAllowed(ctx, p, req)
		return err
	}
	if t.denies != nil && cost > 0 {
		if cached, ok := t.denies.lookup(p, id, cost, now); ok {
			*r = cached
			if len(t.observers) > 0 {
				t.observe(ctx, "allow", p, req, r, nil, 0)
			}
			return nil
		}
	}
	if t.inProcess && len(p.compiled.Limits) <= inlineLimits {
		err = t.decideInProcess(ctx, p, id, cost, now, r)
	} else {
		err = t.run(ctx, opDecide, p, req, r)
	}
	if err != nil {
		return err
	}
	if t.denies != nil && !r.Allowed {
		t.denies.remember(p, r, cost)
	}
	return nil
}

// decideInProcess is run's work for a decision on the in-process path (a
// nonblocking backend, the wall clock, no observer), without its
// generality, for a policy of up to inlineLimits limits.
func (t *Throttler) decideInProcess(ctx context.Context, p *Policy, id string, cost int64, now time.Time, r *Result) error {
	n := len(p.compiled.Limits)
	buf := statesPool.Get().(*[inlineLimits]driver.State)
	// The request is built in the call, not copied into it.
	out, err := t.backend.Decide(ctx, driver.Request{Policy: p.compiled, Identifier: id, Cost: cost, Now: now, Buffer: buf[:0:n]})
	if err == nil && len(out.States) == n {
		r.evaluate(p.compiled, now, cost, out.Allowed, out.States)
		r.Identifier = id
	}
	*buf = [inlineLimits]driver.State{}
	statesPool.Put(buf)
	if err == nil && len(out.States) != n {
		err = driver.Errorf("%w: %d states for %d limits", driver.ErrBadReply, len(out.States), n)
	}
	if err != nil {
		req := driver.Request{Policy: p.compiled, Identifier: id, Cost: cost, Now: now}
		return t.finish(ctx, opDecide, p, req, driver.Outcome{}, time.Since(now), wrapBackend(err), r)
	}
	if t.outages != nil {
		t.outages.success(ctx)
	}
	return nil
}

// callOp is the backend operation run calls.
type callOp uint8

const (
	opDecide callOp = iota
	opPeek
	opTake // AllowUpTo: a decision, observed as one
)

// statesPool holds the buffers a nonblocking backend returns the states of
// a policy of up to four limits in (driver.Request.Buffer), so that an
// in-process decision allocates nothing. A blocking backend gets a buffer
// of its own: a call it abandons on a timeout may still be under way.
var statesPool = sync.Pool{New: func() any { return new([inlineLimits]driver.State) }}

// run makes one backend call of op for req and sets r to its result, or to
// the failure mode's when the backend failed. Its error is the caller's
// context's, or ErrNotInitialized; r is then left zero.
func (t *Throttler) run(ctx context.Context, op callOp, p *Policy, req driver.Request, r *Result) error {
	var buf *[inlineLimits]driver.State
	if n := len(p.compiled.Limits); n <= inlineLimits && t.nonblocking {
		buf = statesPool.Get().(*[inlineLimits]driver.State)
		req.Buffer = buf[:0:n]
	} else {
		req.Buffer = make([]driver.State, 0, n)
	}
	out, lat, err := t.callOp(ctx, op, p, req)
	if op == opTake {
		// The result is evaluated as the decision of the units granted, or,
		// when none were, of one unit; a failure mode decides min(n,
		// capacity).
		if err == nil {
			req.Cost = max(out.Granted, 1)
		} else {
			req.Cost = min(req.Cost, p.compiled.Capacity)
		}
	}
	err = t.finish(ctx, op, p, req, out, lat, err, r)
	if buf != nil {
		// finish copied the states out: nothing refers to buf any more.
		*buf = [inlineLimits]driver.State{}
		statesPool.Put(buf)
	}
	return err
}

// callOp is callStates for op, without a closure on the hot path.
func (t *Throttler) callOp(ctx context.Context, op callOp, p *Policy, req driver.Request) (driver.Outcome, time.Duration, error) {
	if t.nonblocking && len(t.observers) == 0 && t.wallClock {
		// The in-process path: no timeout context and no latency to
		// measure but a failure's.
		var out driver.Outcome
		var err error
		switch op {
		case opDecide:
			out, err = t.backend.Decide(ctx, req)
		case opPeek:
			out, err = t.peek(ctx, req)
		default:
			out, err = t.take(ctx, req)
		}
		if err == nil && len(out.States) != len(p.compiled.Limits) {
			err = driver.Errorf("%w: %d states for %d limits", driver.ErrBadReply, len(out.States), len(p.compiled.Limits))
		}
		if err != nil {
			return driver.Outcome{}, time.Since(req.Now), wrapBackend(err)
		}
		return out, 0, nil
	}
	return t.call(ctx, p, req, func(ctx context.Context) (driver.Outcome, error) {
		switch op {
		case opDecide:
			return t.backend.Decide(ctx, req)
		case opPeek:
			return t.peek(ctx, req)
		}
		return t.take(ctx, req)
	})
}

// finish sets r from a backend outcome, or from the failure mode when the
// call failed, and tells the observers. It returns the caller's context's
// error when the caller gave up, and ErrNotInitialized, leaving r zero.
func (t *Throttler) finish(ctx context.Context, op callOp, p *Policy, req driver.Request, out driver.Outcome, lat time.Duration, err error, r *Result) error {
	if err != nil && ctx.Err() != nil {
		// The caller gave up: there is nobody to apply a failure mode for.
		return ctx.Err()
	}
	if errors.Is(err, ErrNotInitialized) {
		return err
	}
	name := "allow"
	if op == opPeek {
		name = "peek"
	}
	switch {
	case err != nil && op != opPeek && p.failureMode(t.failure) == FailLocal && t.local != nil:
		*r = t.decideLocally(ctx, p, req, err, op == opTake)
	case err != nil:
		t.degraded(p, req, err, r)
	default:
		r.evaluate(p.compiled, req.Now, req.Cost, out.Allowed, out.States)
	}
	r.Identifier = req.Identifier
	if err != nil || len(t.observers) > 0 {
		t.observe(ctx, name, p, req, r, err, lat)
	} else if t.outages != nil {
		t.outages.success(ctx)
	}
	return nil
}

// neverAllowed answers a request whose cost exceeds a limit's capacity: it
// reads the current state (so the figures are true), changes nothing and
// reports RetryAfter = Never.
func (t *Throttler) neverAllowed(ctx context.Context, p *Policy, req driver.Request) (Result, error) {
	out, lat, err := t.call(ctx, p, req, func(ctx context.Context) (driver.Outcome, error) { return t.peek(ctx, req) })
	if errors.Is(err, ErrNotInitialized) {
		return Result{}, err
	}
	r := evaluated(p.compiled, req.Now, req.Cost, false, out.States)
	if err != nil {
		r.Degraded, r.Err = true, err
	}
	r.Identifier, r.NeverAllowed, r.RetryAfter = req.Identifier, true, Never
	t.observe(ctx, "allow", p, req, &r, err, lat)
	return r, driver.Errorf("%w: cost %d, limit %q holds %d", ErrCostExceedsLimit, req.Cost, r.Binding, r.Limit)
}

// decideLocally decides req on the local fallback store with this
// process's share of p, after the backend failed with err. The result is
// degraded, carries err and says it was decided locally; if the local
// store fails too, the request fails closed.
func (t *Throttler) decideLocally(ctx context.Context, p *Policy, req driver.Request, err error, take bool) Result {
	share := t.share(p)
	local := req
	local.Policy, local.Buffer = share.compiled, nil
	var out driver.Outcome
	var lerr error
	if tk, ok := t.local.(driver.Taker); ok && take {
		out, lerr = tk.Take(context.WithoutCancel(ctx), local)
		req.Cost = max(out.Granted, 1)
	} else {
		out, lerr = t.local.Decide(context.WithoutCancel(ctx), local)
	}
	if lerr != nil || len(out.States) != len(share.compiled.Limits) {
		var r Result
		t.degraded(p, req, err, &r)
		return r
	}
	r := evaluated(share.compiled, req.Now, req.Cost, out.Allowed, out.States)
	r.Policy = p.compiled.Name
	r.Degraded, r.Err, r.Local = true, err, true
	return r
}

// share returns p with every quota divided by the expected number of
// processes, rounded up, built once per policy.
func (t *Throttler) share(p *Policy) *Policy {
	if s, ok := t.shares.Load(p); ok {
		return s.(*Policy)
	}
	limits := p.Limits()
	for i := range limits {
		l := &limits[i]
		l.Max = (l.Max + int64(t.processes) - 1) / int64(t.processes)
		if l.Burst != 0 {
			l.Burst = (l.Burst + int64(t.processes) - 1) / int64(t.processes)
		}
	}
	s, err := NewPolicy(p.compiled.Name, limits)
	if err != nil {
		// A scaled limit of a valid one is valid (every quota stays >= 1);
		// should it not be, the full policy is the safe share.
		s = p
	}
	actual, _ := t.shares.LoadOrStore(p, s)
	return actual.(*Policy)
}

// degraded sets r to the result of a failed backend call from the failure
// mode: the figures of a fresh window after this request (fail open), or a
// denial with nothing remaining (fail closed).
func (t *Throttler) degraded(p *Policy, req driver.Request, err error, r *Result) {
	var inline [inlineLimits]driver.State
	var fresh []driver.State
	if n := len(p.compiled.Limits); n <= inlineLimits {
		fresh = inline[:n]
	} else {
		fresh = make([]driver.State, n)
	}
	driver.Decide(p.compiled, req.Now, req.Cost, fresh)
	r.evaluate(p.compiled, req.Now, req.Cost, true, fresh)
	r.Degraded, r.Err = true, err
	if m := p.failureMode(t.failure); m == FailClosed || m == FailLocal {
		// FailLocal lands here without a local store, or when it failed too.
		r.Allowed, r.Granted = false, 0
		r.RetryAfter = degradedRetryAfter
		r.ResetAt = req.Now.Add(degradedRetryAfter)
		r.Remaining, r.Used = 0, r.Limit
		r.limits.closed = true
	}
}

// call runs one backend call for req under the per-call timeout and checks
// what it returned.
func (t *Throttler) call(ctx context.Context, p *Policy, req driver.Request, f func(context.Context) (driver.Outcome, error)) (driver.Outcome, time.Duration, error) {
	return t.callStates(ctx, p, req, true, f)
}

// callStates is call; wantStates says whether the reply must carry one state
// per limit (every operation but Reset). The latency it returns is measured
// when an observer will read it; otherwise, on the wall clock, a failure's
// latency is read off req.Now, and a success's is not needed.
func (t *Throttler) callStates(ctx context.Context, p *Policy, req driver.Request, wantStates bool, f func(context.Context) (driver.Outcome, error)) (driver.Outcome, time.Duration, error) {
	cancel := func() {}
	if !t.nonblocking {
		ctx, cancel = t.callContext(ctx, p.callTimeout(t.timeout))
	}
	var start time.Time
	measure := len(t.observers) > 0 || !t.wallClock
	if measure {
		start = time.Now()
	}
	out, err := f(ctx)
	cancel()
	var lat time.Duration
	if measure {
		lat = time.Since(start)
	} else if err != nil {
		lat = time.Since(req.Now)
	}
	if err == nil && wantStates && len(out.States) != len(p.compiled.Limits) {
		err = driver.Errorf("%w: %d states for %d limits", driver.ErrBadReply, len(out.States), len(p.compiled.Limits))
	}
	if err != nil {
		return driver.Outcome{}, lat, wrapBackend(err)
	}
	return out, lat, nil
}

// Logger returns the logger t writes to: the one given with WithLogger,
// slog.Default() when none was (or for a nil or zero Throttler), and nil
// when WithLogger(nil) turned logging off. The middleware packages log
// their own errors through it, so that one WithLogger reaches every line a
// throttler's requests cause.
func (t *Throttler) Logger() *slog.Logger {
	switch {
	case t == nil || t.backend == nil:
		return slog.Default()
	case t.outages == nil:
		return nil
	}
	return t.outages.logger
}

// callContext bounds ctx by d, unless d is zero or ctx already ends sooner.
func (t *Throttler) callContext(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return ctx, func() {}
	}
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) <= d {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, d)
}

// observe logs a failure and tells the observers.
func (t *Throttler) observe(ctx context.Context, op string, p *Policy, req driver.Request, r *Result, err error, lat time.Duration) {
	e := Event{Op: op, Policy: p.compiled.Name, Identifier: req.Identifier, Backend: t.name, Err: err, Latency: lat}
	if r != nil {
		e.Result = *r
	}
	t.tell(ctx, e)
}

// tell logs e's failure, or notes its success for the outage log, and
// passes e to the observers.
func (t *Throttler) tell(ctx context.Context, e Event) {
	err := e.Err
	if t.outages != nil {
		if errors.Is(err, ErrBackend) {
			t.outages.failure(ctx, e)
		} else if err == nil {
			t.outages.success(ctx)
		}
	}
	for _, o := range t.observers {
		o.Observe(ctx, e)
	}
}

// backendName names a backend after the last element of its type's
// package path: "redis" for redisbackend, "memory" for memorybackend.
func backendName(b driver.Backend) string {
	t := reflect.TypeOf(b)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	path := t.PkgPath()
	if path == "" {
		return t.String()
	}
	if i := strings.LastIndexByte(path, '/'); i >= 0 {
		path = path[i+1:]
	}
	return path
}

func wrapBackend(err error) error {
	if errors.Is(err, ErrBackend) || errors.Is(err, ErrNotInitialized) {
		return err
	}
	return driver.Errorf("%w: %w", ErrBackend, err)
}
