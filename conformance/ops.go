package conformance

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// testPeekNeverChangesState: peeks, however many, at a fresh, a partly
// used and an exhausted state, change nothing: repeated peeks agree, and
// exactly the units left before them are there after them.
func testPeekNeverChangesState(t *testing.T, e *env) {
	// GCRA 5/min: T = 12s.
	p := mustPolicy(t, "peeks",
		throttler.PerMinute(5).Named("anchored"),
		throttler.PerMinute(5).Using(throttler.GCRA).Named("gcra"))
	samePeeks := func(label string, n int) {
		t.Helper()
		first := e.main.peek(t, label, p, "peeked")
		for i := 1; i < n; i++ {
			if d := diffResults(e.main.peek(t, label, p, "peeked"), first); len(d) > 0 {
				t.Fatalf("%s: peek %d differs from the first: %s", label, i, strings.Join(d, "; "))
			}
		}
	}
	e.at(0)
	samePeeks("fresh", 5)
	e.main.timeline(t, p, "peeked", []step{{0, allowN, 2, true, 3, 2, 60 * sec, 0}})
	e.at(sec)
	samePeeks("partly used", 10)
	e.main.timeline(t, p, "peeked", []step{{sec, allowN, 3, true, 0, 5, 60 * sec, 0}})
	e.at(2 * sec)
	samePeeks("exhausted", 5)
	e.main.timeline(t, p, "peeked", []step{
		{2 * sec, allowN, 1, false, 0, 5, 60 * sec, 58 * sec},
		{2 * sec, peek, 0, true, 0, 5, 60 * sec, 0},
	})
}

// testPeekerMatchesDecide: a backend's Peek (a second route, perhaps served
// by a replica) answers exactly what Decide with cost 0 answers, over
// fresh, used, exhausted and closed windows and a clock that went back.
func testPeekerMatchesDecide(t *testing.T, e *env) {
	pk, ok := e.main.backend.(driver.Peeker)
	if !ok {
		t.Skip("backend does not implement driver.Peeker")
	}
	p := mustPolicy(t, "two-routes",
		throttler.PerMinute(3).Named("anchored"),
		throttler.PerHour(10).Using(throttler.AlignedWindow).Named("aligned"),
		throttler.PerMinute(6).WithBurst(3).Named("gcra"))
	compare := func(label string) {
		t.Helper()
		now := e.main.clock.Now()
		req := driver.Request{Policy: compile(t, p), Identifier: "routes", Now: now}
		peeked, err := pk.Peek(e.ctx, req)
		if err != nil {
			t.Fatalf("%s: backend Peek: %v", label, err)
		}
		decided, err := e.main.backend.Decide(e.ctx, req)
		if err != nil {
			t.Fatalf("%s: backend Decide with cost 0: %v", label, err)
		}
		if len(peeked.States) != len(p.Limits()) || len(decided.States) != len(p.Limits()) {
			t.Fatalf("%s: Peek returned %d states and Decide %d, want %d", label, len(peeked.States), len(decided.States), len(p.Limits()))
		}
		a := evaluate(req.Policy, now, peeked.Allowed, peeked.States)
		b := evaluate(req.Policy, now, decided.Allowed, decided.States)
		if d := diffStatuses(a, b); len(d) > 0 {
			t.Errorf("%s: Peek and Decide(cost 0) disagree: %s", label, strings.Join(d, "; "))
		}
		viaPeek := e.main.peek(t, label, p, "routes")
		viaAllow := e.main.allow(t, label, p, "routes", 0)
		if d := diffResults(viaPeek, viaAllow); len(d) > 0 {
			t.Errorf("%s: Throttler.Peek and AllowN(0) disagree: %s", label, strings.Join(d, "; "))
		}
	}
	e.at(0)
	compare("fresh")
	e.main.allow(t, "t0", p, "routes", 1)
	compare("used")
	e.main.allow(t, "t0", p, "routes", 2)
	compare("exhausted")
	e.at(30 * sec)
	compare("exhausted, later")
	e.at(60 * sec)
	compare("anchored window closed")
	e.at(-20 * sec)
	compare("clock went back")
}

// testRefundFixedWindow: Refund(n) gives back up to n units of the current
// window, never below 0, and leaves the window (and its ResetAt) open.
func testRefundFixedWindow(t *testing.T, e *env) {
	e.requireRefunder()
	p := mustPolicy(t, "refunds", throttler.PerHour(10).Named("10/h"))
	e.main.timeline(t, p, "refunded", []step{
		{0, allowN, 4, true, 6, 4, hour, 0},
		{sec, refund, 1, true, 7, 3, hour, 0},
		{2 * sec, refund, 10, true, 10, 0, hour, 0},
		{3 * sec, allowN, 1, true, 9, 1, hour, 0},
		{4 * sec, allowN, 9, true, 0, 10, hour, 0},
		{5 * sec, allowN, 1, false, 0, 10, hour, hour - 5*sec},
		{6 * sec, refund, 0, true, 0, 10, hour, 0},
		{7 * sec, refund, 2, true, 2, 8, hour, 0},
		{8 * sec, allowN, 2, true, 0, 10, hour, 0},
		{9 * sec, allowN, 1, false, 0, 10, hour, hour - 9*sec},
	})
}

// testRefundGCRA: a GCRA refund moves TAT back by n*T, never below now, and
// does nothing once TAT has passed.
func testRefundGCRA(t *testing.T, e *env) {
	e.requireRefunder()
	// 10/min: T = 6s, B = 10.
	p := mustPolicy(t, "gcra-refunds", throttler.PerMinute(10).Using(throttler.GCRA).Named("10/min gcra"))
	e.main.timeline(t, p, "refunded", []step{
		{0, allowN, 3, true, 7, 3, 18 * sec, 0},
		{0, refund, 1, true, 8, 2, 12 * sec, 0},
		{sec, refund, 5, true, 10, 0, sec, 0},
		{sec, allowN, 10, true, 0, 10, 61 * sec, 0},
		{30 * sec, refund, 2, true, 6, 4, 49 * sec, 0},
		{30 * sec, refund, 100, true, 10, 0, 30 * sec, 0},
		// TAT stopped at T0+30s, not below: 6s earlier it still shows.
		{24 * sec, peek, 0, true, 9, 1, 30 * sec, 0},
		{30 * sec, allowN, 10, true, 0, 10, 90 * sec, 0},
		{200 * sec, refund, 1, true, 10, 0, 200 * sec, 0},
		{200 * sec, allowN, 10, true, 0, 10, 260 * sec, 0},
	})
}

// testRefundAfterWindowClosed: a refund touches only the current window:
// after a window closed it does nothing and opens nothing, and in a policy
// it gives back to the limits whose windows are still open.
func testRefundAfterWindowClosed(t *testing.T, e *env) {
	e.requireRefunder()
	p := mustPolicy(t, "late-refunds", throttler.PerMinute(3).Named("3/min"))
	e.main.timeline(t, p, "late", []step{
		{0, allowN, 3, true, 0, 3, 60 * sec, 0},
		{60 * sec, refund, 2, true, 3, 0, 120 * sec, 0},
		{60 * sec, allowN, 3, true, 0, 3, 120 * sec, 0},
		{61 * sec, refund, 1, true, 1, 2, 120 * sec, 0},
		{121 * sec, refund, 3, true, 3, 0, 181 * sec, 0},
		{130 * sec, allowN, 1, true, 2, 1, 190 * sec, 0},
	})
	e.main.timeline(t, p, "never-used", []step{
		{0, refund, 5, true, 3, 0, 60 * sec, 0},
		{10 * sec, allowN, 1, true, 2, 1, 70 * sec, 0},
	})
	mixed := mustPolicy(t, "late-refunds-mixed", throttler.PerSecond(1).Named("1/s"), throttler.PerMinute(5).Named("5/min"))
	at(0, e.main)
	e.main.allow(t, "t0", mixed, "mixed", 1)
	at(sec, e.main)
	r := e.main.refund(t, "t1 refund", mixed, "mixed", 1)
	checkLimit(t, "t1 refund", r, "1/s", true, 1, 0, 2*sec, 0)
	checkLimit(t, "t1 refund", r, "5/min", true, 5, 0, 60*sec, 0)
	r = e.main.allow(t, "t1 allow", mixed, "mixed", 1)
	checkLimit(t, "t1 allow", r, "1/s", true, 0, 1, 2*sec, 0)
	checkLimit(t, "t1 allow", r, "5/min", true, 4, 1, 60*sec, 0)
}

// testResetForgetsState: Reset forgets one identifier's state for one
// policy, every limit of it, and nothing else.
func testResetForgetsState(t *testing.T, e *env) {
	e.requireResetter()
	limits := []throttler.Limit{
		throttler.PerMinute(3).Named("anchored"),
		throttler.PerHour(3).Using(throttler.AlignedWindow).Named("aligned"),
		throttler.PerMinute(3).Using(throttler.GCRA).Named("gcra"),
	}
	p := mustPolicy(t, "resettable", limits...)
	q := mustPolicy(t, "other-policy", limits...)
	at(0, e.main)
	e.main.allow(t, "t0", p, "victim", 3)
	e.main.allow(t, "t0", p, "bystander", 2)
	e.main.allow(t, "t0", q, "victim", 1)
	at(10*sec, e.main)
	e.main.reset(t, "t1", p, "victim")
	r := e.main.peek(t, "t1 after reset", p, "victim")
	checkLimit(t, "t1 after reset", r, "anchored", true, 3, 0, 70*sec, 0)
	checkLimit(t, "t1 after reset", r, "aligned", true, 3, 0, 3354322*ms, 0)
	checkLimit(t, "t1 after reset", r, "gcra", true, 3, 0, 10*sec, 0)
	at(20*sec, e.main)
	r = e.main.allow(t, "t2", p, "victim", 1)
	checkLimit(t, "t2", r, "anchored", true, 2, 1, 80*sec, 0)
	checkLimit(t, "t2", r, "gcra", true, 2, 1, 40*sec, 0)
	r = e.main.peek(t, "t2 bystander", p, "bystander")
	checkLimit(t, "t2 bystander", r, "anchored", true, 1, 2, 60*sec, 0)
	checkLimit(t, "t2 bystander", r, "aligned", true, 1, 2, 3354322*ms, 0)
	r = e.main.peek(t, "t2 other policy", q, "victim")
	checkLimit(t, "t2 other policy", r, "anchored", true, 2, 1, 60*sec, 0)
	checkLimit(t, "t2 other policy", r, "aligned", true, 2, 1, 3354322*ms, 0)
	for i := range 2 {
		e.main.reset(t, fmt.Sprintf("reset of a never-used identifier, %d", i), p, "never-used")
	}
}

// compile returns the backend's view of p: the very driver.Policy a
// throttler sends with every request under p, read from such a request.
// Rebuilding it from p.Limits would not do: an unnamed limit's Name there
// is its notation, which driver.NewLimit would take for a name, and so a
// key of its own.
func compile(t *testing.T, p *throttler.Policy) *driver.Policy {
	t.Helper()
	rec := &policyRecorder{}
	thr, err := throttler.New(rec, throttler.WithClock(throttlertest.NewManualClock(T0)), throttler.WithLogger(nil))
	if err != nil {
		t.Fatalf("throttler.New over a recorder: %v", err)
	}
	if _, err := thr.Peek(context.Background(), p, "compile"); err != nil {
		t.Fatalf("compiling policy %q: %v", p.Name(), err)
	}
	if !rec.policy.Valid() {
		t.Fatalf("compiling policy %q: the throttler sent no valid policy", p.Name())
	}
	return rec.policy
}

// policyRecorder is a backend that keeps the policy of the last request
// it was sent and holds nothing.
type policyRecorder struct{ policy *driver.Policy }

func (r *policyRecorder) Decide(_ context.Context, req driver.Request) (driver.Outcome, error) {
	r.policy = req.Policy
	return driver.Outcome{Allowed: true, States: make([]driver.State, len(req.Policy.Limits))}, nil
}

// evaluate returns every limit's figures for a peek's states.
func evaluate(p *driver.Policy, now time.Time, allowed bool, states []driver.State) []driver.Status {
	out := make([]driver.Status, len(p.Limits))
	for i := range p.Limits {
		out[i] = driver.Evaluate(&p.Limits[i], states[i], now, 0, allowed)
	}
	return out
}

// diffStatuses lists how two sets of per-limit figures differ.
func diffStatuses(a, b []driver.Status) []string {
	var d []string
	for i := range a {
		if a[i] != b[i] && !(a[i].ResetAt.Equal(b[i].ResetAt) && sameButTime(a[i], b[i])) {
			d = append(d, fmt.Sprintf("limit %d: %+v vs %+v", i, a[i], b[i]))
		}
	}
	return d
}

func sameButTime(a, b driver.Status) bool {
	a.ResetAt, b.ResetAt = time.Time{}, time.Time{}
	return a == b
}
