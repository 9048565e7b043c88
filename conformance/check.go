package conformance

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// Units for the timeline tables.
const (
	us     = time.Microsecond
	ms     = time.Millisecond
	sec    = time.Second
	minute = time.Minute
	hour   = time.Hour
)

// never is throttler.Never, short for the tables.
const never = throttler.Never

// op is what one timeline step does.
type op int

const (
	allowN op = iota // Throttler.AllowN with the step's cost
	peek             // Throttler.Peek
	refund           // Throttler.Refund of the step's cost
)

func (o op) String() string {
	switch o {
	case peek:
		return "Peek"
	case refund:
		return "Refund"
	}
	return "AllowN"
}

// step is one moment of a timeline: at T0+at the op runs with cost, and the
// result's top-level fields must be exactly the rest. A retryAfter of never
// expects the request to be refused with ErrCostExceedsLimit.
type step struct {
	at         time.Duration
	op         op
	cost       int64
	allowed    bool
	remaining  int64
	used       int64
	resetAt    time.Duration // offset from T0
	retryAfter time.Duration
}

// label names a step in failure messages.
func (s step) label(i int) string {
	if s.op == peek {
		return fmt.Sprintf("t%d (T0+%v, Peek)", i, s.at)
	}
	return fmt.Sprintf("t%d (T0+%v, %v cost %d)", i, s.at, s.op, s.cost)
}

// timeline runs steps on one instance for one identifier and returns each
// step's result.
func (in *instance) timeline(t *testing.T, p *throttler.Policy, id string, steps []step) []throttler.Result {
	t.Helper()
	results := make([]throttler.Result, len(steps))
	for i, s := range steps {
		at(s.at, in)
		label := s.label(i)
		var r throttler.Result
		switch s.op {
		case peek:
			r = in.peek(t, label, p, id)
		case refund:
			r = in.refund(t, label, p, id, s.cost)
		default:
			if s.retryAfter == never {
				r = in.allowNever(t, label, p, id, s.cost)
			} else {
				r = in.allow(t, label, p, id, s.cost)
			}
		}
		checkTop(t, label, r, s.allowed, s.remaining, s.used, s.resetAt, s.retryAfter)
		results[i] = r
	}
	return results
}

// checkTop compares a result's top-level figures with a timeline's.
// resetAt is an offset from T0 (instances with a skewed clock share the
// primary's windows, so it is not shifted by skew).
func checkTop(t *testing.T, label string, r throttler.Result, allowed bool, remaining, used int64,
	resetAt, retryAfter time.Duration) {
	t.Helper()
	var diffs []string
	if r.Allowed != allowed {
		diffs = append(diffs, fmt.Sprintf("Allowed = %v, want %v", r.Allowed, allowed))
	}
	if r.Remaining != remaining {
		diffs = append(diffs, fmt.Sprintf("Remaining = %d, want %d", r.Remaining, remaining))
	}
	if r.Used != used {
		diffs = append(diffs, fmt.Sprintf("Used = %d, want %d", r.Used, used))
	}
	if want := T0.Add(resetAt); !r.ResetAt.Equal(want) {
		diffs = append(diffs, fmt.Sprintf("ResetAt = T0%+v, want T0+%v", r.ResetAt.Sub(T0), resetAt))
	}
	if r.RetryAfter != retryAfter {
		diffs = append(diffs, fmt.Sprintf("RetryAfter = %v, want %v", fmtRetry(r.RetryAfter), fmtRetry(retryAfter)))
	}
	if len(diffs) > 0 {
		t.Errorf("%s: %s", label, strings.Join(diffs, "; "))
	}
}

func fmtRetry(d time.Duration) string {
	if d == never {
		return "Never"
	}
	return d.String()
}

// allow decides cost units and fails the subtest on any error: the suite
// calls it only with valid input and a cost that fits the policy.
func (in *instance) allow(t *testing.T, label string, p *throttler.Policy, id string, cost int64) throttler.Result {
	t.Helper()
	r, err := in.thr.AllowN(in.env.ctx, p, id, cost)
	if err != nil {
		t.Fatalf("%s: AllowN(%q, %s, %d): unexpected error: %v", label, p.Name(), printable(id), cost, err)
	}
	checkInvariants(t, label, p, id, in.clock.Now(), cost, r)
	return r
}

// allowNever decides a cost above the policy's capacity, which SPEC says
// can never succeed, and checks it is told apart from an ordinary denial.
func (in *instance) allowNever(t *testing.T, label string, p *throttler.Policy, id string, cost int64) throttler.Result {
	t.Helper()
	r, err := in.thr.AllowN(in.env.ctx, p, id, cost)
	if !errors.Is(err, throttler.ErrCostExceedsLimit) {
		t.Fatalf("%s: AllowN cost %d over capacity: err = %v, want ErrCostExceedsLimit", label, cost, err)
	}
	if !r.NeverAllowed {
		t.Errorf("%s: NeverAllowed = false, want true", label)
	}
	checkInvariants(t, label, p, id, in.clock.Now(), cost, r)
	return r
}

// peek returns Throttler.Peek's result, failing the subtest on error.
func (in *instance) peek(t *testing.T, label string, p *throttler.Policy, id string) throttler.Result {
	t.Helper()
	r, err := in.thr.Peek(in.env.ctx, p, id)
	if err != nil {
		t.Fatalf("%s: Peek(%q, %s): unexpected error: %v", label, p.Name(), printable(id), err)
	}
	checkInvariants(t, label, p, id, in.clock.Now(), 0, r)
	return r
}

// refund gives back n units, failing the subtest on error. Throttler.Refund
// reports the state after the refund as an allowed peek.
func (in *instance) refund(t *testing.T, label string, p *throttler.Policy, id string, n int64) throttler.Result {
	t.Helper()
	r, err := in.thr.Refund(in.env.ctx, p, id, n)
	if err != nil {
		t.Fatalf("%s: Refund(%q, %s, %d): unexpected error: %v", label, p.Name(), printable(id), n, err)
	}
	if !r.Allowed {
		t.Errorf("%s: Refund result Allowed = false, want true", label)
	}
	checkInvariants(t, label, p, id, in.clock.Now(), 0, r)
	return r
}

// reset forgets an identifier's state, failing the subtest on error.
func (in *instance) reset(t *testing.T, label string, p *throttler.Policy, id string) {
	t.Helper()
	if err := in.thr.Reset(in.env.ctx, p, id); err != nil {
		t.Fatalf("%s: Reset(%q, %s): %v", label, p.Name(), printable(id), err)
	}
}

// capacity is the largest cost one limit can ever allow: Max, or Burst for
// GCRA when set.
func capacity(l throttler.Limit) int64 {
	if l.Algorithm == throttler.GCRA && l.Burst > 0 {
		return l.Burst
	}
	return l.Max
}

// checkInvariants checks what SPEC says of every result, whatever the
// timeline: the figures add up and are never negative, RetryAfter matches
// the verdict, the binding limit follows the selection rules, the result
// describes the policy and identifier asked about, and nothing is degraded.
func checkInvariants(t *testing.T, label string, p *throttler.Policy, id string, now time.Time, cost int64, r throttler.Result) {
	t.Helper()
	var bad []string
	add := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }
	if r.Degraded || r.Err != nil {
		t.Fatalf("%s: degraded result, backend failed: %v", label, r.Err)
	}
	if r.Policy != p.Name() {
		add("Policy = %q, want %q", r.Policy, p.Name())
	}
	if r.Identifier != id {
		add("Identifier = %s, want %s", printable(r.Identifier), printable(id))
	}
	if r.NumLimits() != len(p.Limits()) {
		t.Fatalf("%s: %d per-limit results for %d limits", label, r.NumLimits(), len(p.Limits()))
	}
	neverFits := false
	binding := -1
	for i, lr := range r.Limits() {
		l := p.Limits()[i]
		where := fmt.Sprintf("limit %q", lr.Name)
		if lr.Name != l.Name || lr.Algorithm != l.Algorithm || lr.Window != l.Window {
			add("limit %d is %q %v %v, want %q %v %v", i, lr.Name, lr.Algorithm, lr.Window, l.Name, l.Algorithm, l.Window)
		}
		if lr.Name == r.Binding {
			binding = i
		}
		if lr.Limit != capacity(l) {
			add("%s: Limit = %d, want %d", where, lr.Limit, capacity(l))
		}
		if lr.Remaining < 0 || lr.Used < 0 || lr.Remaining != lr.Limit-lr.Used {
			add("%s: Remaining %d, Used %d, Limit %d: want Remaining = Limit - Used, both >= 0",
				where, lr.Remaining, lr.Used, lr.Limit)
		}
		if r.Allowed && (!lr.Allowed || lr.RetryAfter != 0) {
			add("%s: allowed request, but the limit says Allowed %v, RetryAfter %v", where, lr.Allowed, lr.RetryAfter)
		}
		if !lr.Allowed && lr.RetryAfter <= 0 {
			add("%s: denied with RetryAfter %v, want > 0", where, lr.RetryAfter)
		}
		if lr.Allowed && lr.RetryAfter != 0 {
			add("%s: allowed with RetryAfter %v, want 0", where, lr.RetryAfter)
		}
		if cost > capacity(l) {
			neverFits = true
			if lr.Allowed || lr.RetryAfter != never {
				add("%s: cost %d above capacity %d: Allowed %v, RetryAfter %v, want false, Never",
					where, cost, capacity(l), lr.Allowed, fmtRetry(lr.RetryAfter))
			}
		} else if lr.RetryAfter == never {
			add("%s: RetryAfter Never for cost %d within capacity %d", where, cost, capacity(l))
		}
		if !lr.Allowed && cost == 1 && lr.Remaining != 0 {
			add("%s: denied a request of cost 1 with Remaining %d, want 0", where, lr.Remaining)
		}
		if !lr.Allowed && cost <= capacity(l) && l.Algorithm == throttler.SlidingWindow {
			// SPEC: a sliding window's count decays before ResetAt, so
			// the wait is positive and at most ResetAt - now.
			if lr.RetryAfter <= 0 || lr.RetryAfter > lr.ResetAt.Sub(time.UnixMilli(now.UnixMilli())) {
				add("%s: denied with RetryAfter %v, want in (0, ResetAt - now = %v]", where, lr.RetryAfter,
					lr.ResetAt.Sub(time.UnixMilli(now.UnixMilli())))
			}
		} else if !lr.Allowed && cost <= capacity(l) {
			// SPEC: RetryAfter = ResetAt - now for fixed windows, in whole
			// milliseconds; newTAT - B*T - now for GCRA, where ResetAt is
			// max(TAT, now) and a denial leaves TAT as it was.
			var want time.Duration
			if l.Algorithm == throttler.GCRA {
				tUs := (l.Window.Microseconds() + l.Max - 1) / l.Max
				want = lr.ResetAt.Sub(now.Truncate(time.Microsecond)) + time.Duration((cost-capacity(l))*tUs)*time.Microsecond
			} else {
				want = lr.ResetAt.Sub(time.UnixMilli(now.UnixMilli()))
			}
			if lr.RetryAfter != want {
				add("%s: denied with RetryAfter %v, want %v by SPEC's formula", where, lr.RetryAfter, want)
			}
		}
		if l.Algorithm == throttler.GCRA {
			if lr.ResetAt.Before(now.Truncate(time.Microsecond)) {
				add("%s: ResetAt T0%+v before now T0%+v", where, lr.ResetAt.Sub(T0), now.Sub(T0))
			}
			if lr.ResetAt.Nanosecond()%1000 != 0 {
				add("%s: ResetAt %v is not whole microseconds", where, lr.ResetAt)
			}
		} else if l.Algorithm == throttler.SlidingWindow {
			// ResetAt is now once nothing counts any more.
			if lr.ResetAt.UnixMilli() < now.UnixMilli() || lr.ResetAt.UnixMilli() == now.UnixMilli() && lr.Used != 0 {
				add("%s: sliding-window ResetAt T0%+v before now T0%+v, or at now with %d used", where, lr.ResetAt.Sub(T0), now.Sub(T0), lr.Used)
			}
			if lr.ResetAt.Nanosecond()%1e6 != 0 {
				add("%s: ResetAt %v is not whole milliseconds", where, lr.ResetAt)
			}
		} else {
			if lr.ResetAt.UnixMilli() <= now.UnixMilli() {
				add("%s: fixed-window ResetAt T0%+v not after now T0%+v", where, lr.ResetAt.Sub(T0), now.Sub(T0))
			}
			if lr.ResetAt.Nanosecond()%1e6 != 0 {
				add("%s: ResetAt %v is not whole milliseconds", where, lr.ResetAt)
			}
		}
	}
	if neverFits != r.NeverAllowed {
		add("NeverAllowed = %v for cost %d", r.NeverAllowed, cost)
	}
	if neverFits && (r.Allowed || r.RetryAfter != never) {
		add("cost %d can never fit: Allowed %v, RetryAfter %v, want false, Never", cost, r.Allowed, fmtRetry(r.RetryAfter))
	}
	if r.Allowed && r.RetryAfter != 0 {
		add("allowed with RetryAfter %v, want 0", r.RetryAfter)
	}
	if !r.Allowed && r.RetryAfter <= 0 {
		add("denied with RetryAfter %v, want > 0", r.RetryAfter)
	}
	if binding < 0 {
		add("Binding %q names no limit of the policy", r.Binding)
	} else {
		b := r.Limits()[binding]
		if r.Limit != b.Limit || r.Remaining != b.Remaining || r.Used != b.Used || !r.ResetAt.Equal(b.ResetAt) ||
			r.Window != b.Window || (!r.Allowed && r.RetryAfter != b.RetryAfter) {
			add("top-level figures %s differ from binding limit %q's %s", figures(r.Limit, r.Remaining, r.Used, r.ResetAt, r.RetryAfter),
				b.Name, figures(b.Limit, b.Remaining, b.Used, b.ResetAt, b.RetryAfter))
		}
		if why := bindingViolation(r.Allowed, r.Limits(), binding); why != "" {
			add("Binding %q: %s", r.Binding, why)
		}
	}
	if len(bad) > 0 {
		t.Errorf("%s: %s", label, strings.Join(bad, "; "))
	}
}

func figures(limit, remaining, used int64, resetAt time.Time, retryAfter time.Duration) string {
	return fmt.Sprintf("{Limit %d Remaining %d Used %d ResetAt T0%+v RetryAfter %v}",
		limit, remaining, used, resetAt.Sub(T0), fmtRetry(retryAfter))
}

// bindingViolation explains how the limit at index b breaks SPEC's
// binding-limit rules, or returns "". On allow the binding limit has the
// smallest Remaining, ties going to the latest ResetAt; on deny it is a
// denying limit with the largest RetryAfter.
func bindingViolation(allowed bool, ls []throttler.LimitResult, b int) string {
	if allowed {
		for i, l := range ls {
			if l.Remaining < ls[b].Remaining {
				return fmt.Sprintf("limit %q has less Remaining (%d < %d)", l.Name, l.Remaining, ls[b].Remaining)
			}
			if l.Remaining == ls[b].Remaining && l.ResetAt.After(ls[b].ResetAt) {
				return fmt.Sprintf("limit %q ties on Remaining with a later ResetAt", ls[i].Name)
			}
		}
		return ""
	}
	if ls[b].Allowed {
		return "the binding limit of a denial does not deny"
	}
	for _, l := range ls {
		if !l.Allowed && l.RetryAfter > ls[b].RetryAfter {
			return fmt.Sprintf("denying limit %q has a larger RetryAfter (%v > %v)", l.Name, fmtRetry(l.RetryAfter), fmtRetry(ls[b].RetryAfter))
		}
	}
	return ""
}

// checkLimit compares one per-limit result with expected figures.
func checkLimit(t *testing.T, label string, r throttler.Result, name string, allowed bool, remaining, used int64,
	resetAt, retryAfter time.Duration) {
	t.Helper()
	for _, lr := range r.Limits() {
		if lr.Name != name {
			continue
		}
		got := fmt.Sprintf("Allowed %v Remaining %d Used %d ResetAt T0%+v RetryAfter %v",
			lr.Allowed, lr.Remaining, lr.Used, lr.ResetAt.Sub(T0), fmtRetry(lr.RetryAfter))
		want := fmt.Sprintf("Allowed %v Remaining %d Used %d ResetAt T0%+v RetryAfter %v",
			allowed, remaining, used, resetAt, fmtRetry(retryAfter))
		if got != want {
			t.Errorf("%s: limit %q: got %s, want %s", label, name, got, want)
		}
		return
	}
	t.Errorf("%s: no per-limit result named %q", label, name)
}

// checkBinding checks which limit a result names as binding.
func checkBinding(t *testing.T, label string, r throttler.Result, want string) {
	t.Helper()
	if r.Binding != want {
		t.Errorf("%s: Binding = %q, want %q", label, r.Binding, want)
	}
}

// printable shortens and quotes an identifier for failure messages.
func printable(id string) string {
	if len(id) > 40 {
		return fmt.Sprintf("%q...(%d bytes)", id[:32], len(id))
	}
	return fmt.Sprintf("%q", id)
}

// diffResults lists every field in which got differs from want: the
// top-level figures, the binding limit, and each limit's own figures.
// Subjects, Degraded and Err are not compared.
func diffResults(got, want throttler.Result) []string {
	var d []string
	cmp := func(field string, g, w any) {
		if g != w {
			d = append(d, fmt.Sprintf("%s = %v, want %v", field, g, w))
		}
	}
	cmpTime := func(field string, g, w time.Time) {
		if !g.Equal(w) {
			d = append(d, fmt.Sprintf("%s = T0%+v, want T0%+v", field, g.Sub(T0), w.Sub(T0)))
		}
	}
	cmp("Allowed", got.Allowed, want.Allowed)
	cmp("Limit", got.Limit, want.Limit)
	cmp("Remaining", got.Remaining, want.Remaining)
	cmp("Used", got.Used, want.Used)
	cmpTime("ResetAt", got.ResetAt, want.ResetAt)
	cmp("RetryAfter", fmtRetry(got.RetryAfter), fmtRetry(want.RetryAfter))
	cmp("Binding", got.Binding, want.Binding)
	cmp("Window", got.Window, want.Window)
	cmp("NeverAllowed", got.NeverAllowed, want.NeverAllowed)
	cmp("Granted", got.Granted, want.Granted)
	cmp("Policy", got.Policy, want.Policy)
	cmp("Identifier", got.Identifier, want.Identifier)
	if got.NumLimits() != want.NumLimits() {
		return append(d, fmt.Sprintf("%d per-limit results, want %d", got.NumLimits(), want.NumLimits()))
	}
	for i, g := range got.Limits() {
		w := want.Limits()[i]
		name := fmt.Sprintf("Limits[%d] (%s)", i, w.Name)
		cmp(name+".Name", g.Name, w.Name)
		cmp(name+".Algorithm", g.Algorithm, w.Algorithm)
		cmp(name+".Window", g.Window, w.Window)
		cmp(name+".Allowed", g.Allowed, w.Allowed)
		cmp(name+".Limit", g.Limit, w.Limit)
		cmp(name+".Remaining", g.Remaining, w.Remaining)
		cmp(name+".Used", g.Used, w.Used)
		cmpTime(name+".ResetAt", g.ResetAt, w.ResetAt)
		cmp(name+".RetryAfter", fmtRetry(g.RetryAfter), fmtRetry(w.RetryAfter))
	}
	return d
}
