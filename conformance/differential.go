package conformance

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// SeedEnv names the environment variable that fixes the seed of the
// randomized differential subtest, to replay a failure it reported.
const SeedEnv = "CONFORMANCE_SEED"

// Bounds of the differential subtest: it stops at whichever comes first.
const (
	differentialSequences = 40
	differentialOps       = 60 // per sequence
	differentialTimeBound = 30 * time.Second
)

// testDifferentialAgainstModel replays random sequences of AllowN,
// AllowUpTo, Peek, Refund and Reset, with random costs and clock steps (forward mostly,
// sometimes backwards, sometimes onto a window's end) over random policies,
// through the backend and through Model, and compares every field of every
// result. Each sequence uses fresh policy names and identifiers and starts
// after the previous one ended, so nothing stored by an earlier one
// matters, and it is short enough that a real server's TTLs (real time)
// cannot expire state the manual clock still needs.
func testDifferentialAgainstModel(t *testing.T, e *env) {
	seed := time.Now().UnixNano()
	if s := os.Getenv(SeedEnv); s != "" {
		var err error
		if seed, err = strconv.ParseInt(s, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", SeedEnv, s, err)
		}
	}
	t.Logf("seed %d (replay with %s=%d)", seed, SeedEnv, seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0x7468726f74746c65))
	_, refunds := e.main.backend.(driver.Refunder)
	_, resets := e.main.backend.(driver.Resetter)
	deadline := time.Now().Add(differentialTimeBound)
	ops := 0
	latest := T0
	tally := map[string]int{}
	for seq := 0; seq < differentialSequences && time.Now().Before(deadline); seq++ {
		d := &differential{t: t, e: e, rng: rng, seed: seed, seq: seq, model: NewModel(),
			refunds: refunds, resets: resets, latest: latest, tally: tally}
		d.run()
		ops += len(d.history)
		latest = d.latest
		if t.Failed() {
			return
		}
	}
	t.Logf("%d operations agreed with the model: %d allowed, %d denied (%d of them never allowed), %d denied peeks, %d refunds, %d resets; %d clock steps back",
		ops, tally["allowed"], tally["denied"], tally["never"], tally["denied peek"], tally["refund"], tally["reset"], tally["back"])
}

// differential is one random sequence.
type differential struct {
	t        *testing.T
	e        *env
	rng      *rand.Rand
	seed     int64
	seq      int
	model    *Model
	policies []*throttler.Policy
	ids      []string
	refunds  bool
	resets   bool
	history  []string
	last     throttler.Result
	// latest is the latest clock reading so far, in this sequence or an
	// earlier one.
	latest time.Time
	// tally counts kinds of outcomes, to show what the sequences covered.
	tally map[string]int
}

func (d *differential) run() {
	for k := range 3 {
		d.policies = append(d.policies, d.randomPolicy(fmt.Sprintf("diff-%d-%d", d.seq, k)))
		d.ids = append(d.ids, fmt.Sprintf("id-%d-%d", d.seq, k))
	}
	// Start a few minutes after the previous sequence, at a random phase,
	// sometimes between milliseconds, so aligned windows are met at every
	// phase.
	start := d.latest.Add(2*minute + time.Duration(d.rng.Int64N(int64(minute/ms)))*ms)
	if d.rng.IntN(4) == 0 {
		start = start.Add(time.Duration(d.rng.Int64N(1000)) * us)
	}
	d.e.main.clock.Set(start)
	d.latest = start
	for i := 0; i < differentialOps; i++ {
		d.stepClock()
		if !d.operate(i) {
			return
		}
	}
}

// randomPolicy returns a policy of one to three random limits, of small
// quotas so that sequences reach denials often.
func (d *differential) randomPolicy(name string) *throttler.Policy {
	windows := []time.Duration{ms, 3 * ms, 250 * ms, sec, 1500 * ms, 7 * sec, minute}
	n := 1 + d.rng.IntN(3)
	limits := make([]throttler.Limit, n)
	for i := range limits {
		l := throttler.Per(1+d.rng.Int64N(6), windows[d.rng.IntN(len(windows))]).Named(fmt.Sprintf("l%d", i))
		switch d.rng.IntN(4) {
		case 1:
			l = l.Using(throttler.AlignedWindow)
		case 2:
			l = l.Using(throttler.GCRA)
			if d.rng.IntN(2) == 0 {
				l = l.WithBurst(1 + d.rng.Int64N(8))
			}
		case 3:
			l = l.Using(throttler.SlidingWindow)
		}
		limits[i] = l
	}
	p, err := throttler.NewPolicy(name, limits)
	if err != nil {
		d.t.Fatalf("seed %d: random policy %v: %v", d.seed, limits, err)
	}
	checkNotation(d.t, p)
	return p
}

// stepClock moves the clock: forward mostly, sometimes by less than a
// millisecond, sometimes backwards, sometimes to just around the end of a
// window the last result reported.
//
// The clock never goes back more than 999 ms behind the latest reading:
// SPEC keeps state at least one second after it stops mattering and no
// longer, so a conforming backend may forget a window that closed more
// than a second before the latest request it saw, and a clock going back
// further would find it gone.
func (d *differential) stepClock() {
	clock := d.e.main.clock
	before := clock.Now()
	defer func() {
		now := clock.Now()
		if now.Before(before) {
			d.tally["back"]++
		}
		if floor := d.latest.Add(-999 * ms); now.Before(floor) {
			clock.Set(floor)
		} else if now.After(d.latest) {
			d.latest = now
		}
	}()
	r := d.rng.IntN(100)
	switch {
	case r < 40:
		clock.Advance(time.Duration(d.rng.Int64N(300)) * ms)
	case r < 55:
		clock.Advance(time.Duration(d.rng.Int64N(3000)) * ms)
	case r < 65:
		// Stay.
	case r < 75:
		clock.Advance(time.Duration(1+d.rng.Int64N(2000)) * us)
	case r < 85:
		clock.Advance(-time.Duration(1+d.rng.Int64N(1500)) * ms)
	case r < 90:
		clock.Advance(time.Duration(10+d.rng.Int64N(110)) * sec)
	default:
		if d.last.NumLimits() == 0 {
			return
		}
		end := d.last.Limits()[d.rng.IntN(d.last.NumLimits())].ResetAt
		nudge := []time.Duration{-ms, -us, 0, 0, us, ms}[d.rng.IntN(6)]
		clock.Set(end.Add(nudge))
	}
}

// operate runs one random operation on both sides and compares them. It
// reports false once they disagree.
func (d *differential) operate(i int) bool {
	e := d.e
	p := d.policies[d.rng.IntN(len(d.policies))]
	id := d.ids[d.rng.IntN(len(d.ids))]
	now := e.main.clock.Now()
	minCapacity := capacity(p.Limits()[0])
	for j := 1; j < len(p.Limits()); j++ {
		minCapacity = min(minCapacity, capacity(p.Limits()[j]))
	}
	var (
		what      string
		got, want throttler.Result
		err       error
		wantErr   error
	)
	r := d.rng.IntN(100)
	switch {
	case r < 20:
		what = "Peek"
		got, err = e.main.thr.Peek(e.ctx, p, id)
		want = d.model.Peek(p, id, now)
	case r < 35 && d.refunds:
		n := d.rng.Int64N(5)
		what = fmt.Sprintf("Refund %d", n)
		got, err = e.main.thr.Refund(e.ctx, p, id, n)
		want = d.model.Refund(p, id, now, n)
	case r < 47 && r >= 39:
		n := 1 + d.rng.Int64N(minCapacity+3)
		what = fmt.Sprintf("AllowUpTo %d", n)
		got, err = e.main.thr.AllowUpTo(e.ctx, p, id, n)
		want = d.model.AllowUpTo(p, id, now, n)
	case r < 39 && d.resets:
		what = "Reset"
		d.record(i, now, p, id, what, "")
		if err := e.main.thr.Reset(e.ctx, p, id); err != nil {
			d.fail(i, fmt.Sprintf("Reset: %v", err))
			return false
		}
		d.model.Reset(p, id)
		d.tally["reset"]++
		return true
	default:
		var cost int64
		switch c := d.rng.IntN(100); {
		case c < 55:
			cost = 1
		case c < 70:
			cost = 0
		case c < 85:
			cost = 1 + d.rng.Int64N(minCapacity)
		case c < 93:
			cost = minCapacity
		default:
			cost = minCapacity + 1 + d.rng.Int64N(3)
		}
		what = fmt.Sprintf("AllowN %d", cost)
		if cost > minCapacity {
			wantErr = throttler.ErrCostExceedsLimit
		}
		got, err = e.main.thr.AllowN(e.ctx, p, id, cost)
		want = d.model.AllowN(p, id, now, cost)
	}
	d.record(i, now, p, id, what, describe(got))
	if !errors.Is(err, wantErr) || (wantErr == nil) != (err == nil) {
		d.fail(i, fmt.Sprintf("%s: err = %v, want %v", what, err, wantErr))
		return false
	}
	if got.Degraded {
		d.fail(i, fmt.Sprintf("%s: degraded result, backend failed: %v", what, got.Err))
		return false
	}
	if diffs := diffResults(got, want); len(diffs) > 0 {
		d.fail(i, fmt.Sprintf("%s: backend and model disagree:\n\t%s\n\tmodel: %s",
			what, strings.Join(diffs, "\n\t"), describe(want)))
		return false
	}
	d.last = got
	switch {
	case strings.HasPrefix(what, "Refund"):
		d.tally["refund"]++
	case what == "Peek" && !got.Allowed:
		d.tally["denied peek"]++
	case what == "Peek":
	case got.Allowed:
		d.tally["allowed"]++
	default:
		d.tally["denied"]++
		if got.NeverAllowed {
			d.tally["never"]++
		}
	}
	return true
}

func (d *differential) record(i int, now time.Time, p *throttler.Policy, id, what, result string) {
	d.history = append(d.history, fmt.Sprintf("op %d at T0%+v: %s on %s (%s) for %s -> %s",
		i, now.Sub(T0), what, p.Name(), p, id, result))
}

// fail reports a disagreement with the seed and the sequence so far.
func (d *differential) fail(i int, why string) {
	d.t.Helper()
	from := max(len(d.history)-25, 0)
	d.t.Fatalf("seed %d (replay with %s=%d), sequence %d, op %d: %s\nsequence so far (last %d ops):\n%s",
		d.seed, SeedEnv, d.seed, d.seq, i, why, len(d.history)-from, strings.Join(d.history[from:], "\n"))
}

// describe renders a result compactly for a failure's history.
func describe(r throttler.Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Allowed %v, binding %s: Remaining %d Used %d ResetAt T0%+v RetryAfter %s",
		r.Allowed, r.Binding, r.Remaining, r.Used, r.ResetAt.Sub(T0), fmtRetry(r.RetryAfter))
	for _, l := range r.Limits() {
		fmt.Fprintf(&b, "; %s[%v %d/%d T0%+v %s]", l.Name, l.Allowed, l.Used, l.Limit, l.ResetAt.Sub(T0), fmtRetry(l.RetryAfter))
	}
	return b.String()
}
