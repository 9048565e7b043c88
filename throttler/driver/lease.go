package driver

import (
	"context"
	"fmt"
	"time"
)

// Bounds on concurrency limits.
const (
	// MinLeaseTTL is the shortest lease lifetime a concurrency limit may
	// have.
	MinLeaseTTL = time.Millisecond
	// MaxLeaseIDLen is the longest lease ID a backend must accept, in
	// bytes. The throttler's IDs are 32 hex digits.
	MaxLeaseIDLen = 128
)

// ConcurrencyLimit is a limit on the requests one identifier may have in
// flight at once, as a backend reads it. Build it with NewConcurrencyLimit;
// backends treat it as read-only and may cache per-limit work keyed by its
// pointer.
type ConcurrencyLimit struct {
	// Name identifies the limit.
	Name string
	// Max is the most leases one identifier may hold at once.
	Max int64
	// LeaseTTL is how long a lease lives unless it is released or renewed:
	// whole milliseconds.
	LeaseTTL time.Duration
	// TTLMillis is LeaseTTL in milliseconds.
	TTLMillis int64
	// Key is the limit's storage identity: its name escaped with EscapeKey.
	// Max and LeaseTTL are not part of it, so a raised Max applies at once
	// to the leases already held, and every lease keeps the expiry it was
	// given.
	Key string
}

// NewConcurrencyLimit returns the limit of max leases in flight per
// identifier, each living leaseTTL unless released or renewed. max is 1 to
// MaxQuota, leaseTTL MinLeaseTTL to MaxWindow in whole milliseconds, and
// name is not empty. The error wraps ErrInvalidLimit.
func NewConcurrencyLimit(name string, max int64, leaseTTL time.Duration) (*ConcurrencyLimit, error) {
	bad := func(format string, args ...any) (*ConcurrencyLimit, error) {
		return nil, Errorf("%w: concurrency limit %q: %s", ErrInvalidLimit, name, fmt.Sprintf(format, args...))
	}
	switch {
	case name == "":
		return bad("empty name")
	case max < 1 || max > MaxQuota:
		return bad("max %d must be between 1 and %d", max, MaxQuota)
	case leaseTTL < MinLeaseTTL || leaseTTL > MaxWindow:
		return bad("lease TTL %v must be between %v and %v", leaseTTL, MinLeaseTTL, MaxWindow)
	case leaseTTL%time.Millisecond != 0:
		return bad("lease TTL %v must be a whole number of milliseconds", leaseTTL)
	}
	return &ConcurrencyLimit{Name: name, Max: max, LeaseTTL: leaseTTL, TTLMillis: leaseTTL.Milliseconds(),
		Key: EscapeKey(name)}, nil
}

// Valid reports whether l was built by NewConcurrencyLimit (a nil or zero
// ConcurrencyLimit is not).
func (l *ConcurrencyLimit) Valid() bool {
	return l != nil && l.Key != "" && l.Max >= 1 && l.Max <= MaxQuota && l.TTLMillis >= 1 &&
		l.TTLMillis <= MaxWindow.Milliseconds()
}

// LeaseRequest is one lease operation for one identifier, as a backend
// receives it. The throttler has validated every field: Limit is built by
// NewConcurrencyLimit, Identifier is 1 to MaxIdentifierLen bytes, Lease is 1
// to MaxLeaseIDLen bytes, and Now lies between the Unix epoch and
// MaxUnixMilli.
type LeaseRequest struct {
	// Limit is the concurrency limit the lease counts against.
	Limit *ConcurrencyLimit
	// Identifier is what is being limited: arbitrary bytes.
	Identifier string
	// Lease names the lease: an ID the throttler generated (32 random hex
	// digits). Acquiring an ID the identifier already holds renews it.
	Lease string
	// Now is the throttler clock's reading. Backends compare expiries with
	// it and never with a clock of their own.
	Now time.Time
}

// Check reports what makes r unusable by a backend called directly,
// without a throttler: an invalid limit (ErrInvalidLimit), or an empty or
// overlong identifier or lease ID, or a clock reading out of range
// (ErrInvalidOption).
func (r *LeaseRequest) Check() error {
	switch {
	case !r.Limit.Valid():
		return Errorf("%w: nil or zero concurrency limit (build it with NewConcurrencyLimit)", ErrInvalidLimit)
	case r.Identifier == "" || len(r.Identifier) > MaxIdentifierLen:
		return Errorf("%w: identifier of %d bytes", ErrInvalidOption, len(r.Identifier))
	case r.Lease == "" || len(r.Lease) > MaxLeaseIDLen:
		return Errorf("%w: lease ID of %d bytes", ErrInvalidOption, len(r.Lease))
	}
	if !ClockInRange(r.Now) {
		return Errorf("%w: clock reading %v out of range", ErrInvalidOption, r.Now)
	}
	return nil
}

// LeaseOutcome is a backend's answer to a lease operation.
type LeaseOutcome struct {
	// Acquired reports, for Acquire, that the lease is held after the
	// call: newly, or renewed. Release reports false.
	Acquired bool
	// Held reports that the lease was held, unexpired, before the call:
	// for Acquire a renewal, for Release a slot the call freed.
	Held bool
	// InFlight is the number of unexpired leases the identifier holds
	// under the limit after the operation.
	InFlight int64
	// NextExpiry is when the earliest of those leases expires, in Unix
	// milliseconds; 0 when there is none.
	NextExpiry int64
}

// Leaser is implemented by backends that can hold concurrency leases: a
// set of lease IDs per identifier and limit, each with an expiry in Unix
// milliseconds. A lease whose expiry is at or before req.Now counts as
// released, whatever the store still holds. Both operations are atomic per
// identifier and limit, exactly as AcquireLease and ReleaseLease are on
// the stored set, and drop the expired leases they find.
//
// Any stored expiry of the set itself is garbage collection only: it
// outlives the latest lease's expiry by a grace, as fixed windows do.
//
// Fallback: without Leaser, the throttler's Acquire returns an error
// wrapping errors.ErrUnsupported. A decorator that implements Leaser over a
// backend that does not returns such an error from both methods.
type Leaser interface {
	// Acquire takes a slot for req.Lease if the identifier holds fewer
	// than Max unexpired leases, or renews req.Lease if it already holds
	// it (a renewal is never refused and never counts twice). The lease
	// expires at max(its expiry, Now + LeaseTTL).
	Acquire(ctx context.Context, req LeaseRequest) (LeaseOutcome, error)
	// Release frees req.Lease. Releasing a lease that is not held (never
	// acquired, released already, expired) changes nothing else and is not
	// an error.
	Release(ctx context.Context, req LeaseRequest) (LeaseOutcome, error)
}

// AcquireLease applies an acquisition of lease at now to one identifier's
// leases (lease ID to expiry in Unix ms) under l, in place, and returns
// the outcome. It is the reference implementation of Leaser.Acquire:
// backends call it under a lock of their own or mirror it (the Redis
// script does):
//
//	drop every lease with expiry <= now
//	held     = lease is in the set
//	acquired = held || len(set) < Max
//	acquired: set[lease] = max(set[lease], now + TTL)
//
// It costs one pass over the set.
func AcquireLease(l *ConcurrencyLimit, leases map[string]int64, lease string, now time.Time) LeaseOutcome {
	nowMs := now.UnixMilli()
	dropExpired(leases, nowMs)
	old, held := leases[lease]
	out := LeaseOutcome{Held: held}
	if held || int64(len(leases)) < l.Max {
		out.Acquired = true
		leases[lease] = max(old, nowMs+l.TTLMillis)
	}
	out.InFlight, out.NextExpiry = int64(len(leases)), earliest(leases)
	return out
}

// ReleaseLease applies a release of lease at now to one identifier's
// leases under l, in place, and returns the outcome. It is the reference
// implementation of Leaser.Release:
//
//	drop every lease with expiry <= now
//	held = lease is in the set
//	delete set[lease]
func ReleaseLease(l *ConcurrencyLimit, leases map[string]int64, lease string, now time.Time) LeaseOutcome {
	dropExpired(leases, now.UnixMilli())
	_, held := leases[lease]
	delete(leases, lease)
	return LeaseOutcome{Held: held, InFlight: int64(len(leases)), NextExpiry: earliest(leases)}
}

func dropExpired(leases map[string]int64, nowMs int64) {
	for id, exp := range leases {
		if exp <= nowMs {
			delete(leases, id)
		}
	}
}

func earliest(leases map[string]int64) int64 {
	var first int64
	for _, exp := range leases {
		if first == 0 || exp < first {
			first = exp
		}
	}
	return first
}
