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
//   - SlidingWindow: Used is the count of the aligned window that ends at
//     End (Unix ms), Prev the count of the window just before it. At now,
//     with E the end of the aligned window holding now: End = E gives
//     cur = Used, prev = Prev; End = E - Window gives cur = 0, prev = Used;
//     any other End gives cur = prev = 0.
//
// Prev is zero for every algorithm but SlidingWindow. The zero State is
// "nothing stored".
type State struct {
	Used int64
	End  int64
	Prev int64
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
// Sliding window (per limit, times in ms, W = Window, E = aligned end of
// the window holding now, cur and prev as State says; a stored End beyond
// E, written by a clock ahead of this one, stays the current window with
// its Used and Prev, and E is that End):
//
//	allowed  = (cur + cost)*W + prev*min(E - now, W) <= Max*W
//	consumed: End = E; Used = cur + cost; Prev = prev
//
// which is cur + cost + prev × min(E - now, W)/W <= Max computed exactly
// in integers (Max × W stays below 2^52).
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
		if l.Algorithm == SlidingWindow {
			cur, prev, end, _ := slidingCounts(l, *s, nowMs)
			s.Used, s.End, s.Prev = cur+cost, end, prev
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
		if l.Algorithm == SlidingWindow {
			if s.End >= slidingEnd(l, nowMs) {
				s.Used = max(s.Used-n, 0)
			}
			continue
		}
		if s.End > nowMs {
			s.Used = max(s.Used-n, 0)
		}
	}
}

// slidingEnd returns the end, in Unix ms, of sliding-window limit l's
// aligned window that holds nowMs.
func slidingEnd(l *Limit, nowMs int64) int64 {
	w := l.WindowMillis
	return (floorDiv(nowMs, w) + 1) * w
}

// slidingCounts returns the current and previous windows' counts of a
// sliding-window state at nowMs, the current window's end, and the span
// min(end - now, W) that weighs the previous count. A state stored by a
// clock ahead of this one (End beyond the window holding now) is kept as
// the current window, its previous count at full weight, so that a clock
// that lags never discards another host's counts.
func slidingCounts(l *Limit, s State, nowMs int64) (cur, prev, end, span int64) {
	end = slidingEnd(l, nowMs)
	switch {
	case s.End > end:
		return max(s.Used, 0), max(s.Prev, 0), s.End, l.WindowMillis
	case s.End == end:
		return max(s.Used, 0), max(s.Prev, 0), end, end - nowMs
	case s.End == end-l.WindowMillis:
		return 0, max(s.Used, 0), end, end - nowMs
	}
	return 0, 0, end, end - nowMs
}

// slidingRemaining returns how many units a sliding-window limit has left:
// floor(Max - cur - prev × span/W), clamped to [0, Max].
func slidingRemaining(l *Limit, cur, prev, span int64) int64 {
	w := l.WindowMillis
	// ceil(prev*span/W) without leaving the integers.
	weighted := (prev*span + w - 1) / w
	return min(max(l.Max-cur-weighted, 0), l.Max)
}

// floorDiv is a / b rounded towards minus infinity, for b > 0.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
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
	if l.Algorithm == SlidingWindow {
		cur, prev, _, span := slidingCounts(l, s, nowMs)
		w := l.WindowMillis
		return (cur+cost)*w+prev*span <= l.Max*w
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
	if l.Algorithm == AlignedWindow || l.Algorithm == SlidingWindow {
		return (floorDiv(nowMs, w) + 1) * w
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
//	sliding (E, cur, prev as in Decide; W = Window):
//	       Remaining = Max - cur - ceil(prev*min(E - now, W)/W) clamped to [0, Max]
//	       Used = Max - Remaining
//	       ResetAt = cur > 0 ? E + W : prev > 0 ? E : now
//	       RetryAfter, for a denial of cost c <= Max: the wait until the
//	       count decays enough with no other traffic,
//	         Max-cur-c >= 0: E - floor((Max-cur-c)*W / prev) - now
//	         otherwise:      E + W - floor((Max-c)*W / cur) - now
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
	if l.Algorithm == SlidingWindow {
		cur, prev, end, span := slidingCounts(l, s, nowMs)
		w := l.WindowMillis
		st.Remaining = slidingRemaining(l, cur, prev, span)
		st.Used = l.Max - st.Remaining
		reset := nowMs
		switch {
		case cur > 0:
			reset = end + w
		case prev > 0:
			reset = end
		}
		st.ResetAt = time.UnixMilli(reset).In(now.Location())
		if !st.Allowed {
			switch {
			case cost > l.Max:
				st.RetryAfter = Never
			case l.Max-cur-cost >= 0 && prev > 0:
				st.RetryAfter = time.Duration(end-(l.Max-cur-cost)*w/prev-nowMs) * time.Millisecond
			case cur > 0:
				st.RetryAfter = time.Duration(end+w-(l.Max-cost)*w/cur-nowMs) * time.Millisecond
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

// Take grants as many units as every limit of p allows, up to n: the
// largest k <= n that Decide would allow at now on states, charged to
// every limit in place as Decide(p, now, k, states) does. It returns k; 0
// leaves states as they were. Backends implement take-up-to-N with it (or
// mirror it, as the Redis scripts do): k is min(n, Headroom), since each
// algorithm allows a cost exactly when it is at most the limit's
// Remaining.
func Take(p *Policy, now time.Time, n int64, states []State) int64 {
	if n <= 0 || len(states) != len(p.Limits) {
		return 0
	}
	k := min(n, Headroom(p, now, states))
	if k <= 0 || !Decide(p, now, k, states) {
		return 0
	}
	return k
}
