package conformance

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// testPolicyAllOrNothing: the limits of a policy are decided together: a
// request is allowed only if every limit allows it, and a limit that would
// allow it consumes nothing when another denies.
func testPolicyAllOrNothing(t *testing.T, e *env) {
	p := mustPolicy(t, "all-or-nothing",
		throttler.PerSecond(3).Named("3/s"),
		throttler.PerMinute(5).Named("5/min"),
		throttler.PerHour(10).Named("10/h"))
	rs := e.main.timeline(t, p, "user:42", []step{
		{0, allowN, 3, true, 0, 3, sec, 0},
		{500 * ms, allowN, 1, false, 0, 3, sec, 500 * ms},
		{sec, allowN, 2, true, 0, 5, 60 * sec, 0},
		{sec, allowN, 1, false, 0, 5, 60 * sec, 59 * sec},
		{sec, peek, 0, true, 0, 5, 60 * sec, 0},
		{60 * sec, allowN, 3, true, 0, 3, 61 * sec, 0},
		{61 * sec, allowN, 3, false, 2, 8, hour, hour - 61*sec},
		{61 * sec, allowN, 2, true, 0, 10, hour, 0},
		{62 * sec, allowN, 1, false, 0, 10, hour, hour - 62*sec},
		{62 * sec, peek, 0, true, 0, 10, hour, 0},
	})
	for i, want := range []struct {
		binding string
		limits  [3][3]int64 // per limit: Used, ResetAt in ms after T0, RetryAfter in ms
	}{
		{"3/s", [3][3]int64{{3, 1000, 0}, {3, 60000, 0}, {3, 3600000, 0}}},
		{"3/s", [3][3]int64{{3, 1000, 500}, {3, 60000, 0}, {3, 3600000, 0}}},
		{"5/min", [3][3]int64{{2, 2000, 0}, {5, 60000, 0}, {5, 3600000, 0}}},
		{"5/min", [3][3]int64{{2, 2000, 0}, {5, 60000, 59000}, {5, 3600000, 0}}},
		{"5/min", [3][3]int64{{2, 2000, 0}, {5, 60000, 0}, {5, 3600000, 0}}},
		{"3/s", [3][3]int64{{3, 61000, 0}, {3, 120000, 0}, {8, 3600000, 0}}},
		{"10/h", [3][3]int64{{0, 62000, 0}, {3, 120000, 59000}, {8, 3600000, 3539000}}},
		{"10/h", [3][3]int64{{2, 62000, 0}, {5, 120000, 0}, {10, 3600000, 0}}},
		{"10/h", [3][3]int64{{0, 63000, 0}, {5, 120000, 58000}, {10, 3600000, 3538000}}},
		{"10/h", [3][3]int64{{0, 63000, 0}, {5, 120000, 0}, {10, 3600000, 0}}},
	} {
		label := fmt.Sprintf("t%d", i)
		checkBinding(t, label, rs[i], want.binding)
		for j, name := range []string{"3/s", "5/min", "10/h"} {
			used, resetAt, retryAfter := want.limits[j][0], want.limits[j][1], want.limits[j][2]
			maxUnits := p.Limits()[j].Max
			checkLimit(t, label, rs[i], name, retryAfter == 0, maxUnits-used, used,
				time.Duration(resetAt)*ms, time.Duration(retryAfter)*ms)
		}
	}
}

// testPolicyBindingOnAllow: an allowed result describes the limit with the
// smallest Remaining; ties go to the latest ResetAt, in whichever order the
// policy lists the limits.
func testPolicyBindingOnAllow(t *testing.T, e *env) {
	tie := mustPolicy(t, "binding-tie",
		throttler.PerSecond(3).Named("3/s"),
		throttler.PerMinute(3).Named("3/min"),
		throttler.PerHour(100).Named("100/h"))
	rs := e.main.timeline(t, tie, "user:42", []step{
		{0, allowN, 1, true, 2, 1, 60 * sec, 0},
		{sec, allowN, 1, true, 1, 2, 60 * sec, 0},
		{1500 * ms, allowN, 1, true, 0, 3, 60 * sec, 0},
	})
	for i := range rs {
		checkBinding(t, fmt.Sprintf("tie t%d", i), rs[i], "3/min")
	}
	smallest := mustPolicy(t, "binding-smallest",
		throttler.PerSecond(2).Named("2/s"),
		throttler.PerMinute(10).Named("10/min"))
	r := e.main.timeline(t, smallest, "user:42", []step{{0, allowN, 1, true, 1, 1, sec, 0}})[0]
	checkBinding(t, "smallest", r, "2/s")

	// GCRA 3/min (T = 20s) against fixed 3/10s: after one unit both have 2
	// left; the GCRA bucket is full again later (T0+20s), so it binds,
	// listed first or second.
	gcra := throttler.PerMinute(3).Using(throttler.GCRA).Named("gcra 3/min")
	fixed := throttler.Per(3, 10*sec).Named("fixed 3/10s")
	for i, p := range []*throttler.Policy{
		mustPolicy(t, "binding-gcra-first", gcra, fixed),
		mustPolicy(t, "binding-gcra-second", fixed, gcra),
	} {
		r := e.main.timeline(t, p, "user:42", []step{{0, allowN, 1, true, 2, 1, 20 * sec, 0}})[0]
		checkBinding(t, fmt.Sprintf("order %d", i), r, "gcra 3/min")
	}
}

// testPolicyBindingOnDeny: a denial describes the denying limit with the
// largest RetryAfter, never a limit that would have allowed the request.
func testPolicyBindingOnDeny(t *testing.T, e *env) {
	p := mustPolicy(t, "binding-deny",
		throttler.PerSecond(2).Named("2/s"),
		throttler.PerMinute(5).Named("5/min"))
	rs := e.main.timeline(t, p, "user:42", []step{
		{0, allowN, 2, true, 0, 2, sec, 0},
		{0, allowN, 1, false, 0, 2, sec, sec},
		{sec, allowN, 2, true, 0, 2, 2 * sec, 0},
		{1500 * ms, allowN, 1, false, 0, 2, 2 * sec, 500 * ms},
		{1500 * ms, allowN, 2, false, 1, 4, 60 * sec, 58500 * ms},
		{2 * sec, allowN, 1, true, 0, 5, 60 * sec, 0},
		{2 * sec, allowN, 1, false, 0, 5, 60 * sec, 58 * sec},
	})
	for i, want := range []string{"2/s", "2/s", "2/s", "2/s", "5/min", "5/min", "5/min"} {
		checkBinding(t, fmt.Sprintf("t%d", i), rs[i], want)
	}
	checkLimit(t, "t1", rs[1], "5/min", true, 3, 2, 60*sec, 0)
	checkLimit(t, "t4", rs[4], "2/s", false, 0, 2, 2*sec, 500*ms)
	checkLimit(t, "t6", rs[6], "2/s", true, 1, 1, 3*sec, 0)
}

// testPolicyPerLimitResults: every limit's own figures come back, in the
// policy's order, for a policy mixing the three algorithms.
func testPolicyPerLimitResults(t *testing.T, e *env) {
	// anchored 5/min; aligned 3/h ends 04:00:00 = T0+3354.322s; GCRA 4/min
	// burst 2 has T = 15s, B = 2.
	p := mustPolicy(t, "mixed",
		throttler.PerMinute(5).Named("anchored"),
		throttler.PerHour(3).Using(throttler.AlignedWindow).Named("aligned"),
		throttler.PerMinute(4).WithBurst(2).Named("gcra"))
	const hourEnd = 3354322 * ms
	rs := e.main.timeline(t, p, "user:42", []step{
		{0, allowN, 1, true, 1, 1, 15 * sec, 0},
		{0, allowN, 1, true, 0, 2, 30 * sec, 0},
		{0, allowN, 1, false, 0, 2, 30 * sec, 15 * sec},
		{15 * sec, allowN, 1, true, 0, 3, hourEnd, 0},
		{20 * sec, allowN, 1, false, 0, 3, hourEnd, hourEnd - 20*sec},
		{hourEnd, allowN, 2, true, 0, 2, hourEnd + 30*sec, 0},
	})
	type fig struct {
		allowed         bool
		remaining, used int64
		resetAt, retry  int64 // ms after T0, ms
	}
	want := [][3]fig{
		{{true, 4, 1, 60000, 0}, {true, 2, 1, 3354322, 0}, {true, 1, 1, 15000, 0}},
		{{true, 3, 2, 60000, 0}, {true, 1, 2, 3354322, 0}, {true, 0, 2, 30000, 0}},
		{{true, 3, 2, 60000, 0}, {true, 1, 2, 3354322, 0}, {false, 0, 2, 30000, 15000}},
		{{true, 2, 3, 60000, 0}, {true, 0, 3, 3354322, 0}, {true, 0, 2, 45000, 0}},
		{{true, 2, 3, 60000, 0}, {false, 0, 3, 3354322, 3334322}, {false, 0, 2, 45000, 10000}},
		{{true, 3, 2, 3414322, 0}, {true, 1, 2, 6954322, 0}, {true, 0, 2, 3384322, 0}},
	}
	bindings := []string{"gcra", "gcra", "gcra", "aligned", "aligned", "gcra"}
	for i := range want {
		label := fmt.Sprintf("t%d", i)
		checkBinding(t, label, rs[i], bindings[i])
		for j, name := range []string{"anchored", "aligned", "gcra"} {
			f := want[i][j]
			checkLimit(t, label, rs[i], name, f.allowed, f.remaining, f.used, time.Duration(f.resetAt)*ms, time.Duration(f.retry)*ms)
		}
	}
}

// testAllowAllGivesBack: a request naming several identifiers is allowed
// only if each allows it; when one denies, what the others consumed for it
// is given back, so a denied request costs nothing anywhere.
func testAllowAllGivesBack(t *testing.T, e *env) {
	perIP := mustPolicy(t, "per-ip", throttler.PerMinute(5).Named("5/min"))
	perUser := mustPolicy(t, "per-user", throttler.PerMinute(2).Named("2/min"))
	ip := throttler.Subject{Policy: perIP, Identifier: "ip:203.0.113.9"}
	user := throttler.Subject{Policy: perUser, Identifier: "user:42"}
	allowAll := func(label string, cost int64, subjects ...throttler.Subject) throttler.Result {
		t.Helper()
		r, err := e.main.thr.AllowAll(e.ctx, cost, subjects...)
		if err != nil {
			t.Fatalf("%s: AllowAll: %v", label, err)
		}
		if len(r.Subjects) == 0 {
			t.Fatalf("%s: AllowAll returned no per-subject results", label)
		}
		for i, s := range r.Subjects {
			// Without Refunder, AllowAll reports only the subject whose
			// peek denied, so match results to subjects by identifier.
			for _, sub := range subjects {
				if sub.Identifier == s.Identifier {
					checkInvariants(t, fmt.Sprintf("%s subject %d", label, i), sub.Policy, sub.Identifier, e.main.clock.Now(), cost, s)
				}
			}
		}
		return r
	}
	expectUsed := func(label string, s throttler.Subject, used int64) {
		t.Helper()
		r := e.main.peek(t, label, s.Policy, s.Identifier)
		if r.Used != used || !r.ResetAt.Equal(T0.Add(60*sec)) {
			t.Errorf("%s: %s has Used %d, ResetAt T0%+v; want %d, T0+1m0s", label, s.Identifier, r.Used, r.ResetAt.Sub(T0), used)
		}
	}
	at(0, e.main)
	for i := range 2 {
		r := allowAll(fmt.Sprintf("t%d", i), 1, ip, user)
		if !r.Allowed || len(r.Subjects) != 2 || !r.Subjects[0].Allowed || !r.Subjects[1].Allowed {
			t.Fatalf("t%d: AllowAll(ip, user) = %+v, want allowed for both", i, r)
		}
	}
	at(sec, e.main)
	r := allowAll("t2", 1, ip, user)
	if r.Allowed || r.Identifier != user.Identifier || r.RetryAfter != 59*sec {
		t.Errorf("t2: AllowAll(ip, user) Allowed %v Identifier %q RetryAfter %v; want denied by the user, 59s",
			r.Allowed, r.Identifier, r.RetryAfter)
	}
	expectUsed("t2 ip after the user's denial", ip, 2)
	expectUsed("t2 user", user, 2)

	at(2*sec, e.main)
	r = allowAll("t3", 2, ip, user)
	if r.Allowed {
		t.Errorf("t3: AllowAll(2, ip, user) allowed beyond the user's limit")
	}
	expectUsed("t3 ip after the user's denial of cost 2", ip, 2)

	// Cost 3 fits the IP's limit but can never fit the user's: refused,
	// told apart from an ordinary denial (ErrCostExceedsLimit, or at least
	// RetryAfter Never: without Refunder, AllowAll answers from peeks and
	// returns no error), and the IP's units come back all the same.
	r, err := e.main.thr.AllowAll(e.ctx, 3, ip, user)
	if r.Allowed || !errors.Is(err, throttler.ErrCostExceedsLimit) && (err != nil || r.RetryAfter != never) {
		t.Errorf("t3: AllowAll(3, ip, user): Allowed %v, RetryAfter %v, err %v; want a denial with ErrCostExceedsLimit or RetryAfter Never",
			r.Allowed, fmtRetry(r.RetryAfter), err)
	}
	expectUsed("t3 ip after the user's refusal of cost 3", ip, 2)

	at(3*sec, e.main)
	r = allowAll("t4", 1, user, ip)
	if r.Allowed || r.Identifier != user.Identifier {
		t.Errorf("t4: AllowAll(user, ip) Allowed %v Identifier %q; want denied by the user", r.Allowed, r.Identifier)
	}
	expectUsed("t4 ip, never consulted", ip, 2)
}

// testAllowAllAllowsWhenAllAllow: when every subject allows, each consumes,
// the result binds on the smallest Remaining, and Subjects lists each
// subject's own result in order.
func testAllowAllAllowsWhenAllAllow(t *testing.T, e *env) {
	p := mustPolicy(t, "per-key", throttler.PerMinute(10).Named("10/min"))
	q := mustPolicy(t, "per-org", throttler.PerHour(3).Named("3/h"))
	subjects := []throttler.Subject{
		{Policy: p, Identifier: "key:a"},
		{Policy: q, Identifier: "org:1"},
		{Policy: p, Identifier: "key:b"},
	}
	at(0, e.main)
	r, err := e.main.thr.AllowAll(e.ctx, 2, subjects...)
	if err != nil {
		t.Fatalf("AllowAll: %v", err)
	}
	if !r.Allowed || len(r.Subjects) != 3 {
		t.Fatalf("AllowAll = Allowed %v with %d subjects, want allowed with 3", r.Allowed, len(r.Subjects))
	}
	for i, s := range r.Subjects {
		checkInvariants(t, fmt.Sprintf("subject %d", i), subjects[i].Policy, subjects[i].Identifier, T0, 2, s)
	}
	if r.Identifier != "org:1" || r.Remaining != 1 || !r.ResetAt.Equal(T0.Add(hour)) {
		t.Errorf("AllowAll binds on %q with Remaining %d, ResetAt T0%+v; want org:1, 1, T0+1h",
			r.Identifier, r.Remaining, r.ResetAt.Sub(T0))
	}
	for _, s := range subjects {
		if got := e.main.peek(t, "after", s.Policy, s.Identifier); got.Used != 2 {
			t.Errorf("%s under %s: Used %d, want 2", s.Identifier, s.Policy.Name(), got.Used)
		}
	}
}

// testPolicyRedefinitionKeepsDroppedLimits: deciding under a new definition
// of a policy that drops one of its limits leaves that limit's state as it
// was; deciding again under the old definition finds it (docs/SPEC.md,
// Policies redefined).
func testPolicyRedefinitionKeepsDroppedLimits(t *testing.T, e *env) {
	both := mustPolicy(t, "redefined",
		throttler.PerMinute(3).Named("minute"),
		throttler.PerHour(100).Named("hour"))
	hourOnly := mustPolicy(t, "redefined", throttler.PerHour(100).Named("hour"))
	e.at(0)
	var first throttler.Result
	for i := range 3 {
		first = e.main.allow(t, fmt.Sprintf("t0 #%d under both", i), both, "user", 1)
		if !first.Allowed {
			t.Fatalf("t0 #%d under both: denied, want allowed", i)
		}
	}
	e.at(10 * sec)
	r := e.main.allow(t, "t10s under the hour alone", hourOnly, "user", 1)
	if !r.Allowed || r.Limits()[0].Used != 4 {
		t.Errorf("t10s under the hour alone: allowed %v, hour Used %d; want allowed, 4", r.Allowed, r.Limits()[0].Used)
	}
	e.at(20 * sec)
	r = e.main.allow(t, "t20s under both again", both, "user", 1)
	if r.Allowed {
		t.Errorf("t20s under both again: allowed; the minute limit dropped by the redefinition must still be spent")
	}
	if got := r.Limits()[0]; got.Used != 3 || !got.ResetAt.Equal(first.Limits()[0].ResetAt) {
		t.Errorf("t20s under both again: minute Used %d ResetAt %v; want 3, %v", got.Used, got.ResetAt, first.Limits()[0].ResetAt)
	}
	if got := r.Limits()[1].Used; got != 4 {
		t.Errorf("t20s under both again: hour Used %d, want 4 (units from both definitions)", got)
	}
}
