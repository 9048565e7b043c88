package conformance_test

import (
	"context"
	"errors"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/conformance"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// The suite is checked both ways: a correct reference backend passes it,
// and each deliberately broken variant of that backend fails it in the
// subtests meant to catch that fault.

// TestConformance runs the suite against the reference backend, which
// implements every optional interface.
func TestConformance(t *testing.T) {
	conformance.Run(t, referenceMaker(correct, false))
}

// TestConformanceMinimalBackend runs the suite against a reference backend
// with Decide alone: the optional capabilities' subtests skip, and
// AllowAll's peek-first fallback still gives nothing away.
func TestConformanceMinimalBackend(t *testing.T) {
	conformance.Run(t, referenceMaker(correct, true))
}

// TestSubtestNames checks the suite's size and that its names are unique,
// since doc.go's table and backends' -run patterns refer to them.
func TestSubtestNames(t *testing.T) {
	names := conformance.SubtestNames()
	if len(names) < 40 {
		t.Errorf("%d subtests, want at least 40", len(names))
	}
	seen := map[string]bool{}
	for _, n := range names {
		if seen[n] {
			t.Errorf("subtest %q listed twice", n)
		}
		seen[n] = true
	}
}

// fault names a deliberately broken behaviour of the reference backend.
type fault string

const (
	correct fault = ""
	// consumesOnDenial counts denied requests, as peers that make raising a
	// limit useless until the window ends do.
	consumesOnDenial fault = "consumes-on-denial"
	// slidingResetAt stores End = now + Window on every call, so ResetAt
	// wobbles (what GitHub's Fix 1 removed).
	slidingResetAt fault = "sliding-reset-at"
	// closedWindowLivesOn keeps counting a window after its End passed, as
	// a store trusting an unexpired TTL or a lagging replica does.
	closedWindowLivesOn fault = "closed-window-lives-on"
	// notAtomic reads, yields, then writes: concurrent requests overwrite
	// each other's units.
	notAtomic fault = "not-atomic"
	// boundaryInclusive treats a window as open while now <= End, one
	// millisecond too long.
	boundaryInclusive fault = "boundary-inclusive"
	// refundUnclamped refunds below zero units and below now.
	refundUnclamped fault = "refund-unclamped"
	// hangsUntilCanceled blocks every Decide until its context is done.
	hangsUntilCanceled fault = "hangs-until-canceled"
	// hangsForever blocks every Decide, ignoring its context.
	hangsForever fault = "hangs-forever"
	// leaseNeverExpires keeps counting leases past their expiry, as a store
	// trusting its own TTL would.
	leaseNeverExpires fault = "lease-never-expires"
	// leaseNotAtomic counts, yields, then adds: concurrent acquisitions all
	// see room.
	leaseNotAtomic fault = "lease-not-atomic"
	// releaseByCount frees the earliest lease instead of the one named, so
	// a second or late release frees somebody else's slot.
	releaseByCount fault = "release-by-count"
	// seedOverwrites stores the given states as they are, whatever the
	// store held and whether they count or not, then decides.
	seedOverwrites fault = "seed-overwrites"
	// seedIgnoresGiven decides on the held states and drops the given ones.
	seedIgnoresGiven fault = "seed-ignores-given"
	// seedDecidesFirst decides on the held states, then merges the given
	// ones: the verdict is not the merged states'.
	seedDecidesFirst fault = "seed-decides-first"
	// seedNotAtomic reads, yields, then writes the merge: concurrent seeds
	// and decisions overwrite each other.
	seedNotAtomic fault = "seed-not-atomic"
	// seedUnchecked skips driver.CheckGiven, taking what it cannot store.
	seedUnchecked fault = "seed-unchecked"
	// seedPriorAfter reports the states after the step as the prior ones.
	seedPriorAfter fault = "seed-prior-after"
	// seedTakesOtherEnd merges by the rule before issue 27: a given fixed
	// window open at now with another End than the open one held replaces
	// it, moving its clients' ResetAt.
	seedTakesOtherEnd fault = "seed-takes-other-end"
	// keyByMax keeps a limit's state under a key holding its Max, so that
	// raising Max opens a fresh window (layout 1 did this for an unnamed
	// limit).
	keyByMax fault = "key-by-max"
)

// brokenBackendEnv names the fault TestBrokenBackendChild runs the suite
// against, in the child process TestBrokenBackendsFail starts.
const brokenBackendEnv = "CONFORMANCE_TEST_BROKEN_BACKEND"

// TestBrokenBackendsFail re-runs this test binary once per fault and checks
// that the suite fails, in at least the subtests that guard against that
// fault.
func TestBrokenBackendsFail(t *testing.T) {
	for _, c := range []struct {
		fault fault
		want  []string
	}{
		{consumesOnDenial, []string{"DenialConsumesNothingFixed", "DenialConsumesNothingGCRA", "PolicyAllOrNothing",
			"GCRATimeline", "DifferentialAgainstModel"}},
		{slidingResetAt, []string{"ResetAtStableWithinWindow", "ResetAtStableAcrossInstancesSkew700ms",
			"ResetAtStableAcrossInstancesSkew1s", "FixedWindowAnchoredTimeline", "DifferentialAgainstModel"}},
		{closedWindowLivesOn, []string{"ClosedWindowIgnored", "ClosedWindowAcrossInstances",
			"FixedWindowAnchoredTimeline", "FixedWindowAlignedTimeline", "DifferentialAgainstModel"}},
		{notAtomic, []string{"ConcurrentFixedWindowExact", "ConcurrentAlignedWindowExact", "ConcurrentGCRAExact",
			"ConcurrentPolicyAllOrNothing", "ConcurrentTwoInstances", "ConcurrentDistinctIdentifiers"}},
		{boundaryInclusive, []string{"FixedWindowAnchoredBoundary", "FixedWindowAlignedBoundary", "ClosedWindowIgnored",
			"FixedWindowAnchoredTimeline"}},
		// A negative fixed-window count is healed by throttler.Decide, which
		// this backend calls, so only the GCRA half of the fault shows.
		{refundUnclamped, []string{"RefundGCRA"}},
		{leaseNeverExpires, []string{"LeaseExpiresAfterTTL", "LeaseExpiredDoNotCount", "LeaseRenew", "LeaseAcrossInstances"}},
		{leaseNotAtomic, []string{"ConcurrentLeasesExact", "ConcurrentLeaseChurn"}},
		{releaseByCount, []string{"LeaseExpiresAfterTTL", "LeaseReleaseUnknownHarmless", "LeaseOutcomeReportsHeld"}},
		{seedOverwrites, []string{"SeedKeepsNewer", "SeedClosedWindowIgnored", "SeedConcurrentWriters"}},
		{seedIgnoresGiven, []string{"SeedEveryAlgorithm", "SeedKeepsNewer", "SeedThenDecide", "SeedConcurrentWriters"}},
		{seedDecidesFirst, []string{"SeedThenDecide"}},
		{seedNotAtomic, []string{"SeedConcurrentWriters"}},
		{seedUnchecked, []string{"SeedInvalidState"}},
		{seedPriorAfter, []string{"SeedEveryAlgorithm", "SeedKeepsNewer"}},
		{seedTakesOtherEnd, []string{"SeedKeepsHeldWindow"}},
		{keyByMax, []string{"RaisingMaxKeepsWindow"}},
	} {
		t.Run(string(c.fault), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestBrokenBackendChild$", "-test.count=1", "-test.timeout=3m")
			cmd.Env = append(os.Environ(), brokenBackendEnv+"="+string(c.fault))
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) {
				t.Fatalf("child run: err = %v, want a non-zero exit; output:\n%s", err, out)
			}
			if ctx.Err() != nil {
				t.Fatalf("child run did not finish in time; output:\n%s", out)
			}
			failed := failedSubtests(string(out))
			t.Logf("the suite failed %d subtests: %s", len(failed), strings.Join(failed, ", "))
			for _, name := range c.want {
				if !contains(failed, name) {
					t.Errorf("subtest %s did not fail against the %s backend", name, c.fault)
				}
			}
			if strings.Contains(string(out), "panic:") {
				t.Errorf("the child panicked instead of failing cleanly:\n%s", out)
			}
		})
	}
}

// TestWatchdog checks that a subtest whose backend hangs fails instead of
// hanging: through its context when the backend honours it, through the
// watchdog's panic, naming the subtest, when it does not. The child runs
// one subtest with a 1 s timeout and a 1 s grace.
func TestWatchdog(t *testing.T) {
	for _, c := range []struct {
		fault fault
		want  string
	}{
		{hangsUntilCanceled, "--- FAIL: TestBrokenBackendChild/FixedWindowAnchoredTimeline"},
		{hangsForever, "conformance: TestBrokenBackendChild/FixedWindowAnchoredTimeline still running"},
	} {
		t.Run(string(c.fault), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestBrokenBackendChild$/^FixedWindowAnchoredTimeline$",
				"-test.count=1", "-test.timeout=1m")
			cmd.Env = append(os.Environ(), brokenBackendEnv+"="+string(c.fault))
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || ctx.Err() != nil {
				t.Fatalf("child run: err = %v, want a non-zero exit in time; output:\n%s", err, out)
			}
			if !strings.Contains(string(out), c.want) {
				t.Errorf("child output lacks %q:\n%s", c.want, out)
			}
			if c.fault == hangsUntilCanceled && strings.Contains(string(out), "panic:") {
				t.Errorf("a backend honouring its context made the suite panic:\n%s", out)
			}
		})
	}
}

// TestBrokenBackendChild runs the suite against the broken backend that
// brokenBackendEnv names; it is meant to fail, so it runs only as
// TestBrokenBackendsFail's child.
func TestBrokenBackendChild(t *testing.T) {
	f := fault(os.Getenv(brokenBackendEnv))
	if f == correct {
		t.Skip("runs only as TestBrokenBackendsFail's child process")
	}
	if f == hangsUntilCanceled || f == hangsForever {
		conformance.SetTimeouts(time.Second, time.Second)
	}
	conformance.Run(t, referenceMaker(f, false))
}

var failLine = regexp.MustCompile(`--- FAIL: TestBrokenBackendChild/(\S+)`)

func failedSubtests(out string) []string {
	var names []string
	for _, m := range failLine.FindAllStringSubmatch(out, -1) {
		names = append(names, m[1])
	}
	sort.Strings(names)
	return names
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// referenceMaker returns a HarnessMaker whose harnesses share one fresh
// in-memory store between all the backends they make. minimal strips the
// optional interfaces.
func referenceMaker(f fault, minimal bool) conformance.HarnessMaker {
	return func(ctx context.Context, tb testing.TB) (conformance.Harness, error) {
		s := &store{states: map[stateKey]driver.State{}, leases: map[stateKey]map[string]int64{}, maxInKey: f == keyByMax}
		return &referenceHarness{store: s, fault: f, minimal: minimal}, nil
	}
}

type referenceHarness struct {
	store   *store
	fault   fault
	minimal bool
}

func (h *referenceHarness) MakeBackend(ctx context.Context) (driver.Backend, error) {
	b := &referenceBackend{store: h.store, fault: h.fault}
	if h.minimal {
		return decideOnly{b}, nil
	}
	return b, nil
}

func (h *referenceHarness) Close() {}

// Limitations declares, for the minimal backend, the weaker guarantee
// memcached documents, so that the suite's relaxed path runs too.
func (h *referenceHarness) Limitations() conformance.Caveats {
	return conformance.Caveats{CostAboveOneInexactUnderConcurrency: h.minimal}
}

// decideOnly hides every optional interface of the backend it wraps.
type decideOnly struct{ b driver.Backend }

func (d decideOnly) Decide(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	return d.b.Decide(ctx, req)
}

// store is the state every backend of one harness shares: a map under one
// mutex, keyed like a real store by policy, limit identity and identifier.
type store struct {
	mu     sync.Mutex
	states map[stateKey]driver.State
	// leases holds each (limit, identifier)'s leases, keyed with an empty
	// policy.
	leases map[stateKey]map[string]int64
	// maxInKey adds each limit's Max to its key (the keyByMax fault).
	maxInKey bool
}

type stateKey struct{ policy, limit, id string }

// key returns where the state of limit i of p for id lives.
func (s *store) key(p *driver.Policy, i int, id string) stateKey {
	l := &p.Limits[i]
	if s.maxInKey {
		return stateKey{p.Key, l.Key + ":" + strconv.FormatInt(l.Max, 10), id}
	}
	return stateKey{p.Key, l.Key, id}
}

func (s *store) load(req driver.Request) []driver.State {
	states := make([]driver.State, len(req.Policy.Limits))
	for i := range states {
		states[i] = s.states[s.key(req.Policy, i, req.Identifier)]
	}
	return states
}

func (s *store) save(req driver.Request, states []driver.State) {
	for i, st := range states {
		s.states[s.key(req.Policy, i, req.Identifier)] = st
	}
}

// referenceBackend decides with driver.Decide and driver.Refund under
// the store's lock, unless its fault says otherwise.
type referenceBackend struct {
	store *store
	fault fault
}

var (
	_ driver.Backend  = (*referenceBackend)(nil)
	_ driver.Peeker   = (*referenceBackend)(nil)
	_ driver.Refunder = (*referenceBackend)(nil)
	_ driver.Resetter = (*referenceBackend)(nil)
	_ driver.Pinger   = (*referenceBackend)(nil)
	_ driver.Leaser   = (*referenceBackend)(nil)
	_ driver.Seeder   = (*referenceBackend)(nil)
)

func (b *referenceBackend) Decide(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	switch b.fault {
	case hangsUntilCanceled:
		<-ctx.Done()
	case hangsForever:
		select {}
	}
	if err := ctx.Err(); err != nil {
		return driver.Outcome{}, err
	}
	if b.fault == notAtomic {
		b.store.mu.Lock()
		states := b.store.load(req)
		b.store.mu.Unlock()
		runtime.Gosched()
		time.Sleep(20 * time.Microsecond)
		next := append([]driver.State(nil), states...)
		allowed := driver.Decide(req.Policy, req.Now, req.Cost, next)
		b.store.mu.Lock()
		b.store.save(req, next)
		b.store.mu.Unlock()
		return driver.Outcome{Allowed: allowed, States: next}, nil
	}
	b.store.mu.Lock()
	defer b.store.mu.Unlock()
	states := b.store.load(req)
	b.reviveClosedWindows(req, states)
	next := append([]driver.State(nil), states...)
	allowed := driver.Decide(req.Policy, req.Now, req.Cost, next)
	switch {
	case b.fault == consumesOnDenial && !allowed && req.Cost > 0:
		next = consumeAnyway(req, states)
	case b.fault == slidingResetAt:
		slideWindows(req, next)
	}
	b.store.save(req, next)
	return driver.Outcome{Allowed: allowed, States: next}, nil
}

func (b *referenceBackend) Peek(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	if err := ctx.Err(); err != nil {
		return driver.Outcome{}, err
	}
	b.store.mu.Lock()
	defer b.store.mu.Unlock()
	states := b.store.load(req)
	b.reviveClosedWindows(req, states)
	allowed := driver.Decide(req.Policy, req.Now, 0, states) // cost 0 changes nothing
	return driver.Outcome{Allowed: allowed, States: states}, nil
}

func (b *referenceBackend) Refund(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	if err := ctx.Err(); err != nil {
		return driver.Outcome{}, err
	}
	b.store.mu.Lock()
	defer b.store.mu.Unlock()
	var next []driver.State
	if b.fault == refundUnclamped {
		next = refundWithoutClamps(req, b.store.load(req))
	} else {
		next = b.store.load(req)
		driver.Refund(req.Policy, req.Now, req.Cost, next)
	}
	b.store.save(req, next)
	return driver.Outcome{Allowed: true, States: next}, nil
}

func (b *referenceBackend) Reset(ctx context.Context, p *driver.Policy, id string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.store.mu.Lock()
	defer b.store.mu.Unlock()
	for i := range p.Limits {
		delete(b.store.states, b.store.key(p, i, id))
	}
	return nil
}

func (b *referenceBackend) Ping(ctx context.Context) error { return ctx.Err() }

// Seed calls driver.Seed under the store's lock, after driver.CheckGiven,
// unless the fault says otherwise.
func (b *referenceBackend) Seed(ctx context.Context, req driver.Request, given []driver.State) (driver.Outcome, error) {
	if err := ctx.Err(); err != nil {
		return driver.Outcome{}, err
	}
	if b.fault != seedUnchecked {
		if err := driver.CheckGiven(req.Policy, given); err != nil {
			return driver.Outcome{}, err
		}
	}
	p, now := req.Policy, req.Now
	if b.fault == seedNotAtomic {
		b.store.mu.Lock()
		prior := b.store.load(req)
		b.store.mu.Unlock()
		runtime.Gosched()
		time.Sleep(20 * time.Microsecond)
		next := append([]driver.State(nil), prior...)
		allowed := driver.Seed(p, now, req.Cost, next, given)
		b.store.mu.Lock()
		b.store.save(req, next)
		b.store.mu.Unlock()
		return driver.Outcome{Allowed: allowed, States: next, Prior: prior}, nil
	}
	b.store.mu.Lock()
	defer b.store.mu.Unlock()
	prior := b.store.load(req)
	next := append([]driver.State(nil), prior...)
	var allowed bool
	switch b.fault {
	case seedOverwrites:
		if len(given) == len(next) {
			copy(next, given)
		}
		allowed = driver.Decide(p, now, req.Cost, next)
	case seedIgnoresGiven:
		allowed = driver.Decide(p, now, req.Cost, next)
	case seedDecidesFirst:
		allowed = driver.Decide(p, now, req.Cost, next)
		driver.Merge(p, now, next, given)
	case seedTakesOtherEnd:
		takeOtherEnds(p, now, next, given)
		allowed = driver.Seed(p, now, req.Cost, next, given)
	default:
		allowed = driver.Seed(p, now, req.Cost, next, given)
	}
	b.store.save(req, next)
	if b.fault == seedPriorAfter {
		prior = next
	}
	return driver.Outcome{Allowed: allowed, States: next, Prior: prior}, nil
}

// takeOtherEnds replaces each fixed window held open at now by the given
// one when that is open too and ends at another moment, as driver.Merge
// did before issue 27; driver.Seed then finds the two ends equal.
func takeOtherEnds(p *driver.Policy, now time.Time, held, given []driver.State) {
	if len(held) != len(p.Limits) || len(given) != len(p.Limits) {
		return
	}
	for i := range p.Limits {
		l := &p.Limits[i]
		if l.Algorithm != driver.FixedWindow && l.Algorithm != driver.AlignedWindow {
			continue
		}
		h, g := driver.InForce(l, held[i], now), driver.InForce(l, given[i], now)
		if h != (driver.State{}) && g != (driver.State{}) && h.End != g.End {
			held[i] = g
		}
	}
}

// Acquire calls driver.AcquireLease under the store's lock, unless the
// fault says otherwise.
func (b *referenceBackend) Acquire(ctx context.Context, req driver.LeaseRequest) (driver.LeaseOutcome, error) {
	if err := ctx.Err(); err != nil {
		return driver.LeaseOutcome{}, err
	}
	if err := req.Check(); err != nil {
		return driver.LeaseOutcome{}, err
	}
	now := req.Now
	if b.fault == leaseNotAtomic {
		b.store.mu.Lock()
		probe := maps.Clone(b.store.leaseSet(req))
		b.store.mu.Unlock()
		out := driver.AcquireLease(req.Limit, probe, req.Lease, now)
		runtime.Gosched()
		time.Sleep(20 * time.Microsecond)
		b.store.mu.Lock()
		defer b.store.mu.Unlock()
		if out.Acquired {
			b.store.leaseSet(req)[req.Lease] = probe[req.Lease]
		}
		return out, nil
	}
	b.store.mu.Lock()
	defer b.store.mu.Unlock()
	set := b.store.leaseSet(req)
	b.reviveExpiredLeases(set, now)
	return driver.AcquireLease(req.Limit, set, req.Lease, now), nil
}

// Release calls driver.ReleaseLease under the store's lock, unless the
// fault says otherwise.
func (b *referenceBackend) Release(ctx context.Context, req driver.LeaseRequest) (driver.LeaseOutcome, error) {
	if err := ctx.Err(); err != nil {
		return driver.LeaseOutcome{}, err
	}
	if err := req.Check(); err != nil {
		return driver.LeaseOutcome{}, err
	}
	b.store.mu.Lock()
	defer b.store.mu.Unlock()
	set := b.store.leaseSet(req)
	b.reviveExpiredLeases(set, req.Now)
	if b.fault == releaseByCount {
		first := ""
		for id, exp := range set {
			if first == "" || exp < set[first] {
				first = id
			}
		}
		req.Lease = first
	}
	return driver.ReleaseLease(req.Limit, set, req.Lease, req.Now), nil
}

// reviveExpiredLeases makes expired leases look held one more millisecond,
// for leaseNeverExpires; the caller holds mu.
func (b *referenceBackend) reviveExpiredLeases(set map[string]int64, now time.Time) {
	if b.fault != leaseNeverExpires {
		return
	}
	for id, exp := range set {
		if exp <= now.UnixMilli() {
			set[id] = now.UnixMilli() + 1
		}
	}
}

// leaseSet returns req's leases, made on first use; the caller holds mu.
func (s *store) leaseSet(req driver.LeaseRequest) map[string]int64 {
	k := stateKey{limit: req.Limit.Key, id: req.Identifier}
	set := s.leases[k]
	if set == nil {
		set = map[string]int64{}
		s.leases[k] = set
	}
	return set
}

// reviveClosedWindows makes closed fixed windows look open one more
// millisecond, keeping their count: every closed window for
// closedWindowLivesOn, the one closing exactly now for boundaryInclusive.
func (b *referenceBackend) reviveClosedWindows(req driver.Request, states []driver.State) {
	nowMs := req.Now.UnixMilli()
	for i := range states {
		if req.Policy.Limits[i].Algorithm == throttler.GCRA || states[i].End == 0 {
			continue
		}
		if b.fault == closedWindowLivesOn && states[i].End <= nowMs || b.fault == boundaryInclusive && states[i].End == nowMs {
			states[i].End = nowMs + 1
		}
	}
}

// refundWithoutClamps gives back n units of every stored state, below zero
// and below now.
func refundWithoutClamps(req driver.Request, states []driver.State) []driver.State {
	for i := range states {
		l := req.Policy.Limits[i]
		if l.Algorithm == throttler.GCRA {
			if states[i].End != 0 {
				states[i].End -= req.Cost * ((l.Window.Microseconds() + l.Max - 1) / l.Max)
			}
			continue
		}
		states[i].Used -= req.Cost
	}
	return states
}

// consumeAnyway charges a denied request to every limit.
func consumeAnyway(req driver.Request, states []driver.State) []driver.State {
	next := append([]driver.State(nil), states...)
	nowMs, nowUs := req.Now.UnixMilli(), req.Now.UnixMicro()
	for i := range next {
		l := req.Policy.Limits[i]
		s := &next[i]
		switch {
		case l.Algorithm == throttler.GCRA:
			t := (l.Window.Microseconds() + l.Max - 1) / l.Max
			s.End = max(s.End, nowUs) + req.Cost*t
		case s.End > nowMs:
			s.Used += req.Cost
		default:
			w := l.Window.Milliseconds()
			s.Used, s.End = req.Cost, nowMs+w
			if l.Algorithm == throttler.AlignedWindow {
				s.End = (nowMs/w + 1) * w
			}
		}
	}
	return next
}

// slideWindows moves every open fixed window's end to now + Window.
func slideWindows(req driver.Request, states []driver.State) {
	nowMs := req.Now.UnixMilli()
	for i := range states {
		l := req.Policy.Limits[i]
		if l.Algorithm != throttler.GCRA && states[i].End > nowMs {
			states[i].End = nowMs + l.Window.Milliseconds()
		}
	}
}

// BenchmarkReference runs the benchmarks against the reference backend, a
// baseline for the real backends' numbers.
func BenchmarkReference(b *testing.B) {
	conformance.RunBenchmarks(b, referenceMaker(correct, false))
}
