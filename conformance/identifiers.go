package conformance

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/throttlekit/throttlekit/throttler"
)

// SPEC "Words" (identifiers are arbitrary bytes, 1 to 1024 of them) and
// "Keys" 1, 2 and 4: distinct identifiers, policies and limits never share
// state, whatever bytes they hold and however a backend joins them into a
// key.

// keyed is one (policy, identifier) pair of a collision check.
type keyed struct {
	p  *throttler.Policy
	id string
}

// expectIndependent consumes i+1 units for the i-th pair, then checks each
// pair's Used is exactly its own: any two pairs that share state show the
// sum of both.
func expectIndependent(t *testing.T, e *env, pairs []keyed) {
	t.Helper()
	e.at(0)
	for i, k := range pairs {
		e.main.allow(t, fmt.Sprintf("pair %d (%s, %s)", i, k.p.Name(), printable(k.id)), k.p, k.id, int64(i+1))
	}
	for _, in := range []*instance{e.main, e.newInstance(0)} {
		for i, k := range pairs {
			label := fmt.Sprintf("pair %d (%s, %s)", i, k.p.Name(), printable(k.id))
			r := in.peek(t, label, k.p, k.id)
			for _, lr := range r.Limits() {
				if lr.Used != int64(i+1) {
					t.Errorf("%s: limit %q Used %d, want %d: it shares state with another pair", label, lr.Name, lr.Used, i+1)
				}
			}
		}
	}
}

// testIdentifierEmptyRejected: the empty identifier is invalid input for
// every operation, reported with ErrInvalidIdentifier.
func testIdentifierEmptyRejected(t *testing.T, e *env) {
	p := mustPolicy(t, "ids", throttler.PerMinute(5))
	expectInvalid(t, e, p, "", throttler.ErrInvalidIdentifier)
}

// testIdentifierLength: 1024 bytes is the longest valid identifier; 1025
// bytes is invalid input.
func testIdentifierLength(t *testing.T, e *env) {
	p := mustPolicy(t, "ids", throttler.PerMinute(5))
	expectInvalid(t, e, p, strings.Repeat("x", 1025), throttler.ErrInvalidIdentifier)
	expectInvalid(t, e, p, strings.Repeat("\xff", 4096), throttler.ErrInvalidIdentifier)
	expectIndependent(t, e, []keyed{
		{p, strings.Repeat("x", 1024)},
		{p, strings.Repeat("\xff", 1024)},
		{p, strings.Repeat("{", 1024)},
		{p, strings.Repeat(" ", 1024)},
	})
}

// testIdentifierArbitraryBytes: identifiers holding braces, spaces, control
// bytes, NUL, invalid UTF-8 and key separators all work and never share
// state with each other.
func testIdentifierArbitraryBytes(t *testing.T, e *env) {
	p := mustPolicy(t, "bytes", throttler.PerHour(1000).Named("1000/h"))
	ids := []string{
		"a", "A", "a ", " a", "a b", "a\tb", "a\nb", "a\r\nb", "\n", " ",
		"\x00", "a\x00", "a\x00b", "a\x00c",
		"{a}", "a", "}{", "{", "}", "{}", "{a}b", "{a}c", "{{a}}",
		"\xff", "\xfe\xff", "\xc3\x28", "\xc3\xa9", "e\u0301", "😀",
		"a:b", "a::b", "a%3Ab", "a%b", "a%25b", "a%", "a_b", "a-b", "a.b", "a/b", "a|b", "a*", "*", "?",
		"\x7f", "\x1b[0m", "user:42", "USER:42",
	}
	var pairs []keyed
	seen := map[string]bool{}
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			pairs = append(pairs, keyed{p, id})
		}
	}
	expectIndependent(t, e, pairs)
}

// testIdentifierLongNearDuplicates: long identifiers that differ only in
// their last byte, or around the 250-byte memcached key limit, never
// collide: a backend that truncates or hashes them must do so injectively.
func testIdentifierLongNearDuplicates(t *testing.T, e *env) {
	p := mustPolicy(t, "long", throttler.PerHour(1000).Named("1000/h"))
	prefix := strings.Repeat("x", 1023)
	var pairs []keyed
	for _, last := range []string{"a", "b", "\x00", "\xff", "{", " "} {
		pairs = append(pairs, keyed{p, prefix + last})
	}
	for _, n := range []int{249, 250, 251, 252} {
		pairs = append(pairs, keyed{p, strings.Repeat("k", n)})
	}
	pairs = append(pairs, keyed{p, "a" + strings.Repeat("z", 1023)}, keyed{p, "b" + strings.Repeat("z", 1023)})
	expectIndependent(t, e, pairs)
}

// testKeyJoinCollisions: (policy, limit, identifier) triples that a naive
// key join would merge (a_b + c vs a + b_c, with any separator or escape
// character) never share state. Each policy name has one definition here;
// limit-name collisions live side by side in one policy.
func testKeyJoinCollisions(t *testing.T, e *env) {
	policies := map[string]*throttler.Policy{}
	for name, limitNames := range map[string][]string{
		"a_b": {"l"}, "a": {"l"}, "a:b": {"l"}, "a%3Ab": {"l"},
		"x": {"l_y", "l", "l:y"}, "x:": {"l"},
		"p{": {"l"}, "p": {"l", "l{", "l:fixed:3600000"}, "{p}": {"l"},
		"p p": {"l"}, "p\x00": {"l"},
	} {
		limits := make([]throttler.Limit, len(limitNames))
		for i, n := range limitNames {
			limits[i] = throttler.PerHour(1000).Named(n)
		}
		policies[name] = mustPolicy(t, name, limits...)
	}
	pairs := []keyed{
		{policies["a_b"], "c"}, {policies["a"], "b_c"},
		{policies["a:b"], "c"}, {policies["a"], "b:c"},
		{policies["a%3Ab"], "c"}, {policies["a"], "b%3Ac"},
		// x's limit l_y for z against its limit l for y_z, and so on.
		{policies["x"], "z"}, {policies["x"], "y_z"}, {policies["x"], "y:z"}, {policies["x"], ":z"},
		{policies["x:"], "z"},
		{policies["p{"], "}x"}, {policies["p"], "{}x"}, {policies["p"], "}x"},
		{policies["p"], "{p}"}, {policies["{p}"], "x"},
		{policies["p"], "a"}, {policies["p"], "fixed:3600000:a"},
		{policies["p p"], "a"}, {policies["p"], "p a"},
		{policies["p\x00"], "a"}, {policies["p"], "\x00a"},
	}
	expectIndependent(t, e, pairs)
}

// testPoliciesNeverShareCounters: a limit of the same name and quota in two
// policies counts separately.
func testPoliciesNeverShareCounters(t *testing.T, e *env) {
	api := mustPolicy(t, "api", throttler.PerMinute(5).Named("per-minute"))
	search := mustPolicy(t, "search", throttler.PerMinute(5).Named("per-minute"))
	e.main.timeline(t, api, "user:42", []step{
		{0, allowN, 5, true, 0, 5, 60 * sec, 0},
		{0, allowN, 1, false, 0, 5, 60 * sec, 60 * sec},
	})
	e.main.timeline(t, search, "user:42", []step{
		{sec, allowN, 5, true, 0, 5, 61 * sec, 0},
		{sec, allowN, 1, false, 0, 5, 61 * sec, 60 * sec},
	})
}

// testLimitsNeverShareCounters: a policy redefined under the same name with
// a limit of the same name but another window or algorithm never counts
// the old limit's units. SPEC does not say whether the old definition's
// state must survive the new one's use (backend/memory keeps one
// definition per policy name and forgets limits the new one dropped), so
// going back to it may find its own units or none, never another's.
func testLimitsNeverShareCounters(t *testing.T, e *env) {
	variants := []*throttler.Policy{
		mustPolicy(t, "p", throttler.PerMinute(5).Named("l")),
		mustPolicy(t, "p", throttler.PerHour(5).Named("l")),
		mustPolicy(t, "p", throttler.PerMinute(5).Using(throttler.AlignedWindow).Named("l")),
		mustPolicy(t, "p", throttler.PerMinute(5).Using(throttler.GCRA).Named("l")),
	}
	e.at(0)
	for i, p := range variants {
		label := fmt.Sprintf("definition %d (%s)", i, p)
		if r := e.main.allow(t, label, p, "user:42", int64(i+1)); r.Used != int64(i+1) {
			t.Errorf("%s: Used %d after its first %d units: it counts another definition's units", label, r.Used, i+1)
		}
	}
	kept := 0
	for i, p := range variants {
		label := fmt.Sprintf("definition %d (%s) again", i, p)
		switch used := e.main.peek(t, label, p, "user:42").Used; used {
		case int64(i + 1):
			kept++
		case 0:
		default:
			t.Errorf("%s: Used %d, want its own %d (or 0 if the backend forgot it)", label, used, i+1)
		}
	}
	t.Logf("%d of %d definitions kept their state after the others were used", kept, len(variants))
}

// expectInvalid checks every operation rejects (p, id) with an error
// matching want, without panicking and without a backend call.
func expectInvalid(t *testing.T, e *env, p *throttler.Policy, id string, want error) {
	t.Helper()
	thr := e.main.thr
	ops := []struct {
		name string
		call func() error
	}{
		{"AllowN", func() error { _, err := thr.AllowN(e.ctx, p, id, 1); return err }},
		{"Allow", func() error { _, err := thr.Allow(e.ctx, p, id); return err }},
		{"Peek", func() error { _, err := thr.Peek(e.ctx, p, id); return err }},
		{"Refund", func() error { _, err := thr.Refund(e.ctx, p, id, 1); return err }},
		{"Reset", func() error { return thr.Reset(e.ctx, p, id) }},
		{"AllowAll", func() error {
			_, err := thr.AllowAll(e.ctx, 1, throttler.Subject{Policy: p, Identifier: id})
			return err
		}},
	}
	for _, op := range ops {
		err := callNoPanic(op.call)
		if !errors.Is(err, want) {
			t.Errorf("%s(%s): err = %v, want %v", op.name, printable(id), err, want)
		}
	}
}

// callNoPanic turns a panic into an error, so one bad call fails its check
// instead of the whole suite.
func callNoPanic(call func() error) (err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("panic: %v", v)
		}
	}()
	return call()
}

// testManyIdentifiersKeepTheirState: thousands of identifiers, each
// charged once at one instant, all keep their unit. A store that sweeps,
// evicts or rehashes as it grows must never drop live state on the way
// (the memory backend once lost the entry whose insert triggered a sweep).
func testManyIdentifiersKeepTheirState(t *testing.T, e *env) {
	const n = 6000
	p := mustPolicy(t, "many", throttler.PerHour(5), throttler.PerMinute(3).Using(throttler.GCRA).Named("gcra"))
	e.at(0)
	for i := 0; i < n; i++ {
		e.main.allow(t, fmt.Sprint("charge ", i), p, fmt.Sprint("many:", i), 1)
	}
	lost := 0
	for i := 0; i < n; i++ {
		r := e.main.peek(t, fmt.Sprint("peek ", i), p, fmt.Sprint("many:", i))
		for _, lr := range r.Limits() {
			if lr.Used != 1 {
				lost++
				if lost <= 5 {
					t.Errorf("identifier many:%d limit %q: Used %d, want 1", i, lr.Name, lr.Used)
				}
			}
		}
	}
	if lost > 0 {
		t.Errorf("%d of %d limit states lost their unit", lost, 2*n)
	}
}
