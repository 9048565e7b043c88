package throttler

import (
	"time"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// Never is the RetryAfter of a request that can never be allowed.
const Never = driver.Never

// Result is the outcome of a decision for one identifier. Its top-level
// fields describe the binding limit: on allow, the limit with the smallest
// Remaining (ties: the latest ResetAt); on deny, the denying limit with the
// largest RetryAfter. Limits holds every limit's own figures.
type Result struct {
	// Allowed reports whether the request may proceed.
	Allowed bool
	// Limit is the binding limit's quota: Max, or Burst for GCRA.
	Limit int64
	// Remaining is how many units are left, after this decision, in the
	// binding limit: Limit - Used, never negative.
	Remaining int64
	// Used is how many units of the binding limit are spent.
	Used int64
	// ResetAt is when the binding limit is whole again: the stored window
	// end for fixed windows, identical for every result of that window; the
	// moment the bucket is full again for GCRA.
	ResetAt time.Time
	// RetryAfter is 0 when allowed; when denied, how long until the same
	// request could be allowed; Never when it can never be.
	RetryAfter time.Duration
	// Binding is the name of the binding limit.
	Binding string
	// Window is the binding limit's window.
	Window time.Duration
	// Limits holds each limit's figures, in the policy's order.
	Limits []LimitResult
	// Policy and Identifier name what was decided.
	Policy, Identifier string
	// At is the clock reading the decision was made at; ResetAt - At is how
	// long the binding limit takes to be whole again.
	At time.Time
	// NeverAllowed reports a cost above some limit's capacity: denied, and
	// no amount of waiting changes that (RetryAfter is Never).
	NeverAllowed bool
	// Degraded reports that the backend failed and the failure mode decided
	// instead; Err holds the failure (it wraps ErrBackend). A degraded
	// result's counts are the failure mode's, not the store's.
	Degraded bool
	// Err is the backend failure behind a degraded result, or nil.
	Err error
	// Cached reports a denial answered from the throttler's deny cache
	// (WithDenyCache) without a backend call.
	Cached bool
	// Local reports a degraded result that FailLocal decided in process,
	// on this process's share of the policy (WithLocalFallback).
	Local bool
	// Subjects holds the result for each subject of Throttler.AllowAll, in
	// the order given; it is nil otherwise.
	Subjects []Result
	// Granted is the number of units the decision charged: the cost when
	// allowed, 0 when denied; for AllowUpTo, the k it granted.
	Granted int64
}

// LimitResult is one limit's part of a Result.
type LimitResult struct {
	// Name is the limit's name in its policy.
	Name string
	// Algorithm and Window describe the limit.
	Algorithm Algorithm
	Window    time.Duration
	// Allowed reports whether this limit alone allows the request.
	Allowed bool
	// Limit, Remaining, Used, ResetAt and RetryAfter are as in Result, for
	// this limit alone.
	Limit      int64
	Remaining  int64
	Used       int64
	ResetAt    time.Time
	RetryAfter time.Duration
}

// evaluate turns the states a backend returned into a Result, whose
// per-limit figures go to out when it has room for them.
func evaluate(p *Policy, now time.Time, cost int64, allowed bool, states []driver.State, out []LimitResult) Result {
	limits := p.compiled.Limits
	if len(out) != len(limits) {
		out = make([]LimitResult, len(limits))
	}
	r := Result{Allowed: allowed, Policy: p.compiled.Name, At: now, Limits: out}
	if allowed {
		r.Granted = cost
	}
	for i := range limits {
		var s driver.State
		if i < len(states) {
			s = states[i]
		}
		l := &limits[i]
		st := driver.Evaluate(l, s, now, cost, allowed)
		r.Limits[i] = LimitResult{Name: l.Name, Algorithm: l.Algorithm, Window: l.Window, Allowed: st.Allowed,
			Limit: st.Limit, Remaining: st.Remaining, Used: st.Used, ResetAt: st.ResetAt, RetryAfter: st.RetryAfter}
	}
	r.setBinding(pickBinding(r.Limits, allowed))
	return r
}

// pickBinding returns the index of the binding limit.
func pickBinding(ls []LimitResult, allowed bool) int {
	best := -1
	if !allowed {
		for i := range ls {
			if !ls[i].Allowed && (best < 0 || ls[i].RetryAfter > ls[best].RetryAfter) {
				best = i
			}
		}
		if best >= 0 {
			return best
		}
		// A backend denied although no single limit would (a racing
		// non-atomic store): report the tightest limit.
	}
	for i := range ls {
		if best < 0 || ls[i].Remaining < ls[best].Remaining ||
			ls[i].Remaining == ls[best].Remaining && ls[i].ResetAt.After(ls[best].ResetAt) {
			best = i
		}
	}
	return best
}

func (r *Result) setBinding(i int) {
	b := r.Limits[i]
	r.Binding, r.Window = b.Name, b.Window
	r.Limit, r.Remaining, r.Used, r.ResetAt = b.Limit, b.Remaining, b.Used, b.ResetAt
	r.RetryAfter = 0
	if !r.Allowed {
		r.RetryAfter = b.RetryAfter
		if r.RetryAfter <= 0 {
			// Denied by a store that raced: never tell a client to retry at
			// once in a loop.
			r.RetryAfter = time.Millisecond
		}
	}
}
