package conformance

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// Bounds of RunStateDifferential: it stops at whichever comes first.
const (
	stateSequences = 500
	stateOps       = 40 // per sequence
	stateTimeBound = 20 * time.Second
)

// RunStateDifferential checks a backend's answers at the level of stored
// states, against the package driver's functions, which are the reference
// every backend mirrors. Each random sequence takes a fresh policy of one to
// three limits of random algorithms and a fresh identifier, seeds random
// states into the backend (states that count at now: open windows, windows
// a clock ahead wrote, counts above Max as a lowered Max leaves them, GCRA
// TATs within and beyond the burst), and then runs random Decide, Peek,
// Refund, Take, Seed and Reset calls on it, at clock readings that step
// forward, by less than a millisecond, onto a state's end and back by up to
// 999 ms. The same calls run on a copy of the states through driver.Decide,
// driver.Refund, driver.Take and driver.Seed, and every answer is compared:
// the error (none is expected), Allowed, Granted, and every state of
// Outcome.States and Outcome.Prior as it counts at the call's now
// (driver.InForce), since two stores may hold equivalent states written
// apart. Costs and refunds include the extremes a throttler can send: a
// Take of math.MaxInt64 units and a Refund of math.MaxInt64, where a GCRA
// refund computed as n*T would overflow.
//
// It calls the backend directly, not through a throttler, so a
// disagreement names the operation and the states, not a result's figures.
// The calls alternate between two backends of one harness, which must share
// state as the suite's harnesses do. Peek goes through driver.PeekWith and
// Take through driver.TakeWith, so backends without Peeker or Taker are
// checked on their fallbacks. Refund and Reset run only on a Refunder and a
// Resetter.
//
// Seeding needs driver.Seeder: it is the only way in from outside to put an
// arbitrary state in a store. A backend without it (or a decorator that
// answers errors.ErrUnsupported) is skipped, with a message saying so. The
// seed is logged; set SeedEnv (CONFORMANCE_SEED) to replay a failure.
//
// Run it under -race, in a test of its own beside Run:
//
//	func TestStates(t *testing.T) { conformance.RunStateDifferential(t, newHarness) }
func RunStateDifferential(t *testing.T, newHarness HarnessMaker) {
	t.Helper()
	e := newEnv(t, newHarness)
	seeder, ok := e.main.backend.(driver.Seeder)
	if !ok {
		t.Skip("RunStateDifferential needs driver.Seeder to put arbitrary states into the store; the backend does not implement it")
	}
	seed := time.Now().UnixNano()
	if s := os.Getenv(SeedEnv); s != "" {
		var err error
		if seed, err = strconv.ParseInt(s, 10, 64); err != nil {
			t.Fatalf("%s=%q: %v", SeedEnv, s, err)
		}
	}
	t.Logf("seed %d (replay with %s=%d)", seed, SeedEnv, seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0x7374617465730a))
	other := e.newInstance(0)
	sd := &stateDiff{t: t, ctx: e.ctx, rng: rng, seed: seed, backends: [2]driver.Backend{e.main.backend, other.backend},
		tally: map[string]int{}}
	// Probe: a seed of a state that counts nothing changes nothing, and a
	// decorator over a store that cannot seed answers ErrUnsupported.
	probe := sd.policy("state-probe")
	_, err := seeder.Seed(e.ctx, driver.Request{Policy: probe, Identifier: "probe", Now: T0},
		make([]driver.State, len(probe.Limits)))
	if errors.Is(err, errors.ErrUnsupported) {
		t.Skipf("the backend declares seeding unsupported: %v", err)
	}
	if err != nil {
		t.Fatalf("Seed of states that count nothing: %v", err)
	}
	deadline := time.Now().Add(stateTimeBound)
	start := T0
	ops := 0
	for seq := 0; seq < stateSequences && time.Now().Before(deadline); seq++ {
		// Each sequence starts well after the previous one ended, at a
		// random phase, sometimes between milliseconds, with a fresh
		// policy and identifier.
		start = start.Add(10*minute + time.Duration(rng.Int64N(int64(minute/us)))*us)
		if !sd.sequence(seq, start) {
			return
		}
		ops += len(sd.history)
		start = sd.latest
	}
	t.Logf("%d operations agreed with package driver: %v", ops, sd.tally)
}

// stateDiff is RunStateDifferential's state across sequences.
type stateDiff struct {
	t        *testing.T
	ctx      context.Context
	rng      *rand.Rand
	seed     int64
	backends [2]driver.Backend
	tally    map[string]int
	// One sequence:
	seq     int
	p       *driver.Policy
	id      string
	now     time.Time
	latest  time.Time
	want    []driver.State // the reference states
	history []string
}

// policy returns a random policy named name: one to three limits of small
// quotas, so that sequences reach denials and full buckets often.
func (sd *stateDiff) policy(name string) *driver.Policy {
	windows := []time.Duration{ms, 3 * ms, 250 * ms, sec, 1500 * ms, 7 * sec, minute, time.Hour}
	n := 1 + sd.rng.IntN(3)
	limits := make([]driver.Limit, 0, n)
	for i := range n {
		alg := driver.Algorithm(sd.rng.IntN(4))
		quota := 1 + sd.rng.Int64N(8)
		if sd.rng.IntN(8) == 0 {
			quota = 1000 + sd.rng.Int64N(1_000_000)
		}
		var burst int64
		if alg == driver.GCRA && sd.rng.IntN(2) == 0 {
			burst = 1 + sd.rng.Int64N(10)
		}
		l, err := driver.NewLimit("l"+strconv.Itoa(i), alg, quota, windows[sd.rng.IntN(len(windows))], burst)
		if err != nil {
			sd.t.Fatalf("seed %d: random limit: %v", sd.seed, err)
		}
		limits = append(limits, l)
	}
	p, err := driver.NewPolicy(name, limits...)
	if err != nil {
		sd.t.Fatalf("seed %d: random policy: %v", sd.seed, err)
	}
	return p
}

// sequence runs one random sequence from start; it reports false once the
// backend and the reference disagree.
func (sd *stateDiff) sequence(seq int, start time.Time) bool {
	sd.seq, sd.history = seq, sd.history[:0]
	sd.p = sd.policy(fmt.Sprintf("states-%d", seq))
	sd.id = fmt.Sprintf("id-%d:\x00{x}", seq)
	sd.now, sd.latest = start, start
	sd.want = make([]driver.State, len(sd.p.Limits))
	// Begin from arbitrary stored states.
	if !sd.seedStates(-1) {
		return false
	}
	for i := range stateOps {
		sd.step()
		if !sd.operate(i) {
			return false
		}
	}
	return true
}

// step moves the clock: forward mostly, sometimes by microseconds, onto or
// next to a state's end, or back by up to 999 ms from the latest reading
// (stores keep a state at least MinExpiryGrace after it stops mattering).
func (sd *stateDiff) step() {
	r := sd.rng.IntN(100)
	switch {
	case r < 35:
		sd.now = sd.now.Add(time.Duration(sd.rng.Int64N(300)) * ms)
	case r < 50:
		sd.now = sd.now.Add(time.Duration(sd.rng.Int64N(5000)) * ms)
	case r < 60:
	case r < 70:
		sd.now = sd.now.Add(time.Duration(1+sd.rng.Int64N(2000)) * us)
	case r < 80:
		sd.now = sd.now.Add(-time.Duration(1+sd.rng.Int64N(999)) * ms)
	case r < 85:
		sd.now = sd.now.Add(time.Duration(10+sd.rng.Int64N(100)) * sec)
	default:
		i := sd.rng.IntN(len(sd.p.Limits))
		s := sd.want[i]
		if s.End == 0 {
			return
		}
		var end time.Time
		switch sd.p.Limits[i].Algorithm {
		case driver.GCRA:
			end = time.UnixMicro(s.End)
		case driver.SlidingWindow:
			end = time.UnixMilli(s.End + sd.rng.Int64N(2)*sd.p.Limits[i].WindowMillis)
		default:
			end = time.UnixMilli(s.End)
		}
		sd.now = end.Add([]time.Duration{-ms, -us, 0, 0, us, ms}[sd.rng.IntN(6)])
	}
	if floor := sd.latest.Add(-999 * ms); sd.now.Before(floor) {
		sd.now = floor
	}
	if sd.now.After(sd.latest) {
		sd.latest = sd.now
	}
	sd.now = sd.now.UTC()
}

// randomStates returns one random state per limit, as they might stand at
// now: mostly states that count, some that count nothing.
func (sd *stateDiff) randomStates() []driver.State {
	states := make([]driver.State, len(sd.p.Limits))
	nowMs, nowUs := sd.now.UnixMilli(), sd.now.UnixMicro()
	for i := range states {
		l := &sd.p.Limits[i]
		if sd.rng.IntN(6) == 0 {
			continue // nothing
		}
		used := sd.rng.Int64N(l.Max + 1)
		if sd.rng.IntN(6) == 0 {
			used = l.Max + 1 + sd.rng.Int64N(l.Max+3) // Max was lowered
		}
		w := l.WindowMillis
		switch l.Algorithm {
		case driver.GCRA:
			t, b := l.EmissionMicros, l.Capacity
			var tat int64
			switch sd.rng.IntN(5) {
			case 0:
				tat = nowUs - sd.rng.Int64N(t*b+1) // counts nothing
			case 1:
				tat = nowUs + b*t + 1 + sd.rng.Int64N(3*t) // beyond the burst
			default:
				tat = nowUs + sd.rng.Int64N(b+1)*t + sd.rng.Int64N(t)
			}
			states[i] = driver.State{End: max(tat, 0)}
		case driver.SlidingWindow:
			e := (nowMs/w + 1) * w
			ends := []int64{e, e, e - w, e + w, e - 2*w}
			prev := sd.rng.Int64N(l.Max + 1)
			states[i] = driver.State{Used: used, End: ends[sd.rng.IntN(len(ends))], Prev: prev}
		case driver.AlignedWindow:
			e := (nowMs/w + 1) * w
			ends := []int64{e, e, e + w, e - w}
			states[i] = driver.State{Used: used, End: ends[sd.rng.IntN(len(ends))]}
		default:
			var end int64
			switch sd.rng.IntN(5) {
			case 0:
				end = nowMs - sd.rng.Int64N(w+1) // closed
			case 1:
				end = nowMs + w + 1 + sd.rng.Int64N(30_000) // a clock ahead opened it
			default:
				end = nowMs + 1 + sd.rng.Int64N(w)
			}
			states[i] = driver.State{Used: used, End: end}
		}
	}
	return states
}

// operate runs one random operation on the backend and on the reference,
// and compares them.
func (sd *stateDiff) operate(i int) bool {
	b := sd.backends[sd.rng.IntN(2)]
	req := driver.Request{Policy: sd.p, Identifier: sd.id, Now: sd.now}
	if sd.rng.IntN(2) == 0 {
		req.Buffer = make([]driver.State, 0, len(sd.p.Limits))
	}
	r := sd.rng.IntN(100)
	_, refunds := b.(driver.Refunder)
	_, resets := b.(driver.Resetter)
	switch {
	case r < 8:
		return sd.seedStates(i)
	case r < 20:
		sd.tally["peek"]++
		want := append([]driver.State(nil), sd.want...)
		allowed := driver.Decide(sd.p, sd.now, 0, want)
		out, err := driver.PeekWith(sd.ctx, b, req)
		return sd.compare(i, "Peek", out, err, allowed, 0, nil)
	case r < 32 && refunds:
		n := sd.rng.Int64N(4)
		switch sd.rng.IntN(8) {
		case 0:
			n = math.MaxInt64
		case 1:
			n = sd.p.Capacity + sd.rng.Int64N(1<<20)
		}
		req.Cost = n
		sd.tally["refund"]++
		driver.Refund(sd.p, sd.now, n, sd.want)
		out, err := b.(driver.Refunder).Refund(sd.ctx, req)
		return sd.compare(i, fmt.Sprintf("Refund %d", n), out, err, true, 0, nil)
	case r < 35 && resets:
		sd.tally["reset"]++
		clear(sd.want)
		sd.record(i, "Reset", "")
		if err := b.(driver.Resetter).Reset(sd.ctx, sd.p, sd.id); err != nil {
			return sd.fail(i, fmt.Sprintf("Reset: %v", err))
		}
		return true
	case r < 50:
		n := 1 + sd.rng.Int64N(sd.p.Capacity+2)
		if sd.rng.IntN(10) == 0 {
			n = math.MaxInt64
		}
		req.Cost = n
		granted := driver.Take(sd.p, sd.now, n, sd.want)
		sd.tally["take"]++
		out, err := driver.TakeWith(sd.ctx, b, req)
		return sd.compare(i, fmt.Sprintf("Take %d", n), out, err, granted > 0, granted, nil)
	default:
		var cost int64
		switch c := sd.rng.IntN(10); {
		case c < 5:
			cost = 1
		case c < 7:
			cost = 0
		default:
			cost = sd.rng.Int64N(sd.p.Capacity + 1)
		}
		req.Cost = cost
		allowed := driver.Decide(sd.p, sd.now, cost, sd.want)
		if allowed && cost > 0 {
			sd.tally["allowed"]++
		} else if !allowed {
			sd.tally["denied"]++
		}
		out, err := b.Decide(sd.ctx, req)
		return sd.compare(i, fmt.Sprintf("Decide %d", cost), out, err, allowed, 0, nil)
	}
}

// seedStates seeds random states with a random cost (i < 0: the first
// seed of a sequence, cost 0) and compares the outcome.
func (sd *stateDiff) seedStates(i int) bool {
	given := sd.randomStates()
	var cost int64
	if i >= 0 && sd.rng.IntN(2) == 0 {
		cost = sd.rng.Int64N(sd.p.Capacity + 1)
	}
	prior := append([]driver.State(nil), sd.want...)
	allowed := driver.Seed(sd.p, sd.now, cost, sd.want, given)
	sd.tally["seed"]++
	b := sd.backends[sd.rng.IntN(2)].(driver.Seeder)
	req := driver.Request{Policy: sd.p, Identifier: sd.id, Cost: cost, Now: sd.now}
	out, err := b.Seed(sd.ctx, req, append([]driver.State(nil), given...))
	return sd.compare(i, fmt.Sprintf("Seed %d of %s", cost, describeStates(sd.p, given)), out, err, allowed, 0, prior)
}

// compare checks one outcome against the reference's verdict, granted units,
// states (sd.want, already updated) and, for a seed, prior states.
func (sd *stateDiff) compare(i int, what string, out driver.Outcome, err error, allowed bool, granted int64, prior []driver.State) bool {
	sd.t.Helper()
	sd.record(i, what, fmt.Sprintf("Allowed %v Granted %d States %s", out.Allowed, out.Granted, describeStates(sd.p, out.States)))
	if err != nil {
		return sd.fail(i, fmt.Sprintf("%s: unexpected error: %v", what, err))
	}
	var d []string
	if out.Allowed != allowed {
		d = append(d, fmt.Sprintf("Allowed = %v, want %v", out.Allowed, allowed))
	}
	if out.Granted != granted {
		d = append(d, fmt.Sprintf("Granted = %d, want %d", out.Granted, granted))
	}
	d = append(d, diffStates("States", sd.p, sd.now, out.States, sd.want)...)
	if prior != nil {
		d = append(d, diffStates("Prior", sd.p, sd.now, out.Prior, prior)...)
	}
	if len(d) > 0 {
		return sd.fail(i, fmt.Sprintf("%s: backend and package driver disagree: %s (driver's states %s)",
			what, strings.Join(d, "; "), describeStates(sd.p, sd.want)))
	}
	return true
}

func (sd *stateDiff) record(i int, what, result string) {
	sd.history = append(sd.history, fmt.Sprintf("op %d at %s: %s -> %s", i, sinceT0(sd.now), what, result))
}

// fail reports a disagreement with the seed, the policy and the sequence so
// far, and reports false.
func (sd *stateDiff) fail(i int, why string) bool {
	sd.t.Helper()
	from := max(len(sd.history)-25, 0)
	var limits []string
	for _, l := range sd.p.Limits {
		limits = append(limits, l.Name+"="+driver.Notation(l.Algorithm, l.Max, l.Window, l.Burst))
	}
	sd.t.Errorf("seed %d (replay with %s=%d), sequence %d, op %d, policy %s [%s], identifier %q: %s\nsequence so far (last %d ops):\n%s",
		sd.seed, SeedEnv, sd.seed, sd.seq, i, sd.p.Name, strings.Join(limits, ", "), sd.id, why,
		len(sd.history)-from, strings.Join(sd.history[from:], "\n"))
	return false
}
