package conformance

import (
	"context"
	"fmt"
	"reflect"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// Limitations may be implemented by a Harness whose backend documents a
// guarantee weaker than SPEC's default. The suite then relaxes exactly the
// checks the flags name and nothing else: sequential timelines stay exact
// for every backend.
type Limitations interface {
	// Limitations returns the backend's documented weaker guarantees.
	Limitations() Caveats
}

// Caveats lists the weaker guarantees a backend may document. The zero value
// claims none, which is what a Harness without Limitations gets.
type Caveats struct {
	// CostAboveOneInexactUnderConcurrency says that requests of cost above
	// one that race near the limit may be denied although they would fit
	// (memcached's add-then-check counters do this). Concurrent checks with
	// cost > 1 then stop requiring that exactly as many requests as fit are
	// allowed; they still require that the units consumed equal the units
	// allowed, never above Max.
	CostAboveOneInexactUnderConcurrency bool
}

// SubtestTimeout bounds every subtest. The context handed to the harness
// and to every throttler call expires then, so a backend that honours its
// context fails the subtest; a backend that ignores it makes the suite
// panic with every goroutine's stack shortly after, instead of hanging
// until go test's global timeout.
const SubtestTimeout = 60 * time.Second

// subtestTimeout and watchdogGrace are SubtestTimeout and how long past it
// the suite waits for a backend that ignores its context before it panics.
// The package's own tests shorten them to watch the watchdog bite.
var (
	subtestTimeout = SubtestTimeout
	watchdogGrace  = 15 * time.Second
)

// DefaultCallTimeout bounds each backend call made by the throttlers the
// suite and RunBenchmarks build (throttler.WithCallTimeout), unless the
// Harness implements CallTimeout. It is far above
// throttler.DefaultCallTimeout (100 ms) so that a slow -race run against a
// real server on a loaded machine never turns into degraded (fail-open)
// results, which every subtest rejects. A backend that implements
// driver.Nonblocking and reports true meets no call timeout at all.
const DefaultCallTimeout = 10 * time.Second

// CallTimeout may be implemented by a Harness to choose the per-call timeout
// of the throttlers built over its backends, instead of DefaultCallTimeout:
// for instance the production default, throttler.DefaultCallTimeout, to see
// whether a store keeps up with it (a call that times out gives a degraded
// result, and the subtest fails). Zero means no per-call timeout: calls are
// bounded only by the subtest's context (SubtestTimeout). A negative value
// fails the subtest.
type CallTimeout interface {
	// CallTimeout returns the per-call timeout for the suite's throttlers.
	CallTimeout() time.Duration
}

// callTimeoutOf returns the per-call timeout h asks for.
func callTimeoutOf(tb testing.TB, h Harness) time.Duration {
	tb.Helper()
	ct, ok := h.(CallTimeout)
	if !ok {
		return DefaultCallTimeout
	}
	d := ct.CallTimeout()
	if d < 0 {
		tb.Fatalf("Harness.CallTimeout() = %v, want zero or more", d)
	}
	return d
}

// T0 is the instant every subtest's clocks start at:
// 2030-01-02T03:04:05.678Z. It is realistic (a Unix time of 13 digits in
// milliseconds) and deliberately not aligned to a second, so that aligned
// windows end at a different moment than anchored ones. Treat it as a
// constant: the timelines are worked out from it.
var T0 = time.Date(2030, time.January, 2, 3, 4, 5, 678_000_000, time.UTC)

// subtest is one entry of the suite.
type subtest struct {
	name string
	run  func(t *testing.T, e *env)
}

// Run checks a backend against SPEC: a flat list of subtests, each with a
// fresh harness from newHarness (closed with t.Cleanup) and a watchdog
// context of SubtestTimeout.
//
// Every subtest drives the backend through throttler.New with a
// throttlertest.ManualClock starting at T0, so its expectations are exact
// timelines with no tolerance. Optional capabilities (Refunder, Resetter,
// Peeker, Leaser, Seeder) are checked when the backend implements them and
// skipped otherwise. A Harness may implement Limitations to declare documented
// weaker guarantees, and CallTimeout to choose the per-call timeout of the
// suite's throttlers (DefaultCallTimeout otherwise).
//
// Run is meant to run under the race detector (go test -race): several
// subtests decide from many goroutines at once, and a backend's data races
// show up only there.
func Run(t *testing.T, newHarness HarnessMaker) {
	t.Helper()
	for _, st := range suite {
		t.Run(st.name, func(t *testing.T) {
			e := newEnv(t, newHarness)
			st.run(t, e)
		})
	}
}

// SubtestNames returns the names of Run's subtests, in order. Backend
// authors can use it to pick subtests with -run. The subtests of an
// optional capability are listed whether or not a backend has it: the
// Refund* subtests and ConcurrentRefund (driver.Refunder),
// ResetForgetsState (driver.Resetter), PeekerMatchesDecide
// (driver.Peeker), the Lease* subtests but LeaseInvalidInput,
// ConcurrentLeasesExact and ConcurrentLeaseChurn (driver.Leaser), and the
// Seed* subtests (driver.Seeder) skip without it. RaisingMaxKeepsWindow
// needs no capability.
func SubtestNames() []string {
	names := make([]string, len(suite))
	for i, st := range suite {
		names[i] = st.name
	}
	return names
}

// env is what one subtest works with: its harness, a watchdog context, and
// the primary throttler over one backend of the harness.
type env struct {
	t       *testing.T
	ctx     context.Context
	harness Harness
	limits  Caveats
	// timeout is the per-call timeout of every throttler of the subtest.
	timeout  time.Duration
	failures *failureLog
	// main is the primary instance; most subtests use nothing else.
	main *instance
}

// instance is one throttler over one backend of the harness, with its own
// manual clock: what one process of a fleet sees.
type instance struct {
	env     *env
	backend driver.Backend
	clock   *throttlertest.ManualClock
	thr     *throttler.Throttler
	// skew is how far this instance's clock runs ahead of the primary's.
	skew time.Duration
}

// failureLog collects backend failures the throttler reports to its
// observer, including those it otherwise swallows (a failed give-back
// refund in AllowAll), so a subtest never passes over a failing backend.
type failureLog struct {
	mu     sync.Mutex
	events []string
}

func (l *failureLog) Observe(_ context.Context, e throttler.Event) {
	if e.Err == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.events) < 10 {
		l.events = append(l.events, fmt.Sprintf("%s %s: %v", e.Op, e.Policy, e.Err))
	}
}

func newEnv(t *testing.T, newHarness HarnessMaker) *env {
	t.Helper()
	timeout := subtestTimeout
	if d, ok := t.Deadline(); ok && time.Until(d) < timeout+watchdogGrace {
		// Leave go test's own timeout a chance to report first.
		timeout = max(time.Until(d)*3/4-watchdogGrace, time.Second)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	name := t.Name()
	watchdog := time.AfterFunc(timeout+watchdogGrace, func() {
		// t.Fatal may not be called from this goroutine, and the subtest is
		// stuck in a backend call that ignores its context: crash with every
		// goroutine's stack, as go test -timeout does, but sooner and with
		// the subtest named.
		debug.SetTraceback("all")
		panic(fmt.Sprintf("conformance: %s still running %v after its context expired: the backend ignores context cancellation",
			name, watchdogGrace))
	})
	t.Cleanup(func() { watchdog.Stop() })

	h, err := newHarness(ctx, t)
	if err != nil {
		t.Fatalf("making harness: %v", err)
	}
	if h == nil {
		t.Fatal("harness maker returned a nil Harness and no error")
	}
	t.Cleanup(h.Close)
	e := &env{t: t, ctx: ctx, harness: h, failures: &failureLog{}}
	if l, ok := h.(Limitations); ok {
		e.limits = l.Limitations()
	}
	e.timeout = callTimeoutOf(t, h)
	t.Cleanup(func() {
		e.failures.mu.Lock()
		defer e.failures.mu.Unlock()
		for _, ev := range e.failures.events {
			t.Errorf("backend failure reported to the observer: %s", ev)
		}
	})
	e.main = e.newInstance(0)
	return e
}

// newInstance makes another backend of the harness and a throttler over it
// whose clock reads the primary's plus skew. Instances of one env share
// state through the harness.
func (e *env) newInstance(skew time.Duration) *instance {
	e.t.Helper()
	b, err := e.harness.MakeBackend(e.ctx)
	if err != nil {
		e.t.Fatalf("MakeBackend: %v", err)
	}
	if b == nil {
		e.t.Fatal("MakeBackend returned a nil backend and no error")
	}
	clock := throttlertest.NewManualClock(T0.Add(skew))
	if e.main != nil {
		clock.Set(e.main.clock.Now().Add(skew))
	}
	thr, err := throttler.New(b,
		throttler.WithClock(clock),
		throttler.WithLogger(nil),
		throttler.WithObserver(e.failures),
		throttler.WithCallTimeout(e.timeout))
	if err != nil {
		e.t.Fatalf("throttler.New: %v", err)
	}
	return &instance{env: e, backend: b, clock: clock, thr: thr, skew: skew}
}

// at moves every given instance's clock to T0 + offset + its skew.
func at(offset time.Duration, instances ...*instance) {
	for _, in := range instances {
		in.clock.Set(T0.Add(offset + in.skew))
	}
}

// at moves the primary clock to T0 + offset.
func (e *env) at(offset time.Duration) { at(offset, e.main) }

// mustPolicy builds a policy or fails the subtest: the suite's own policies
// are always valid, so an error here is a bug in throttler or the suite.
func mustPolicy(t *testing.T, name string, limits ...throttler.Limit) *throttler.Policy {
	t.Helper()
	p, err := throttler.NewPolicy(name, limits)
	if err != nil {
		t.Fatalf("NewPolicy(%q): %v", name, err)
	}
	checkNotation(t, p)
	return p
}

// checkNotation fails the test unless p's String reads back, through
// ParsePolicy, as an equal policy: the same name and limits (names,
// algorithms, bursts), hence the same stored keys. Every policy the suite
// builds passes through it, so the one notation an operator pastes
// (Policy.String into ParsePolicy or the throttlekit command) is checked on
// every shape of policy the contract covers.
func checkNotation(tb testing.TB, p *throttler.Policy) {
	tb.Helper()
	again, err := throttler.ParsePolicy("", p.String())
	if err != nil {
		tb.Fatalf("policy %q: ParsePolicy(String()) = %v", p.String(), err)
	}
	if again.Name() != p.Name() || !reflect.DeepEqual(again.Limits(), p.Limits()) || again.String() != p.String() {
		tb.Fatalf("policy %q reads back as %q: limits %+v, want %+v", p.String(), again.String(), again.Limits(), p.Limits())
	}
}

// refunder and resetter skip the subtest when the backend lacks the
// capability, as SPEC makes them optional.
func (e *env) requireRefunder() {
	e.t.Helper()
	if _, ok := e.main.backend.(driver.Refunder); !ok {
		e.t.Skip("backend does not implement driver.Refunder")
	}
}

func (e *env) requireResetter() {
	e.t.Helper()
	if _, ok := e.main.backend.(driver.Resetter); !ok {
		e.t.Skip("backend does not implement driver.Resetter")
	}
}

// suite lists every subtest, in the order Run runs them. doc.go maps SPEC's
// rules to these names; keep the two in step.
var suite = []subtest{
	// Fixed windows.
	{"FixedWindowAnchoredTimeline", testFixedWindowAnchoredTimeline},
	{"FixedWindowAnchoredBoundary", testFixedWindowAnchoredBoundary},
	{"FixedWindowAlignedTimeline", testFixedWindowAlignedTimeline},
	{"FixedWindowAlignedBoundary", testFixedWindowAlignedBoundary},
	{"FixedWindowCostAboveOne", testFixedWindowCostAboveOne},
	{"PeekOpensNothing", testPeekOpensNothing},
	{"ZeroCostOpensNothing", testZeroCostOpensNothing},
	{"ClosedWindowIgnored", testClosedWindowIgnored},
	{"ClosedWindowIgnoredGCRA", testClosedWindowIgnoredGCRA},
	{"ClosedWindowAcrossInstances", testClosedWindowAcrossInstances},
	// GCRA.
	{"GCRATimeline", testGCRATimeline},
	{"GCRABurstTimeline", testGCRABurstTimeline},
	{"GCRAEmissionIntervalRoundsUp", testGCRAEmissionIntervalRoundsUp},
	{"GCRACostAboveOne", testGCRACostAboveOne},
	{"GCRARetryAfterIsExact", testGCRARetryAfterIsExact},
	// Sliding windows.
	{"SlidingWindowTimeline", testSlidingWindowTimeline},
	{"SlidingWindowRetryAfterIsExact", testSlidingWindowRetryAfterIsExact},
	{"SlidingWindowClockBehind", testSlidingWindowClockBehind},
	// Take up to N.
	{"TakeUpToTightestLimit", testTakeUpToTightestLimit},
	{"TakeUpToEveryAlgorithm", testTakeUpToEveryAlgorithm},
	{"ConcurrentTakeExact", testConcurrentTakeExact},
	// Requests that can never succeed.
	{"CostExceedsCapacityFixed", testCostExceedsCapacityFixed},
	{"CostExceedsCapacityGCRA", testCostExceedsCapacityGCRA},
	{"CostExceedsCapacityPolicy", testCostExceedsCapacityPolicy},
	// Denials and ResetAt.
	{"DenialConsumesNothingFixed", testDenialConsumesNothingFixed},
	{"DenialConsumesNothingGCRA", testDenialConsumesNothingGCRA},
	{"ResetAtStableWithinWindow", testResetAtStableWithinWindow},
	{"ResetAtStableAcrossInstancesSkew700ms", testResetAtStableAcrossInstances(700 * time.Millisecond)},
	{"ResetAtStableAcrossInstancesSkew1s", testResetAtStableAcrossInstances(time.Second)},
	{"ResetAtStableAcrossInstancesSkew5s", testResetAtStableAcrossInstances(5 * time.Second)},
	{"ResetAtStableAcrossInstancesSkew30s", testResetAtStableAcrossInstances(30 * time.Second)},
	{"PolicyRedefinitionKeepsDroppedLimits", testPolicyRedefinitionKeepsDroppedLimits},
	{"RaisingMaxKeepsWindow", testRaisingMaxKeepsWindow},
	// Policies and several identifiers.
	{"PolicyAllOrNothing", testPolicyAllOrNothing},
	{"PolicyBindingOnAllow", testPolicyBindingOnAllow},
	{"PolicyBindingOnDeny", testPolicyBindingOnDeny},
	{"PolicyPerLimitResults", testPolicyPerLimitResults},
	{"AllowAllGivesBack", testAllowAllGivesBack},
	{"AllowAllAllowsWhenAllAllow", testAllowAllAllowsWhenAllAllow},
	// Peek, Refund, Reset.
	{"PeekNeverChangesState", testPeekNeverChangesState},
	{"PeekerMatchesDecide", testPeekerMatchesDecide},
	{"RefundFixedWindow", testRefundFixedWindow},
	{"RefundGCRA", testRefundGCRA},
	{"RefundAfterWindowClosed", testRefundAfterWindowClosed},
	{"ResetForgetsState", testResetForgetsState},
	// The clock going backwards.
	{"ClockBackwardsWithinWindow", testClockBackwardsWithinWindow},
	{"ClockBackwardsAcrossWindowBoundary", testClockBackwardsAcrossWindowBoundary},
	{"ClockBackwardsGCRA", testClockBackwardsGCRA},
	// Concurrency.
	{"ConcurrentFixedWindowExact", testConcurrentFixedWindowExact},
	{"ConcurrentAlignedWindowExact", testConcurrentAlignedWindowExact},
	{"ConcurrentGCRAExact", testConcurrentGCRAExact},
	{"ConcurrentCostAboveOne", testConcurrentCostAboveOne},
	{"ConcurrentPolicyAllOrNothing", testConcurrentPolicyAllOrNothing},
	{"ConcurrentTwoInstances", testConcurrentTwoInstances},
	{"ConcurrentRefund", testConcurrentRefund},
	{"ConcurrentDistinctIdentifiers", testConcurrentDistinctIdentifiers},
	{"ManyIdentifiersKeepTheirState", testManyIdentifiersKeepTheirState},
	// Concurrency limits (leases).
	{"LeaseAcquireUpToMax", testLeaseAcquireUpToMax},
	{"LeaseReleaseFreesSlot", testLeaseReleaseFreesSlot},
	{"LeaseExpiresAfterTTL", testLeaseExpiresAfterTTL},
	{"LeaseExpiredDoNotCount", testLeaseExpiredDoNotCount},
	{"LeaseRenew", testLeaseRenew},
	{"LeaseAcrossInstances", testLeaseAcrossInstances},
	{"LeaseReleaseUnknownHarmless", testLeaseReleaseUnknownHarmless},
	{"LeaseOutcomeReportsHeld", testLeaseOutcomeReportsHeld},
	{"LeaseKeysIndependent", testLeaseKeysIndependent},
	{"LeaseInvalidInput", testLeaseInvalidInput},
	{"ConcurrentLeasesExact", testConcurrentLeasesExact},
	{"ConcurrentLeaseChurn", testConcurrentLeaseChurn},
	// Seeding state from another store.
	{"SeedEveryAlgorithm", testSeedEveryAlgorithm},
	{"SeedKeepsNewer", testSeedKeepsNewer},
	{"SeedKeepsHeldWindow", testSeedKeepsHeldWindow},
	{"SeedClosedWindowIgnored", testSeedClosedWindowIgnored},
	{"SeedThenDecide", testSeedThenDecide},
	{"SeedConcurrentWriters", testSeedConcurrentWriters},
	{"SeedInvalidState", testSeedInvalidState},
	// Identifiers and keys.
	{"IdentifierEmptyRejected", testIdentifierEmptyRejected},
	{"IdentifierLength", testIdentifierLength},
	{"IdentifierArbitraryBytes", testIdentifierArbitraryBytes},
	{"IdentifierLongNearDuplicates", testIdentifierLongNearDuplicates},
	{"KeyJoinCollisions", testKeyJoinCollisions},
	{"PoliciesNeverShareCounters", testPoliciesNeverShareCounters},
	{"LimitsNeverShareCounters", testLimitsNeverShareCounters},
	// Invalid input.
	{"NegativeCostRejected", testNegativeCostRejected},
	{"NilPolicyRejected", testNilPolicyRejected},
	// Everything at random, against an independent model.
	{"DifferentialAgainstModel", testDifferentialAgainstModel},
}
