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
// largest RetryAfter. Limits returns every limit's own figures, computed
// when asked for: a Result holds what they are computed from, in place for
// policies of up to four limits, so that deciding allocates nothing.
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

	// limits is what Limits computes the per-limit figures from.
	limits limitSource
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

// inlineLimits is the most limits whose states a Result holds in place.
const inlineLimits = 4

// limitSource is what a Result's per-limit figures are computed from: the
// states a decision left, evaluated on demand exactly as the decision
// evaluated them to pick the binding limit.
type limitSource struct {
	policy *driver.Policy // nil: no figures, or given ones
	at     time.Time      // the clock reading the states were decided at
	cost   int64
	// allowed is the verdict the states were evaluated with; closed makes
	// every limit show exhausted (a failure mode's denial); shifted counts
	// every denying limit's RetryAfter down by shift (the deny cache).
	allowed, closed, shifted bool
	shift                    time.Duration
	states                   [inlineLimits]driver.State
	extra                    *limitExtra // nil for policies of up to four limits
}

// limitExtra holds what does not fit in a limitSource: the states of a
// policy of more than four limits, or figures given by SetLimits. It is
// never changed once built, so that copies of a Result may share it.
type limitExtra struct {
	states []driver.State
	given  []LimitResult
}

// NumLimits returns the number of limits Limits reports: one per limit of
// the policy decided, 0 for a result that carries no per-limit figures.
func (r Result) NumLimits() int {
	if r.limits.policy != nil {
		return len(r.limits.policy.Limits)
	}
	if r.limits.extra != nil {
		return len(r.limits.extra.given)
	}
	return 0
}

// LimitAt returns the figures of the i-th limit, in the policy's order, as
// Limits()[i] would, without allocating; the zero LimitResult when i is out
// of range.
func (r Result) LimitAt(i int) LimitResult { return r.limits.figures(i) }

// Limits returns each limit's figures, in the policy's order, in a new
// slice the caller may keep; nil when the result carries none (a lease's
// result, a failed operation's). NumLimits and LimitAt read the same
// figures without allocating.
func (r Result) Limits() []LimitResult {
	n := r.NumLimits()
	if n == 0 {
		return nil
	}
	out := make([]LimitResult, n)
	for i := range out {
		out[i] = r.limits.figures(i)
	}
	return out
}

// SetLimits makes Limits report a copy of ls, for a Result built outside a
// throttler, such as a model's expected result in a test or a fake's.
func (r *Result) SetLimits(ls []LimitResult) {
	r.limits = limitSource{}
	if ls != nil {
		r.limits.extra = &limitExtra{given: append(make([]LimitResult, 0, len(ls)), ls...)}
	}
}

// state returns the state of the i-th limit.
func (s *limitSource) state(i int) driver.State {
	if s.extra != nil {
		return s.extra.states[i]
	}
	return s.states[i]
}

// figures computes the i-th limit's figures.
func (s *limitSource) figures(i int) LimitResult {
	if s.policy == nil {
		if s.extra != nil && i >= 0 && i < len(s.extra.given) {
			return s.extra.given[i]
		}
		return LimitResult{}
	}
	if i < 0 || i >= len(s.policy.Limits) {
		return LimitResult{}
	}
	l := &s.policy.Limits[i]
	st := driver.Evaluate(l, s.state(i), s.at, s.cost, s.allowed)
	lr := LimitResult{Name: l.Name, Algorithm: l.Algorithm, Window: l.Window, Allowed: st.Allowed,
		Limit: st.Limit, Remaining: st.Remaining, Used: st.Used, ResetAt: st.ResetAt, RetryAfter: st.RetryAfter}
	if s.closed {
		lr.Allowed, lr.Remaining, lr.Used, lr.RetryAfter = false, 0, lr.Limit, degradedRetryAfter
	}
	if s.shifted && !lr.Allowed && lr.RetryAfter != Never {
		lr.RetryAfter = max(lr.RetryAfter-s.shift, time.Millisecond)
	}
	return lr
}

// evaluate sets r from the states a backend returned for a request of cost
// at now under p (missing states count as nothing stored): the verdict,
// the binding limit's figures at the top, and what the per-limit figures
// are computed from. Every other field is left as it was.
func (r *Result) evaluate(p *driver.Policy, now time.Time, cost int64, allowed bool, states []driver.State) {
	n := len(p.Limits)
	r.Allowed, r.Policy, r.At, r.Granted = allowed, p.Name, now, 0
	if allowed {
		r.Granted = cost
	}
	src := &r.limits
	src.policy, src.at, src.cost, src.allowed = p, now, cost, allowed
	src.closed, src.shifted, src.shift, src.extra = false, false, 0, nil
	var more []driver.State
	if n > inlineLimits {
		more = make([]driver.State, n)
		src.extra = &limitExtra{states: more}
	}
	// The binding limit (see Result): on deny, the denying limit with the
	// largest RetryAfter; otherwise, or when no limit alone denies (a store
	// that raced), the smallest Remaining, ties to the latest ResetAt.
	deny, keep := -1, -1
	var denySt, keepSt driver.Status
	if n == 1 && len(states) == 1 {
		// One limit binds whatever the verdict: nothing to compare.
		src.states = [inlineLimits]driver.State{states[0]}
		keep, keepSt = 0, driver.Evaluate(&p.Limits[0], states[0], now, cost, allowed)
	} else if allowed && more == nil && len(states) == n {
		// An allowed decision binds on the smallest Remaining; only the
		// binding limit's figures are computed in full.
		var keepRem, keepReset int64
		nowMs := now.UnixMilli()
		for i := range n {
			s := states[i]
			src.states[i] = s
			rem, reset := remainingAndReset(&p.Limits[i], s, now, nowMs)
			if keep < 0 || rem < keepRem || rem == keepRem && reset > keepReset {
				keep, keepRem, keepReset = i, rem, reset
			}
		}
		for i := n; i < len(src.states); i++ {
			src.states[i] = driver.State{}
		}
		keepSt = driver.Evaluate(&p.Limits[keep], states[keep], now, cost, allowed)
	} else {
		for i := range n {
			var s driver.State
			if i < len(states) {
				s = states[i]
			}
			if more != nil {
				more[i] = s
			} else {
				src.states[i] = s
			}
			st := driver.Evaluate(&p.Limits[i], s, now, cost, allowed)
			if !allowed && !st.Allowed && (deny < 0 || st.RetryAfter > denySt.RetryAfter) {
				deny, denySt = i, st
			}
			if keep < 0 || st.Remaining < keepSt.Remaining || st.Remaining == keepSt.Remaining && st.ResetAt.After(keepSt.ResetAt) {
				keep, keepSt = i, st
			}
		}
		for i := n; i < len(src.states); i++ {
			src.states[i] = driver.State{}
		}
	}
	if deny >= 0 {
		keep, keepSt = deny, denySt
	}
	b := &p.Limits[keep]
	r.Binding, r.Window = b.Name, b.Window
	r.Limit, r.Remaining, r.Used, r.ResetAt = keepSt.Limit, keepSt.Remaining, keepSt.Used, keepSt.ResetAt
	r.RetryAfter = 0
	if !allowed {
		r.RetryAfter = keepSt.RetryAfter
		if r.RetryAfter <= 0 {
			// Denied by a store that raced: never tell a client to retry at
			// once in a loop.
			r.RetryAfter = time.Millisecond
		}
	}
}

// remainingAndReset returns what driver.Evaluate reports as the limit's
// Remaining and ResetAt (in Unix microseconds) for state s at now, whose
// Unix milliseconds are nowMs: computed here for fixed and aligned windows,
// the common case, which need no more than that, and by Evaluate for the
// other algorithms. TestRemainingAndResetMatchEvaluate holds the two to
// agreement.
func remainingAndReset(l *driver.Limit, s driver.State, now time.Time, nowMs int64) (remaining, resetMicros int64) {
	if l.Algorithm != driver.FixedWindow && l.Algorithm != driver.AlignedWindow {
		st := driver.Evaluate(l, s, now, 0, true)
		return st.Remaining, st.ResetAt.UnixMicro()
	}
	if s.End > nowMs {
		return l.Max - min(max(s.Used, 0), l.Max), s.End * 1000
	}
	return l.Max, driver.WindowEnd(l, nowMs) * 1000
}

// evaluated returns the Result of evaluate on a zero Result.
func evaluated(p *driver.Policy, now time.Time, cost int64, allowed bool, states []driver.State) Result {
	var r Result
	r.evaluate(p, now, cost, allowed, states)
	return r
}
