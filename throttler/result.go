package throttler

import "time"

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
	// NeverAllowed reports a cost above some limit's capacity: denied, and
	// no amount of waiting changes that (RetryAfter is Never).
	NeverAllowed bool
	// Degraded reports that the backend failed and the policy's failure mode
	// decided instead; Err holds the failure (it wraps ErrBackend).
	Degraded bool
	// Err is the backend failure behind a degraded result, or nil.
	Err error
	// Subjects holds the result for each subject of Throttler.AllowAll, in
	// the order given; it is nil otherwise.
	Subjects []Result
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

// Evaluate turns the states a backend returned for a decision into a Result.
// states are the states after the decision (a denial leaves them as they
// were), one per limit of p; allowed is the backend's verdict. Closed windows
// are treated as absent here too, so a stale replica or an unevicted item can
// never show old counts. Evaluate is what the Throttler does with every
// backend outcome; backends need not call it.
func Evaluate(p *Policy, now time.Time, cost int64, allowed bool, states []State) Result {
	nowMs, nowUs := now.UnixMilli(), now.UnixMicro()
	r := Result{Allowed: allowed, Policy: p.name, Limits: make([]LimitResult, len(p.limits))}
	for i := range p.limits {
		var s State
		if i < len(states) {
			s = states[i]
		}
		r.Limits[i] = evaluateLimit(&p.limits[i], s, nowMs, nowUs, cost, allowed, now.Location())
	}
	r.setBinding(pickBinding(r.Limits, allowed))
	return r
}

func evaluateLimit(l *Limit, s State, nowMs, nowUs, cost int64, allowed bool, loc *time.Location) LimitResult {
	lr := LimitResult{Name: l.Name, Algorithm: l.Algorithm, Window: l.Window, Limit: l.capacity()}
	lr.Allowed = allowed || limitAllows(l, s, nowMs, nowUs, cost)
	if l.Algorithm == GCRA {
		t := emissionMicros(*l)
		b := l.capacity()
		tat := max(s.End, nowUs)
		// (nowUs - (tat - b*t)) lies in (-inf, b*t]; a negative quotient
		// truncates towards zero, which the clamp below makes right.
		lr.Remaining = min(max((nowUs-(tat-b*t))/t, 0), b)
		lr.Used = b - lr.Remaining
		lr.ResetAt = time.UnixMicro(tat).In(loc)
		if !lr.Allowed {
			if cost > b {
				lr.RetryAfter = Never
			} else {
				lr.RetryAfter = time.Duration(tat+cost*t-b*t-nowUs) * time.Microsecond
			}
		}
		return lr
	}
	used, end := int64(0), windowOpening(l, nowMs)
	if s.End > nowMs {
		used, end = min(max(s.Used, 0), l.Max), s.End
	}
	lr.Used = used
	lr.Remaining = l.Max - used
	lr.ResetAt = time.UnixMilli(end).In(loc)
	if !lr.Allowed {
		if cost > l.Max {
			lr.RetryAfter = Never
		} else {
			lr.RetryAfter = time.Duration(end-nowMs) * time.Millisecond
		}
	}
	return lr
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
