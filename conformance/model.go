package conformance

import (
	"time"

	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// Model is a reference model of SPEC: an in-memory rate limiter written
// from the SPEC text alone, independently of package throttler's Decide,
// Refund and Evaluate, so that comparing the two catches a slip in either.
// It answers what a conforming backend, driven through a Throttler, must
// answer: the DifferentialAgainstModel subtest replays random operations on
// both and compares every field of every Result.
//
// The model follows SPEC literally:
//
//   - Fixed windows count in integer Unix milliseconds. A window is open
//     while now < end; an allowed request finding none opens one ending at
//     now + Window (anchored) or at the next multiple of Window since the
//     epoch (aligned). A request is allowed iff used + cost <= Max.
//   - GCRA counts in integer Unix microseconds, with T = ceil(Window / Max)
//     and B = Burst (Max when zero); an absent TAT reads as now.
//   - A sliding window keeps the count of the aligned window holding now
//     and of the one before it; the earlier count weighs the share of its
//     window that the last Window still covers. A request is allowed iff
//     cur + cost + prev × (end - now)/W <= Max, exactly (a stored window
//     ahead of now is the current one, its previous count at full weight).
//   - AllowUpTo grants the largest k <= n that every limit allows.
//   - A request is allowed only if every limit allows it; then every limit
//     consumes, otherwise none does. Cost 0 consumes nothing and opens no
//     window, and a cost above some limit's capacity is refused with
//     NeverAllowed and RetryAfter throttler.Never.
//   - On allow the binding limit has the smallest Remaining, ties going to
//     the latest ResetAt and then to the first in the policy; on deny it is
//     the denying limit with the largest RetryAfter, ties going to the
//     first. Each limit's own Allowed says whether it alone allows the
//     request.
//
// A Model is not safe for concurrent use. Its methods expect what a
// Throttler hands a backend: a policy built by throttler.NewPolicy, a valid
// identifier, and a cost of 0 or more; given anything else they return the
// zero Result.
type Model struct {
	states map[modelKey]*modelState
}

// modelKey names one limit's state for one identifier: the policy name and
// the limit's name as Policy.Limits gives it, algorithm, window and, for
// GCRA, capacity, so two limits never share state. That is key layout 1's
// identity (driver.KeyV1), finer than layout 2's driver.Limit.Key: an
// unnamed limit's name is its notation, Max included, and a GCRA limit's
// capacity is Max when no burst is set, so the model carries a limit's
// state across a change of its Max only for a named window limit.
type modelKey struct {
	policy    string
	limit     string
	algorithm throttler.Algorithm
	window    time.Duration
	burst     int64
	id        string
}

// modelState is what the model stores for one limit of one identifier.
type modelState struct {
	// used counts the units of the window ending at end (fixed windows).
	used int64
	// end is the window's end in Unix milliseconds (fixed and sliding
	// windows) or the theoretical arrival time in Unix microseconds (GCRA).
	// Zero means nothing stored.
	end int64
	// prev counts the units of the window before the one ending at end
	// (sliding windows).
	prev int64
}

// NewModel returns an empty model: every identifier starts with nothing
// stored.
func NewModel() *Model { return &Model{states: make(map[modelKey]*modelState)} }

// AllowN decides a request of cost units for id under p at now, and
// returns the Result a conforming backend behind a Throttler gives. A cost
// of 0 is a peek. A cost above some limit's capacity returns a Result with
// NeverAllowed set (Throttler.AllowN also returns ErrCostExceedsLimit).
func (m *Model) AllowN(p *throttler.Policy, id string, now time.Time, cost int64) throttler.Result {
	if !modelValid(p, id) || cost < 0 {
		return throttler.Result{}
	}
	views := m.views(p, id, now)
	allowed := true
	fits := make([]bool, len(views))
	for i := range views {
		fits[i] = views[i].fits(cost)
		allowed = allowed && fits[i]
	}
	if allowed && cost > 0 {
		for i := range views {
			views[i].consume(m, cost)
		}
		views = m.views(p, id, now)
	}
	r := m.report(p, id, views, cost, allowed, fits)
	if allowed {
		r.Granted = cost
	}
	return r
}

// AllowUpTo takes up to n units: it grants the largest k <= n that every
// limit allows at now, found by bisection on the limits' own verdicts, and
// returns AllowN's result for k; when no unit fits, the denial of one unit,
// with Granted 0.
func (m *Model) AllowUpTo(p *throttler.Policy, id string, now time.Time, n int64) throttler.Result {
	if !modelValid(p, id) || n < 1 {
		return throttler.Result{}
	}
	views := m.views(p, id, now)
	all := func(k int64) bool {
		for i := range views {
			if !views[i].fits(k) {
				return false
			}
		}
		return true
	}
	lo, hi := int64(0), n // all(lo) holds; find the largest such k
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		if all(mid) {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	if lo == 0 {
		return m.AllowN(p, id, now, 1)
	}
	return m.AllowN(p, id, now, lo)
}

// Peek returns the result of a cost-0 request: what the state allows at
// now, without changing it.
func (m *Model) Peek(p *throttler.Policy, id string, now time.Time) throttler.Result {
	return m.AllowN(p, id, now, 0)
}

// Refund gives back up to n units of every limit's current window: a fixed
// window's used count drops by n but not below 0, a GCRA TAT moves back by
// n*T but not below now, and a window that is already closed is left
// alone. It returns the state after the refund the way Throttler.Refund
// reports it: as an allowed peek, every RetryAfter zero.
func (m *Model) Refund(p *throttler.Policy, id string, now time.Time, n int64) throttler.Result {
	if !modelValid(p, id) || n < 0 {
		return throttler.Result{}
	}
	views := m.views(p, id, now)
	for i := range views {
		views[i].refund(m, n)
	}
	views = m.views(p, id, now)
	fits := make([]bool, len(views))
	for i := range fits {
		fits[i] = true
	}
	return m.report(p, id, views, 0, true, fits)
}

// Reset forgets id's state for every limit of p.
func (m *Model) Reset(p *throttler.Policy, id string) {
	if !modelValid(p, id) {
		return
	}
	for i := 0; i < len(p.Limits()); i++ {
		delete(m.states, keyFor(p, p.Limits()[i], id))
	}
}

func modelValid(p *throttler.Policy, id string) bool {
	return p != nil && len(p.Limits()) > 0 && id != "" && len(id) <= driver.MaxIdentifierLen
}

func keyFor(p *throttler.Policy, l throttler.Limit, id string) modelKey {
	k := modelKey{policy: p.Name(), limit: l.Name, algorithm: l.Algorithm, window: l.Window, id: id}
	if l.Algorithm == throttler.GCRA {
		k.burst = capacity(l)
	}
	return k
}

// limitView is one limit's stored state as seen at one now.
type limitView struct {
	limit throttler.Limit
	key   modelKey
	state modelState // a copy; zero when nothing is stored
	nowMs int64
	nowUs int64
}

func (m *Model) views(p *throttler.Policy, id string, now time.Time) []limitView {
	vs := make([]limitView, len(p.Limits()))
	for i := range vs {
		l := p.Limits()[i]
		v := limitView{limit: l, key: keyFor(p, l, id), nowMs: now.UnixMilli(), nowUs: now.UnixMicro()}
		if s := m.states[v.key]; s != nil {
			v.state = *s
		}
		vs[i] = v
	}
	return vs
}

func (v *limitView) gcra() bool { return v.limit.Algorithm == throttler.GCRA }

func (v *limitView) sliding() bool { return v.limit.Algorithm == throttler.SlidingWindow }

// slidingWindow returns the sliding window's counts as of now: the current
// window's end and count, the previous window's count, and the part of the
// previous window (in ms, at most W) that the last W still covers.
func (v *limitView) slidingWindow() (end, cur, prev, covered int64) {
	w := v.limit.Window.Milliseconds()
	bucket := v.nowMs / w
	if v.nowMs%w != 0 && v.nowMs < 0 {
		bucket--
	}
	end = (bucket + 1) * w
	switch {
	case v.state.end > end: // written by a clock ahead of this one
		return v.state.end, max(v.state.used, 0), max(v.state.prev, 0), w
	case v.state.end == end:
		return end, max(v.state.used, 0), max(v.state.prev, 0), end - v.nowMs
	case v.state.end == end-w:
		return end, 0, max(v.state.used, 0), end - v.nowMs
	}
	return end, 0, 0, end - v.nowMs
}

// emission is the GCRA emission interval T in microseconds, rounded up so
// that the rate never exceeds Max per Window.
func (v *limitView) emission() int64 {
	windowUs := v.limit.Window.Microseconds()
	t := windowUs / v.limit.Max
	if t*v.limit.Max < windowUs {
		t++
	}
	return t
}

// open reports whether a fixed window is open at now.
func (v *limitView) open() bool { return v.state.end > v.nowMs }

// windowEnd is the end of the open fixed window, or of the one a request
// would open now.
func (v *limitView) windowEnd() int64 {
	if v.open() {
		return v.state.end
	}
	w := v.limit.Window.Milliseconds()
	if v.limit.Algorithm == throttler.AlignedWindow {
		bucket := v.nowMs / w
		if v.nowMs%w != 0 && v.nowMs < 0 {
			bucket-- // floor, also before 1970
		}
		return (bucket + 1) * w
	}
	return v.nowMs + w
}

// usedNow is the fixed window's count at now: 0 once the window closed.
func (v *limitView) usedNow() int64 {
	if v.open() {
		return v.state.used
	}
	return 0
}

// tat is the GCRA theoretical arrival time at now: an absent or past TAT
// reads as now.
func (v *limitView) tat() int64 { return max(v.state.end, v.nowUs) }

// fits reports whether this limit alone allows cost units at now.
func (v *limitView) fits(cost int64) bool {
	if cost > capacity(v.limit) {
		return false
	}
	if v.gcra() {
		t, b := v.emission(), capacity(v.limit)
		return v.tat()+cost*t-b*t <= v.nowUs
	}
	if v.sliding() {
		// cur + cost + prev*covered/W <= Max, multiplied out by W.
		_, cur, prev, covered := v.slidingWindow()
		w := v.limit.Window.Milliseconds()
		return (v.limit.Max-cur-cost)*w >= prev*covered
	}
	return v.usedNow()+cost <= v.limit.Max
}

// consume stores cost units: a fixed window opens if none is open; a GCRA
// TAT moves cost*T past max(TAT, now).
func (v *limitView) consume(m *Model, cost int64) {
	s := m.states[v.key]
	if s == nil {
		s = &modelState{}
		m.states[v.key] = s
	}
	if v.gcra() {
		s.used, s.end = 0, v.tat()+cost*v.emission()
		return
	}
	if v.sliding() {
		end, cur, prev, _ := v.slidingWindow()
		s.used, s.end, s.prev = cur+cost, end, prev
		return
	}
	s.used, s.end = v.usedNow()+cost, v.windowEnd()
}

// refund gives back up to n units of the current window.
func (v *limitView) refund(m *Model, n int64) {
	s := m.states[v.key]
	if s == nil || n == 0 {
		return
	}
	if v.gcra() {
		if s.end <= v.nowUs {
			return
		}
		// TAT - n*T, but not below now; compared by division so that a
		// huge n cannot overflow.
		if ahead := s.end - v.nowUs; n > ahead/v.emission() {
			s.end = v.nowUs
		} else {
			s.end -= n * v.emission()
		}
		return
	}
	if v.sliding() {
		// Only the current window's units come back.
		if end, _, _, _ := v.slidingWindow(); s.end >= end {
			s.used = max(s.used-n, 0)
		}
		return
	}
	if v.open() {
		s.used = max(s.used-n, 0)
	}
}

// slidingWait is how many ms until cost units fit in a sliding window with
// no other traffic: within the current window the previous count's weight
// shrinks as it slides out; failing that, in the next window, where the
// current count becomes the previous one and shrinks in turn.
func (v *limitView) slidingWait(cost int64) int64 {
	end, cur, prev, _ := v.slidingWindow()
	w := v.limit.Window.Milliseconds()
	if room := v.limit.Max - cur - cost; room >= 0 && prev > 0 {
		// Fits once prev*(end - t) <= room*W: t = end - floor(room*W/prev).
		return end - room*w/prev - v.nowMs
	}
	// Next window: cur*(end + W - t) <= (Max - cost)*W.
	return end + w - (v.limit.Max-cost)*w/cur - v.nowMs
}

// figures is this limit's part of a Result, given the request's cost, the
// overall verdict and whether this limit alone allows the request.
func (v *limitView) figures(cost int64, allowed, fits bool) throttler.LimitResult {
	l := v.limit
	lr := throttler.LimitResult{Name: l.Name, Algorithm: l.Algorithm, Window: l.Window,
		Allowed: allowed || fits, Limit: capacity(l)}
	if v.gcra() {
		t, b, tat := v.emission(), capacity(l), v.tat()
		// floor((now - (TAT - B*T)) / T), clamped to [0, B].
		ahead := v.nowUs - (tat - b*t)
		remaining := ahead / t
		if ahead < 0 && ahead%t != 0 {
			remaining--
		}
		lr.Remaining = min(max(remaining, 0), b)
		lr.Used = b - lr.Remaining
		lr.ResetAt = time.UnixMicro(tat)
		if !lr.Allowed {
			lr.RetryAfter = throttler.Never
			if cost <= b {
				lr.RetryAfter = time.Duration(tat+cost*t-b*t-v.nowUs) * time.Microsecond
			}
		}
		return lr
	}
	if v.sliding() {
		end, cur, prev, covered := v.slidingWindow()
		w := l.Window.Milliseconds()
		// The weighted count, rounded up: Remaining is what still fits.
		weighted := prev * covered / w
		if prev*covered%w != 0 {
			weighted++
		}
		lr.Remaining = min(max(l.Max-cur-weighted, 0), l.Max)
		lr.Used = l.Max - lr.Remaining
		switch {
		case cur > 0:
			lr.ResetAt = time.UnixMilli(end + w)
		case prev > 0:
			lr.ResetAt = time.UnixMilli(end)
		default:
			lr.ResetAt = time.UnixMilli(v.nowMs)
		}
		if !lr.Allowed {
			lr.RetryAfter = throttler.Never
			if cost <= l.Max {
				lr.RetryAfter = time.Duration(v.slidingWait(cost)) * time.Millisecond
			}
		}
		return lr
	}
	used := min(max(v.usedNow(), 0), l.Max)
	lr.Used, lr.Remaining = used, l.Max-used
	lr.ResetAt = time.UnixMilli(v.windowEnd())
	if !lr.Allowed {
		lr.RetryAfter = throttler.Never
		if cost <= l.Max {
			lr.RetryAfter = time.Duration(v.windowEnd()-v.nowMs) * time.Millisecond
		}
	}
	return lr
}

// report builds the Result: every limit's figures and the binding limit's
// at the top.
func (m *Model) report(p *throttler.Policy, id string, views []limitView, cost int64, allowed bool, fits []bool) throttler.Result {
	r := throttler.Result{Allowed: allowed, Policy: p.Name(), Identifier: id}
	limits := make([]throttler.LimitResult, len(views))
	for i := range views {
		limits[i] = views[i].figures(cost, allowed, fits[i])
		if cost > capacity(views[i].limit) {
			r.NeverAllowed = true
		}
	}
	r.SetLimits(limits)
	binding := 0
	for i, lr := range limits {
		b := limits[binding]
		switch {
		case allowed:
			if lr.Remaining < b.Remaining || lr.Remaining == b.Remaining && lr.ResetAt.After(b.ResetAt) {
				binding = i
			}
		case !lr.Allowed && (b.Allowed || lr.RetryAfter > b.RetryAfter):
			binding = i
		}
	}
	b := limits[binding]
	r.Binding, r.Window = b.Name, b.Window
	r.Limit, r.Remaining, r.Used, r.ResetAt = b.Limit, b.Remaining, b.Used, b.ResetAt
	if !allowed {
		r.RetryAfter = b.RetryAfter
	}
	return r
}
