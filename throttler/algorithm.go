package throttler

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
// one per limit of p in order, and returns whether it is allowed and the
// states after the decision. It is the reference implementation of the
// algorithms; backends either call it under their own lock or mirror it
// (the Redis Lua scripts do, line for line). It does not modify states.
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
// GCRA (per limit, times in µs, T = ceil(Window / Max), B = Burst):
//
//	tat      = max(End, now)
//	newTAT   = tat + cost*T
//	allowed  = newTAT - B*T <= now
//	consumed: End = newTAT
//
// The request is allowed only if every limit allows; then every limit
// consumes, otherwise none does. A cost of 0 is a peek: it never changes a
// state and opens no window. A cost above a limit's capacity is denied.
func Decide(p *Policy, now time.Time, cost int64, states []State) (allowed bool, next []State) {
	next = append([]State(nil), states...)
	if len(next) != len(p.limits) || cost < 0 {
		return false, next
	}
	nowMs, nowUs := now.UnixMilli(), now.UnixMicro()
	for i := range p.limits {
		if !limitAllows(&p.limits[i], next[i], nowMs, nowUs, cost) {
			return false, next
		}
	}
	if cost == 0 {
		return true, next
	}
	for i := range p.limits {
		l := &p.limits[i]
		s := &next[i]
		if l.Algorithm == GCRA {
			s.Used = 0
			s.End = max(s.End, nowUs) + cost*emissionMicros(*l)
			continue
		}
		if s.End > nowMs {
			s.Used = max(s.Used, 0) + cost
		} else {
			s.Used, s.End = cost, windowOpening(l, nowMs)
		}
	}
	return true, next
}

// Refund gives back up to n units of each limit's current window and
// returns the new states (states is not modified). Fixed windows: Used -= n,
// not below 0. GCRA: TAT -= n*T, not below now. A closed window or a TAT at
// or before now is left as it is.
func Refund(p *Policy, now time.Time, n int64, states []State) []State {
	next := append([]State(nil), states...)
	if len(next) != len(p.limits) || n <= 0 {
		return next
	}
	nowMs, nowUs := now.UnixMilli(), now.UnixMicro()
	for i := range p.limits {
		l := &p.limits[i]
		s := &next[i]
		if l.Algorithm == GCRA {
			if s.End > nowUs {
				t := emissionMicros(*l)
				back := s.End - nowUs // never refund below now
				if n <= back/t {
					back = n * t
				}
				s.End -= back
			}
			continue
		}
		if s.End > nowMs {
			s.Used = max(s.Used-n, 0)
		}
	}
	return next
}

// limitAllows reports whether one limit alone would allow cost at now.
func limitAllows(l *Limit, s State, nowMs, nowUs, cost int64) bool {
	if cost > l.capacity() {
		return false
	}
	if l.Algorithm == GCRA {
		t := emissionMicros(*l)
		newTAT := max(s.End, nowUs) + cost*t
		return newTAT-l.capacity()*t <= nowUs
	}
	used := int64(0)
	if s.End > nowMs {
		used = max(s.Used, 0)
	}
	return used+cost <= l.Max
}

// windowOpening returns the end of the fixed window a request at nowMs opens.
func windowOpening(l *Limit, nowMs int64) int64 {
	w := l.Window.Milliseconds()
	if l.Algorithm == AlignedWindow {
		return (floorDiv(nowMs, w) + 1) * w
	}
	return nowMs + w
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}
