package throttler

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// ConcurrencyLimit bounds how many requests one identifier may have in
// flight at once: Throttler.Acquire takes a lease, Lease.Release gives it
// back, and a lease nobody releases (its process crashed) expires after
// the limit's lease TTL, so no slot leaks for longer. Build it with
// NewConcurrencyLimit; it is immutable and safe for concurrent use.
//
// Stored leases are keyed by the limit's name and the identifier, so a
// limit redefined under the same name with another Max applies at once to
// the leases already held, and every lease keeps the expiry it was given.
type ConcurrencyLimit struct {
	compiled *driver.ConcurrencyLimit
	over     settings // WithCallTimeout and WithFailureMode, when given
}

// NewConcurrencyLimit returns a limit of max leases in flight per
// identifier, each expiring leaseTTL after it was acquired or last renewed
// unless released before. max is 1 to 2^40; leaseTTL is 1 ms to 400 days,
// whole milliseconds: make it longer than the slowest request you serve,
// or renew leases that live longer (Lease.Renew). opts may hold
// WithCallTimeout and WithFailureMode, which override the throttler's. The
// error wraps ErrInvalidLimit or ErrInvalidOption.
func NewConcurrencyLimit(name string, max int64, leaseTTL time.Duration, opts ...Option) (*ConcurrencyLimit, error) {
	c, err := driver.NewConcurrencyLimit(name, max, leaseTTL)
	if err != nil {
		return nil, err
	}
	l := &ConcurrencyLimit{compiled: c, over: settings{forPolicy: true}}
	if err := applyOptions(&l.over, opts); err != nil {
		return nil, driver.Errorf("concurrency limit %q: %w", name, err)
	}
	return l, nil
}

// Name returns the limit's name; "" for a nil or zero ConcurrencyLimit.
func (l *ConcurrencyLimit) Name() string {
	if l.validate() != nil {
		return ""
	}
	return l.compiled.Name
}

// Max returns the most leases one identifier may hold at once; 0 for a nil
// or zero ConcurrencyLimit.
func (l *ConcurrencyLimit) Max() int64 {
	if l.validate() != nil {
		return 0
	}
	return l.compiled.Max
}

// LeaseTTL returns how long a lease lives unless released or renewed; 0
// for a nil or zero ConcurrencyLimit.
func (l *ConcurrencyLimit) LeaseTTL() time.Duration {
	if l.validate() != nil {
		return 0
	}
	return l.compiled.LeaseTTL
}

func (l *ConcurrencyLimit) validate() error {
	if l == nil || !l.compiled.Valid() {
		return driver.Errorf("%w: nil or zero concurrency limit (build it with NewConcurrencyLimit)", ErrInvalidLimit)
	}
	return nil
}

func (l *ConcurrencyLimit) failureMode(def FailureMode) FailureMode {
	if l.over.failureSet {
		return l.over.failure
	}
	return def
}

func (l *ConcurrencyLimit) callTimeout(def time.Duration) time.Duration {
	if l.over.timeoutSet {
		return l.over.timeout
	}
	return def
}

// Lease is the answer of Throttler.Acquire: a slot of a ConcurrencyLimit
// held for one request, or the refusal of one. Release it when the request
// ends, whatever happened (defer lease.Release(ctx)); releasing a refused
// lease does nothing.
//
// The exported fields are set by Acquire; Renew updates InFlight and
// ExpiresAt, so read them on the goroutine that renews. Release and Renew
// are safe for concurrent use.
type Lease struct {
	// Acquired reports whether the request may proceed. A refusal is not an
	// error.
	Acquired bool
	// ID names the lease in the store: 32 random hex digits.
	ID string
	// Limit is the limit's Max (this process's share of it for a lease
	// taken by FailLocal).
	Limit int64
	// InFlight is how many leases the identifier held under the limit
	// after this acquisition, this one included when it was acquired.
	InFlight int64
	// RetryAfter is 0 when acquired. When refused, it is how long until the
	// earliest lease held expires: an upper bound, since a release may free
	// a slot sooner.
	RetryAfter time.Duration
	// ExpiresAt is when the lease expires unless released or renewed; the
	// zero time when refused.
	ExpiresAt time.Time
	// At is the clock reading of the acquisition.
	At time.Time
	// Name and Identifier name the limit and what it limits.
	Name, Identifier string
	// Degraded reports that the backend failed and the failure mode
	// decided instead; Err holds the failure (it wraps ErrBackend). Fail
	// open acquires with InFlight 1, fail closed refuses with InFlight =
	// Limit and a RetryAfter of one second.
	Degraded bool
	// Err is the backend failure behind a degraded lease, or nil.
	Err error
	// Local reports a degraded lease that FailLocal took in process, on
	// this process's share of the limit (WithLocalFallback).
	Local bool

	t     *Throttler
	limit *ConcurrencyLimit
	// local is the share the local store counted the lease against.
	local *driver.ConcurrencyLimit

	mu       sync.Mutex
	released bool
	// inStore: the store may hold the lease (it acquired it, or the call
	// failed after the store may have applied it); inLocal: the local
	// fallback store holds it.
	inStore, inLocal bool
}

// Acquire takes a lease of l for identifier id, at the throttler clock's
// now: acquired while id holds fewer than l's Max unexpired leases, refused
// otherwise. The lease expires after l's LeaseTTL unless released or
// renewed; an expired lease counts as released, so a process that crashed
// holds its slots for at most the TTL.
//
// A refusal is not an error: lease.Acquired is false, with InFlight and a
// RetryAfter until the earliest expiry. err is non-nil only for invalid
// input (ErrInvalidLimit, ErrInvalidIdentifier, ErrNotInitialized,
// ErrClockOutOfRange), for a backend without concurrency leases (an error
// wrapping errors.ErrUnsupported that names it: memcached is one), or when
// ctx itself is done; a lease interrupted that way may stay held in the
// store until its TTL. A backend failure is not an error either: the
// failure mode decides as it does for AllowN (fail open acquires, fail
// closed refuses, FailLocal acquires on the local store with this process's
// share of Max), lease.Degraded is set, lease.Err holds the failure and the
// observers are told (Event.Op "acquire").
func (t *Throttler) Acquire(ctx context.Context, l *ConcurrencyLimit, id string) (*Lease, error) {
	lr, err := t.leaser(l, id)
	if err != nil {
		return nil, err
	}
	now, err := t.now()
	if err != nil {
		return nil, err
	}
	req := driver.LeaseRequest{Limit: l.compiled, Identifier: id, Lease: newLeaseID(), Now: now}
	out, lat, err := t.leaseCall(ctx, l, req, lr.Acquire)
	if err != nil && (ctx.Err() != nil || errors.Is(err, ErrNotInitialized) || errors.Is(err, errors.ErrUnsupported)) {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	lease := &Lease{ID: req.Lease, Limit: l.compiled.Max, At: now, Name: l.compiled.Name, Identifier: id, t: t, limit: l}
	if err != nil {
		t.degradedLease(ctx, lease, req, err)
	} else {
		lease.Acquired, lease.inStore = out.Acquired, out.Acquired
		lease.RetryAfter = lease.acquired(out, now, l.compiled)
	}
	if len(t.observers) > 0 || t.outages != nil {
		r := lease.result()
		t.observeLease(ctx, "acquire", req, &r, err, lat)
	}
	return lease, nil
}

// leaser checks the input of Acquire and returns the backend's Leaser.
func (t *Throttler) leaser(l *ConcurrencyLimit, id string) (driver.Leaser, error) {
	if t == nil || t.backend == nil {
		return nil, driver.Errorf("%w: zero Throttler (build it with New)", ErrNotInitialized)
	}
	if err := l.validate(); err != nil {
		return nil, err
	}
	if t.local == nil && l.over.failureSet && l.over.failure == FailLocal {
		return nil, errLocalWithoutFallback(fmt.Sprintf("concurrency limit %q", l.Name()))
	}
	if len(id) == 0 || len(id) > driver.MaxIdentifierLen {
		return nil, driver.Errorf("%w: length %d, want 1 to %d bytes", ErrInvalidIdentifier, len(id), driver.MaxIdentifierLen)
	}
	lr, ok := t.backend.(driver.Leaser)
	if !ok {
		return nil, driver.Errorf("%w: the %s backend (%T) has no concurrency limits (it does not implement driver.Leaser)",
			errors.ErrUnsupported, t.name, t.backend)
	}
	return lr, nil
}

// newLeaseID returns 16 random bytes in hex. crypto/rand.Read never fails
// (it crashes the program when the system has no randomness to give).
func newLeaseID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// acquired sets InFlight and ExpiresAt from an answered acquisition or
// renewal at now under limit c, and returns the wait a refusal reports:
// until the earliest lease expires.
func (l *Lease) acquired(out driver.LeaseOutcome, now time.Time, c *driver.ConcurrencyLimit) time.Duration {
	nowMs := now.UnixMilli()
	l.InFlight = out.InFlight
	if out.Acquired {
		if exp := time.UnixMilli(nowMs + c.TTLMillis).In(now.Location()); exp.After(l.ExpiresAt) {
			l.ExpiresAt = exp
		}
		return 0
	}
	if wait := time.Duration(out.NextExpiry-nowMs) * time.Millisecond; wait > 0 {
		return wait
	}
	// A store that raced: never tell a client to retry at once in a loop.
	return time.Millisecond
}

// degradedLease decides an acquisition whose backend call failed with err
// by the failure mode.
func (t *Throttler) degradedLease(ctx context.Context, lease *Lease, req driver.LeaseRequest, err error) {
	lease.Degraded, lease.Err = true, err
	// The store may have applied the acquisition before the call failed
	// (a timeout), so Release tells it too.
	lease.inStore = true
	mode := lease.limit.failureMode(t.failure)
	if ll, ok := t.local.(driver.Leaser); ok && mode == FailLocal {
		share := t.leaseShare(lease.limit)
		local := req
		local.Limit = share
		out, lerr := ll.Acquire(context.WithoutCancel(ctx), local)
		if lerr == nil {
			lease.Local, lease.local, lease.Limit = true, share, share.Max
			lease.Acquired, lease.inLocal = out.Acquired, out.Acquired
			lease.RetryAfter = lease.acquired(out, req.Now, share)
			return
		}
	}
	nowMs := req.Now.UnixMilli()
	if mode == FailOpen {
		lease.Acquired, lease.InFlight = true, 1
		lease.ExpiresAt = time.UnixMilli(nowMs + req.Limit.TTLMillis).In(req.Now.Location())
		return
	}
	// FailClosed, and FailLocal without a local store that holds leases or
	// when it failed too.
	lease.InFlight, lease.RetryAfter = lease.Limit, degradedRetryAfter
}

// leaseShare returns l with Max divided by the expected number of
// processes, rounded up, built once per limit.
func (t *Throttler) leaseShare(l *ConcurrencyLimit) *driver.ConcurrencyLimit {
	if s, ok := t.shares.Load(l); ok {
		return s.(*driver.ConcurrencyLimit)
	}
	c := *l.compiled
	c.Max = (c.Max + int64(t.processes) - 1) / int64(t.processes)
	actual, _ := t.shares.LoadOrStore(l, &c)
	return actual.(*driver.ConcurrencyLimit)
}

// Release gives the lease back, so that another request of its identifier
// may take the slot; the store's answer is observed as Event.Op "release".
// It is idempotent: a second Release, and the Release of a refused lease,
// do nothing and return nil. It runs even when ctx is done (the slot is
// owed all the same), keeping ctx's values, bounded by the call timeout.
//
// A backend failure is returned as an error wrapping ErrBackend; the lease
// then stays held in the store until it expires (ExpiresAt), which is what
// the TTL is for. A degraded lease is released in the store too, since the
// failed call may have reached it.
func (l *Lease) Release(ctx context.Context) error {
	if l == nil || l.t == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return nil
	}
	l.released = true
	if !l.inStore && !l.inLocal {
		return nil
	}
	t := l.t
	now, err := t.now()
	if err != nil {
		return err
	}
	ctx = l.releaseContext(ctx)
	req := driver.LeaseRequest{Limit: l.limit.compiled, Identifier: l.Identifier, Lease: l.ID, Now: now}
	if l.inLocal {
		local := req
		local.Limit = l.local
		// The local store is in process; its answer matters to nobody else.
		_, _ = t.local.(driver.Leaser).Release(ctx, local)
	}
	if !l.inStore {
		return nil
	}
	lr, ok := t.backend.(driver.Leaser)
	if !ok {
		return nil // the lease came from the local store alone
	}
	_, lat, err := t.leaseCall(ctx, l.limit, req, lr.Release)
	t.observeLease(ctx, "release", req, nil, err, lat)
	return err
}

// releaseContext is ctx without its cancellation, unless the throttler has
// no call timeout to bound a call by, or ctx is live and the backend never
// blocks (the call ends before ctx could).
func (l *Lease) releaseContext(ctx context.Context) context.Context {
	if l.t.nonblocking && ctx.Err() == nil || l.limit.callTimeout(l.t.timeout) <= 0 {
		return ctx
	}
	return context.WithoutCancel(ctx)
}

// Renew extends a held lease to expire the limit's LeaseTTL from now (never
// earlier than it already would), for a request that runs longer than the
// TTL. It reports whether the lease is held after the call: false for a
// lease that was refused or released, and for one that had expired while
// every slot was taken by others (its request then runs unaccounted). An
// expired lease with a slot free is taken again. Renewing never counts a
// lease twice. The store's answer is observed as Event.Op "renew".
//
// A backend failure is returned as an error wrapping ErrBackend and leaves
// the lease as it was; it still expires at ExpiresAt.
func (l *Lease) Renew(ctx context.Context) (bool, error) {
	if l == nil || l.t == nil {
		return false, nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released || !l.Acquired {
		return false, nil
	}
	t := l.t
	now, err := t.now()
	if err != nil {
		return false, err
	}
	req := driver.LeaseRequest{Limit: l.limit.compiled, Identifier: l.Identifier, Lease: l.ID, Now: now}
	if l.Local {
		req.Limit = l.local
		out, err := t.local.(driver.Leaser).Acquire(context.WithoutCancel(ctx), req)
		if err != nil {
			return false, wrapBackend(err)
		}
		l.inLocal = out.Acquired
		l.acquired(out, now, req.Limit)
		return out.Acquired, nil
	}
	lr, ok := t.backend.(driver.Leaser)
	if !ok {
		return false, driver.Errorf("%w: the %s backend has no concurrency limits", errors.ErrUnsupported, t.name)
	}
	out, lat, err := t.leaseCall(ctx, l.limit, req, lr.Acquire)
	if err != nil {
		t.observeLease(ctx, "renew", req, nil, err, lat)
		return false, err
	}
	l.inStore = out.Acquired
	wait := l.acquired(out, now, req.Limit)
	if len(t.observers) > 0 || t.outages != nil {
		r := l.result()
		r.Allowed, r.At, r.RetryAfter, r.ResetAt = out.Acquired, now, wait, l.ExpiresAt
		if !out.Acquired {
			r.ResetAt = now.Add(wait)
		}
		t.observeLease(ctx, "renew", req, &r, nil, lat)
	}
	return out.Acquired, nil
}

// leaseCall runs one lease operation for req under the per-call timeout
// and checks what it returned. An errors.ErrUnsupported error is returned
// as it is; every other failure wraps ErrBackend.
func (t *Throttler) leaseCall(ctx context.Context, l *ConcurrencyLimit, req driver.LeaseRequest,
	f func(context.Context, driver.LeaseRequest) (driver.LeaseOutcome, error)) (driver.LeaseOutcome, time.Duration, error) {
	cancel := func() {}
	if !t.nonblocking {
		ctx, cancel = t.callContext(ctx, l.callTimeout(t.timeout))
	}
	var start time.Time
	measure := len(t.observers) > 0 || !t.wallClock
	if measure {
		start = time.Now()
	}
	out, err := f(ctx, req)
	cancel()
	var lat time.Duration
	if measure {
		lat = time.Since(start)
	} else if err != nil {
		lat = time.Since(req.Now)
	}
	if err == nil && (out.InFlight < 0 || out.Acquired && out.InFlight < 1 || out.NextExpiry < 0) {
		err = driver.Errorf("%w: lease outcome %+v", driver.ErrBadReply, out)
	}
	if err != nil {
		if errors.Is(err, errors.ErrUnsupported) {
			return driver.LeaseOutcome{}, lat, err
		}
		return driver.LeaseOutcome{}, lat, wrapBackend(err)
	}
	return out, lat, nil
}

// observeLease logs a failure and tells the observers about a lease
// operation for req, whose figures r holds (nil for a release, and when
// the operation failed).
func (t *Throttler) observeLease(ctx context.Context, op string, req driver.LeaseRequest, r *Result, err error, lat time.Duration) {
	if len(t.observers) == 0 && t.outages == nil {
		return
	}
	e := Event{Op: op, Policy: req.Limit.Name, Identifier: req.Identifier, Backend: t.name, Err: err, Latency: lat}
	if r != nil {
		e.Result = *r
	}
	t.tell(ctx, e)
}

// result is the lease as a Result, for observers: Allowed is Acquired,
// Used is InFlight, Window is the lease TTL, and ResetAt is ExpiresAt or,
// when refused, the moment the earliest lease expires.
func (l *Lease) result() Result {
	r := Result{Allowed: l.Acquired, Limit: l.Limit, Used: min(l.InFlight, l.Limit),
		Remaining: max(l.Limit-l.InFlight, 0), RetryAfter: l.RetryAfter, Binding: l.Name,
		Window: l.limit.compiled.LeaseTTL, Policy: l.Name, Identifier: l.Identifier, At: l.At,
		Degraded: l.Degraded, Err: l.Err, Local: l.Local, ResetAt: l.ExpiresAt}
	if !l.Acquired {
		r.ResetAt = l.At.Add(l.RetryAfter)
	}
	return r
}
