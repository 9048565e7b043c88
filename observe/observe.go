package observe

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"syscall"

	"github.com/throttlekit/throttlekit/backend/breaker"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// The outcomes of a decision, as Outcome names them.
const (
	// Allowed: the store allowed the request.
	Allowed = "allowed"
	// Denied: the store denied it.
	Denied = "denied"
	// Cached: the throttler's deny cache denied it without a backend call.
	Cached = "cached"
	// DegradedAllowed and DegradedDenied: the backend failed and the
	// failure mode decided (fail open allows, fail closed denies).
	DegradedAllowed = "degraded_allowed"
	DegradedDenied  = "degraded_denied"
	// LocalAllowed and LocalDenied: the backend failed and FailLocal
	// decided on this process's share of the policy.
	LocalAllowed = "local_allowed"
	LocalDenied  = "local_denied"
)

// Outcomes lists every outcome, in a fixed order.
var Outcomes = []string{Allowed, Denied, Cached, DegradedAllowed, DegradedDenied, LocalAllowed, LocalDenied}

// Outcome names the outcome of a decision.
func Outcome(r *throttler.Result) string {
	switch {
	case r.Cached:
		return Cached
	case r.Local && r.Allowed:
		return LocalAllowed
	case r.Local:
		return LocalDenied
	case r.Degraded && r.Allowed:
		return DegradedAllowed
	case r.Degraded:
		return DegradedDenied
	case r.Allowed:
		return Allowed
	}
	return Denied
}

// The kinds of backend error, as ErrorKind names them.
const (
	// KindTimeout: the call ran out of time (the per-call timeout or a
	// network deadline).
	KindTimeout = "timeout"
	// KindCanceled: the caller's context was canceled.
	KindCanceled = "canceled"
	// KindBreakerOpen: a circuit breaker answered without calling the
	// server.
	KindBreakerOpen = "breaker_open"
	// KindUnreachable: the connection failed (refused, reset, closed).
	KindUnreachable = "unreachable"
	// KindBadReply: the store answered something the backend could not
	// read.
	KindBadReply = "bad_reply"
	// KindClosed: the backend was closed.
	KindClosed = "closed"
	// KindOther: anything else, such as an error reply from the store.
	KindOther = "other"
)

// ErrorKinds lists every error kind, in a fixed order.
var ErrorKinds = []string{KindTimeout, KindCanceled, KindBreakerOpen, KindUnreachable, KindBadReply, KindClosed, KindOther}

// ErrorKind classifies a backend error; it returns "" for nil.
func ErrorKind(err error) string {
	if err == nil {
		return ""
	}
	switch {
	case errors.Is(err, breaker.ErrOpen):
		return KindBreakerOpen
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded), timedOut(err):
		return KindTimeout
	case errors.Is(err, context.Canceled):
		return KindCanceled
	case errors.Is(err, driver.ErrClosed):
		return KindClosed
	case errors.Is(err, driver.ErrBadReply):
		return KindBadReply
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.EPIPE), errors.Is(err, net.ErrClosed), netOp(err),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return KindUnreachable
	}
	return KindOther
}

// timedOut reports whether an error in err's chain says it timed out (a
// net.Error's Timeout). It walks the chain itself, as errors.As would, so
// that classifying costs no allocation.
func timedOut(err error) bool {
	return walk(err, func(e error) bool {
		t, ok := e.(interface{ Timeout() bool })
		return ok && t.Timeout()
	})
}

// netOp reports whether err's chain holds a *net.OpError: a failed dial,
// read or write.
func netOp(err error) bool {
	return walk(err, func(e error) bool {
		_, ok := e.(*net.OpError)
		return ok
	})
}

// walk reports whether f holds for err or any error it wraps, depth first
// as errors.Is visits them.
func walk(err error, f func(error) bool) bool {
	for err != nil {
		if f(err) {
			return true
		}
		switch u := err.(type) {
		case interface{ Unwrap() error }:
			err = u.Unwrap()
		case interface{ Unwrap() []error }:
			for _, e := range u.Unwrap() {
				if walk(e, f) {
					return true
				}
			}
			return false
		default:
			return false
		}
	}
	return false
}

// NearLimit reports whether an allowed decision left its binding limit
// with less than fraction of its quota (Remaining < fraction × Limit): the
// identifier is about to be limited. A denial is not near the limit; it is
// over it.
func NearLimit(r *throttler.Result, fraction float64) bool {
	return r.Allowed && !r.Degraded && r.Limit > 0 && float64(r.Remaining) < fraction*float64(r.Limit)
}
