package middleware

import (
	"context"
	"fmt"
	"net/http"
	"strconv"

	"github.com/throttlekit/throttlekit/throttler"
)

// TypeConcurrencyExceeded marks a request refused because its identifier
// already has as many requests in flight as a concurrency limit allows
// (WithConcurrency). Retry-After says when the earliest of them expires at
// the latest; one may end sooner.
const TypeConcurrencyExceeded = "https://pkg.go.dev/github.com/throttlekit/throttlekit/middleware#hdr-Concurrency_limits"

// concurrencyRule is one WithConcurrency.
type concurrencyRule struct {
	limit    *throttler.ConcurrencyLimit
	identify IdentifierFunc
}

// WithConcurrency holds a lease of limit for the duration of every request
// that identify names (an empty name skips it): the lease is acquired
// after the rate limits allowed the request and before the wrapped handler
// runs, and released when the handler returns, panics included. A request
// whose identifier already holds limit's Max leases is refused with 429
// (WithDenyStatus), a Retry-After and a problem of type
// TypeConcurrencyExceeded, and the units its rate limits charged are given
// back. The option may be given several times, with limits of distinct
// names (per client IP and per user, say), and a Limiter may have
// concurrency limits and no Rule.
//
// The backend must hold leases (memory, Redis; not memcached): otherwise
// every request goes to the ErrorHandler with an error wrapping
// errors.ErrUnsupported. The handler can read its leases with
// LeasesFromContext, to Renew them during a request that outlives the
// limit's lease TTL.
func WithConcurrency(limit *throttler.ConcurrencyLimit, identify IdentifierFunc) Option {
	return set(func(l *Limiter) {
		l.concurrency = append(l.concurrency, concurrencyRule{limit: limit, identify: identify})
	})
}

type leasesKey struct{}

// LeasesFromContext returns the leases a Limiter holds for the request, in
// the order of its WithConcurrency options, when any applied.
func LeasesFromContext(ctx context.Context) ([]*throttler.Lease, bool) {
	leases, ok := ctx.Value(leasesKey{}).([]*throttler.Lease)
	return leases, ok && len(leases) > 0
}

// checkConcurrency validates the WithConcurrency options.
func (l *Limiter) checkConcurrency() error {
	names := make(map[string]bool, len(l.concurrency))
	for i, c := range l.concurrency {
		if c.limit == nil || c.limit.Name() == "" {
			return fmt.Errorf("concurrency limit %d is nil", i)
		}
		if c.identify == nil {
			return fmt.Errorf("concurrency limit %q has no IdentifierFunc", c.limit.Name())
		}
		if names[c.limit.Name()] {
			return fmt.Errorf("two concurrency limits are named %q; give each its own", c.limit.Name())
		}
		names[c.limit.Name()] = true
	}
	return nil
}

// acquireLeases takes a lease of every concurrency limit that applies to
// r. When one is refused or fails, it releases those already taken, gives
// back the rate units the request spent (undo), answers the request and
// reports ok false; serve then says whether the ErrorHandler asked for the
// request to be served anyway, without leases.
func (l *Limiter) acquireLeases(w http.ResponseWriter, r *http.Request, undo func()) (leases []*throttler.Lease, ok, serve bool) {
	abandon := func() {
		releaseLeases(r, leases)
		undo()
	}
	for _, c := range l.concurrency {
		id := c.identify(r)
		if id == "" {
			continue
		}
		lease, err := l.throttler.Acquire(r.Context(), c.limit, id)
		if err != nil {
			abandon()
			return nil, false, l.fail(w, r, err)
		}
		leases = append(leases, lease)
		if !lease.Acquired {
			abandon()
			res := leaseResult(lease, c.limit)
			if !l.headers.OmitRetryAfter {
				w.Header().Set(HeaderRetryAfter, strconv.FormatInt(max(ceilSeconds(lease.RetryAfter), 1), 10))
			}
			if lease.Degraded && !l.headers.OmitDegraded {
				w.Header().Set(HeaderDegraded, "1")
			}
			l.onDeny(w, r, res, l.concurrencyProblem(lease))
			return nil, false, false
		}
	}
	if !l.headers.OmitDegraded {
		for _, lease := range leases {
			if lease.Degraded {
				w.Header().Set(HeaderDegraded, "1")
			}
		}
	}
	return leases, true, false
}

// releaseLeases releases every lease, even when the client has gone: the
// slots are owed all the same. A failure reaches the throttler's observer
// and leaves the lease to its TTL.
func releaseLeases(r *http.Request, leases []*throttler.Lease) {
	ctx := context.WithoutCancel(r.Context())
	for _, lease := range leases {
		_ = lease.Release(ctx)
	}
}

// concurrencyProblem builds the body of a concurrency refusal. Like every
// problem it names the limit, never the identifier.
func (l *Limiter) concurrencyProblem(lease *throttler.Lease) Problem {
	secs := max(ceilSeconds(lease.RetryAfter), 1)
	if lease.Degraded {
		return Problem{Type: TypeTemporaryReducedCapacity, Title: "Temporary Reduced Capacity",
			Status: l.degradedStatus,
			Detail: fmt.Sprintf("The rate limiter is unavailable; try again in %d s.", secs)}
	}
	return Problem{Type: TypeConcurrencyExceeded, Title: "Too Many Concurrent Requests", Status: l.denyStatus,
		Detail: fmt.Sprintf("Concurrency limit %q allows %d requests in flight at once; try again in at most %d s.",
			lease.Name, lease.Limit, secs)}
}

// leaseResult describes a refused lease as a Result, for a DenyHandler:
// Limit is the limit's Max, Used the leases in flight, RetryAfter the wait
// until the earliest expires, and Window the lease TTL.
func leaseResult(lease *throttler.Lease, c *throttler.ConcurrencyLimit) throttler.Result {
	return throttler.Result{Allowed: lease.Acquired, Limit: lease.Limit, Used: min(lease.InFlight, lease.Limit),
		Remaining: max(lease.Limit-lease.InFlight, 0), ResetAt: lease.At.Add(lease.RetryAfter),
		RetryAfter: lease.RetryAfter, Binding: lease.Name, Window: c.LeaseTTL(), Policy: lease.Name,
		Identifier: lease.Identifier, At: lease.At, Degraded: lease.Degraded, Err: lease.Err, Local: lease.Local}
}
