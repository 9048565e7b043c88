package driver

import (
	"math"
	"time"
)

// State is what a backend stores for one limit of one identifier. Its
// meaning depends on the limit's algorithm:
//
//   - FixedWindow and AlignedWindow: Used is the number of units consumed in
//     the window that ends at End, in Unix milliseconds. End = 0 means no
//     window. A window with End <= now is closed and counts as absent,
//     whatever the store still holds.
//   - GCRA: End is the theoretical arrival time (TAT) in Unix microseconds;
//     Used is unused and zero. A TAT at or before now counts as absent.
//
// The zero State is "nothing stored".
type State struct {
	Used int64
	End  int64
}

// Never is the RetryAfter of a request that can never be allowed.
const Never = time.Duration(math.MaxInt64)

// Decide applies a request of cost units at now to one identifier's states,
// one per limit of p in order, and reports whether it is allowed. When it
// is, states is updated in place to the states after the decision; when it
// is denied, states is left as it was. It is the reference implementation
// of the algorithms: backends call it under a lock of their own or mirror
// it (the Redis scripts do, line for line).
//
// Fixed windows (per limit, times in ms):
//
//	open     = End > now
//	used     = open ? Used : 0
//	allowed  = used + cost <= Max
//	consumed: Used = used + cost; End = open ? End : opening(now)
//	opening(now) = now + Window                        (anchored)
//	             = (floor(now / Window) + 1) * Window  (aligned)
//
// GCRA (per limit, times in µs, T = EmissionMicros, B = Capacity):
//
//	tat      = max(End, now)
//	newTAT   = tat + cost*T
//	allowed  = newTAT - B*T <= now
//	consumed: End = newTAT
//
// The request is allowed only if every limit allows; then every limit
// consumes, otherwise none does. A cost of 0 is a peek: it never changes a
// state and opens no window. A cost above a limit's capacity is denied, as
// is a states slice whose length does not match the policy.
func Decide(p *Policy, now time.Time, cost int64, states []State) bool {
	if len(states) != len(p.Limits) || cost < 0 {
		return false
	}
	nowMs, nowUs := now.UnixMilli(), now.UnixMicro()
	for i := range p.Limits {
		if !limitAllows(&p.Limits[i], states[i], nowMs, nowUs, cost) {
			return false
		}
	}
	if cost == 0 {
		return true
	}
	for i := range p.Limits {
		l, s := &p.Limits[i], &states[i]
		if l.Algorithm == GCRA {
			s.Used = 0
			s.End = max(s.End, nowUs) + cost*l.EmissionMicros
			continue
		}
		if s.End > nowMs {
			s.Used = max(s.Used, 0) + cost
		} else {
			s.Used, s.End = cost, WindowEnd(l, nowMs)
		}
	}
	return true
}

// Refund gives back up to n units of each limit's current window, in
// place. Fixed windows: Used -= n, not below 0. GCRA: TAT -= n*T, not below
// now. A closed window or a TAT at or before now is left as it is, and so
// is a states slice whose length does not match the policy.
func Refund(p *Policy, now time.Time, n int64, states []State) {
	if len(states) != len(p.Limits) || n <= 0 {
		return
	}
	nowMs, nowUs := now.UnixMilli(), now.UnixMicro()
	for i := range p.Limits {
		l, s := &p.Limits[i], &states[i]
		if l.Algorithm == GCRA {
			if s.End > nowUs {
				back := s.End - nowUs // never refund below now
				if n <= back/l.EmissionMicros {
					back = n * l.EmissionMicros
				}
				s.End -= back
			}
			continue
		}
		if s.End > nowMs {
			s.Used = max(s.Used-n, 0)
		}
	}
}

// limitAllows reports whether one limit alone would allow cost at now.
func limitAllows(l *Limit, s State, nowMs, nowUs, cost int64) bool {
	if cost > l.Capacity {
		return false
	}
	if l.Algorithm == GCRA {
		newTAT := max(s.End, nowUs) + cost*l.EmissionMicros
		return newTAT-l.Capacity*l.EmissionMicros <= nowUs
	}
	used := int64(0)
	if s.End > nowMs {
		used = max(s.Used, 0)
	}
	return used+cost <= l.Max
}

// WindowEnd returns the end, in Unix milliseconds, of the fixed window that
// a request at nowMs opens under l: nowMs + Window for an anchored window,
// the next multiple of Window for an aligned one.
func WindowEnd(l *Limit, nowMs int64) int64 {
	w := l.WindowMillis
	if l.Algorithm == AlignedWindow {
		q := nowMs / w
		if nowMs%w != 0 && nowMs < 0 {
			q--
		}
		return (q + 1) * w
	}
	return nowMs + w
}

// Status is one limit's figures after a decision, as a result reports them.
type Status struct {
	// Allowed reports whether this limit alone allows the request.
	Allowed bool
	// Limit is the quota: Max, or the burst for GCRA.
	Limit int64
	// Remaining is Limit - Used, never negative.
	Remaining int64
	// Used is how many units are spent.
	Used int64
	// ResetAt is when the limit is whole again: the stored window end, or
	// for GCRA the moment the bucket is full again.
	ResetAt time.Time
	// RetryAfter is 0 when allowed; when denied, how long until the same
	// request could be allowed; Never when it can never be.
	RetryAfter time.Duration
}

// Evaluate returns the figures of limit l in state s (the state after the
// decision; a denial leaves it as it was) for a request of cost units at
// now that the backend answered with allowed. A closed window counts as
// absent, so a stale replica or an unevicted item never shows old counts.
//
//	fixed: Used = open ? min(Used, Max) : 0;  Remaining = Max - Used
//	       ResetAt = open ? End : opening(now);  RetryAfter = ResetAt - now
//	GCRA:  Remaining = floor((now - (TAT - B*T)) / T) clamped to [0, B]
//	       Used = B - Remaining;  ResetAt = max(TAT, now)
//	       RetryAfter = max(TAT, now) + cost*T - B*T - now
func Evaluate(l *Limit, s State, now time.Time, cost int64, allowed bool) Status {
	nowMs, nowUs := now.UnixMilli(), now.UnixMicro()
	st := Status{Limit: l.Capacity}
	st.Allowed = allowed || limitAllows(l, s, nowMs, nowUs, cost)
	if l.Algorithm == GCRA {
		t, b := l.EmissionMicros, l.Capacity
		tat := max(s.End, nowUs)
		// (nowUs - (tat - b*t)) lies in (-inf, b*t]; a negative quotient
		// truncates towards zero, which the clamp makes right.
		st.Remaining = min(max((nowUs-(tat-b*t))/t, 0), b)
		st.Used = b - st.Remaining
		st.ResetAt = time.UnixMicro(tat).In(now.Location())
		if !st.Allowed {
			if cost > b {
				st.RetryAfter = Never
			} else {
				st.RetryAfter = time.Duration(tat+cost*t-b*t-nowUs) * time.Microsecond
			}
		}
		return st
	}
	used, end := int64(0), WindowEnd(l, nowMs)
	if s.End > nowMs {
		used, end = min(max(s.Used, 0), l.Max), s.End
	}
	st.Used, st.Remaining = used, l.Max-used
	st.ResetAt = time.UnixMilli(end).In(now.Location())
	if !st.Allowed {
		if cost > l.Max {
			st.RetryAfter = Never
		} else {
			st.RetryAfter = time.Duration(end-nowMs) * time.Millisecond
		}
	}
	return st
}

// Headroom returns how many units one request could still consume at now
// under every limit of p, given the states a backend reported; 0 when the
// states do not match the policy.
func Headroom(p *Policy, now time.Time, states []State) int64 {
	if len(states) != len(p.Limits) {
		return 0
	}
	room := p.Capacity
	for i := range p.Limits {
		room = min(room, Evaluate(&p.Limits[i], states[i], now, 0, true).Remaining)
	}
	return max(room, 0)
}
