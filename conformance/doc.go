// Package conformance is the executable form of throttlekit's behaviour
// contract (docs/SPEC.md; "SPEC" below means that page): a test suite any
// driver.Backend must pass, in or outside this repository, and a reference
// model of the contract.
//
// Its production code imports only the standard library and packages
// throttler and throttler/driver, neither of which imports a client SDK, so
// a backend written elsewhere can import it cheaply.
//
// # Using the suite
//
// A backend's test file supplies a HarnessMaker: a function that returns a
// fresh Harness for each subtest. A Harness makes backends that share one
// store (the suite builds several throttlers over several backends of one
// harness, with clocks apart, as a fleet of processes would) and releases
// the store on Close. State must not leak from one harness to the next,
// nor from one run of the tests to the next against the same server: a
// subtest's timelines start from nothing, and windows the last run opened
// are still open when you run the suite again a minute later. So give each
// harness a key prefix no other harness, in this run or an earlier one,
// has used (UniquePrefix: the end of the subtest's name and a random
// token, in letters and digits only, which any store accepts in a key),
// or a flushed server, or a new in-memory store; and have Close delete
// what the harness wrote when the store lets you, so that test runs do
// not pile up keys. (That is the test harness's Close: a backend's own
// Close must never delete stored state, which other processes share.) A
// test file for a backend outside this repository is about this long:
//
//	package mystore_test
//
//	import (
//		"context"
//		"testing"
//
//		"example.com/mystore"
//		"github.com/throttlekit/throttlekit/conformance"
//		"github.com/throttlekit/throttlekit/throttler/driver"
//	)
//
//	type harness struct {
//		server *mystore.TestServer
//		prefix string
//	}
//
//	// MakeBackend returns another client of the same server and prefix.
//	func (h *harness) MakeBackend(ctx context.Context) (driver.Backend, error) {
//		return mystore.New(h.server.Addr(), mystore.WithKeyPrefix(h.prefix))
//	}
//
//	// Close deletes the keys this harness wrote: a test server only.
//	func (h *harness) Close() { h.server.DeletePrefix(h.prefix) }
//
//	// Limitations is optional: declare only what mystore's docs promise.
//	func (h *harness) Limitations() conformance.Caveats {
//		return conformance.Caveats{CostAboveOneInexactUnderConcurrency: true}
//	}
//
//	func newHarness(ctx context.Context, tb testing.TB) (conformance.Harness, error) {
//		server := mystore.StartTestServer(tb) // skips when the server is not installed
//		// Unique to this subtest and this run: a second run against the
//		// same server finds none of the first run's windows. Letters and
//		// digits only; the separator is the store's own ("." for NATS KV).
//		prefix := conformance.UniquePrefix(tb) + "."
//		return &harness{server: server, prefix: prefix}, nil
//	}
//
//	func TestConformance(t *testing.T) { conformance.Run(t, newHarness) }
//
//	func TestStates(t *testing.T) { conformance.RunStateDifferential(t, newHarness) }
//
//	func BenchmarkConformance(b *testing.B) { conformance.RunBenchmarks(b, newHarness) }
//
// Run it under the race detector:
//
//	go test -race -run TestConformance ./...
//
// Several subtests decide from 32 goroutines at once; a backend's data races
// show only under -race, and the suite is meant to run that way. Each
// subtest has SubtestTimeout: its context expires then, and a backend that
// ignores its context makes the suite panic with every goroutine's stack
// soon after, rather than hang. The randomized subtest logs its seed; set
// CONFORMANCE_SEED (SeedEnv) to replay a failure.
//
// The suite's throttlers bound each backend call by DefaultCallTimeout
// (10 s, far above the production default of 100 ms, so that a loaded
// machine does not turn slow calls into degraded results). A Harness that
// implements CallTimeout chooses another: throttler.DefaultCallTimeout, to
// see whether the store keeps up with production's bound, or 0 for none.
// A backend whose Nonblocking reports true meets no call timeout at all.
//
// # How it checks
//
// Every subtest drives the backend through throttler.New with a
// throttlertest.ManualClock starting at T0, 2030-01-02T03:04:05.678Z, which is
// not aligned to a second, so aligned windows end at other moments than
// anchored ones. Expectations are exact timelines worked out by hand from
// SPEC (tables of t0..tN), with no tolerance. Beyond each table, every
// result the suite sees is checked for what SPEC says of all results:
// Remaining = Limit - Used, neither negative; RetryAfter 0 when allowed,
// ResetAt - now (fixed) or newTAT - B*T - now (GCRA) when denied; a denial
// of cost 1 leaves Remaining 0; fixed-window times are whole milliseconds
// and GCRA times whole microseconds; the binding limit follows the
// selection rules and the top-level figures are its own; a cost above a
// capacity gives NeverAllowed and RetryAfter throttler.Never; the result
// names its policy and identifier; and nothing is degraded. A backend
// failure reported to the throttler's observer fails the subtest too.
//
// DifferentialAgainstModel replays random sequences of AllowN, Peek, Refund
// and Reset through the backend and through Model, a second implementation
// of SPEC written from its text alone (it does not call driver.Decide,
// Refund or Evaluate), and compares every field of every result. A slip in
// the backend, in package throttler's arithmetic, or in the model shows up
// as a disagreement, reported with the seed and the operations before it.
//
// RunStateDifferential, run beside Run, works one level down: it seeds
// random stored states into the backend through driver.Seeder (open
// windows, windows a clock ahead wrote, counts above Max, GCRA TATs beyond
// the burst), runs random Decide, Peek, Refund, Take, Seed and Reset calls
// on the backend directly, and compares every verdict, Granted and state
// (as it counts at now, driver.InForce) with the package driver functions
// applied to the same states. A backend without Seeder skips it. The
// states it seeds are those a throttler can leave behind: quotas up to
// about a million, counts up to twice Max plus a few (a lowered Max), GCRA
// TATs within a few emission intervals of the burst, times within minutes
// of T0; no value it seeds comes near 2^53, so a backend that refuses
// larger values (as the Redis backend does) passes, and checking that
// refusal is the backend's own test.
//
// # Optional capabilities and weaker guarantees
//
// Subtests of an optional capability run only when the backend implements
// it, and skip otherwise: RefundFixedWindow, RefundGCRA,
// RefundAfterWindowClosed and ConcurrentRefund need driver.Refunder;
// ResetForgetsState needs driver.Resetter (it checks that the states of
// the policy's limits are forgotten, for that identifier and that policy
// only; whether a Reset also forgets the states of limits an earlier
// definition of the policy dropped is the backend's choice, unchecked); PeekerMatchesDecide needs
// driver.Peeker and checks the two routes to a peek (Peek, and Decide
// with cost 0) give the same answer. Without Refunder the random sequences
// leave refunds out, and without Resetter, resets. The Lease* subtests and
// ConcurrentLeasesExact and ConcurrentLeaseChurn need driver.Leaser
// (except LeaseInvalidInput, which checks the throttler's own input
// checks); a backend without it (memcached) skips them as a declared
// limitation, and so does a decorator whose lease calls answer an error
// wrapping errors.ErrUnsupported because the backend it wraps has none.
// The Seed* subtests need driver.Seeder and skip in the same two cases;
// they call the backend's Seed directly, with the driver.Policy the
// throttler sends, and check each step both against driver.Seed applied to
// the states the backend reports as prior and through the throttler's
// figures afterwards. RaisingMaxKeepsWindow needs no capability: every
// backend keeps a limit's state when only its Max changes.
//
// A Harness may implement Limitations to declare a weaker guarantee its
// backend documents. Caveats.CostAboveOneInexactUnderConcurrency (memcached
// may deny a request of cost above one that races near the limit) makes
// ConcurrentCostAboveOne stop requiring that exactly as many requests as
// fit are allowed. It still requires that the units consumed equal the
// units allowed, so a denied request leaves nothing behind. Nothing else is
// relaxed: sequential timelines are exact for every backend.
//
// # docs/SPEC.md rules and the subtests that check them
//
// Rules marked "every subtest" are checked on every result the suite sees,
// besides the subtests named.
//
//	SPEC rule                                     Subtests
//	-------------------------------------------   ---------------------------------------------------
//	Words: identifier of 1 to 1024 arbitrary      IdentifierEmptyRejected, IdentifierLength,
//	  bytes; empty or longer is invalid           IdentifierArbitraryBytes, IdentifierLongNearDuplicates
//	Words: fixed window, anchored                 FixedWindowAnchoredTimeline, FixedWindowAnchoredBoundary
//	Words: fixed window, aligned on the epoch     FixedWindowAlignedTimeline, FixedWindowAlignedBoundary
//	Words: GCRA, Burst defaults to Max            GCRATimeline, GCRABurstTimeline
//	Words: cost n >= 0; n = 0 is a peek           ZeroCostOpensNothing, FixedWindowCostAboveOne, GCRACostAboveOne
//	Words: result fields, per-limit results       PolicyPerLimitResults, DifferentialAgainstModel; every subtest
//	Time 1: now comes from the throttler's        every subtest (a manual clock in 2030); ClosedWindowAcrossInstances,
//	  clock; backends never read their own        ResetAtStableAcrossInstancesSkew700ms, ...Skew1s
//	Time 2: stored expiry is garbage collection;  ClosedWindowAcrossInstances (1 ms lag), ClockBackwardsGCRA,
//	  clocks 30 s apart share every window        ResetAtStableAcrossInstancesSkew5s, ...Skew30s,
//	                                              DifferentialAgainstModel (clock back up to 999 ms)
//	Time 3: integer Unix ms (GCRA µs)             FixedWindowAnchoredBoundary (sub-ms now), GCRAEmissionIntervalRoundsUp;
//	                                              every subtest
//	Time 4: clock going backwards                 ClockBackwardsWithinWindow, ClockBackwardsAcrossWindowBoundary,
//	                                              ClockBackwardsGCRA, DifferentialAgainstModel
//	Fixed 1: open while now < ResetAt; closed     ClosedWindowIgnored, ClosedWindowAcrossInstances,
//	  windows ignored (Fix 2)                     FixedWindowAnchoredBoundary, FixedWindowAlignedBoundary
//	Fixed 2: opening; a peek or a denial opens    FixedWindowAnchoredTimeline, FixedWindowAlignedTimeline, PeekOpensNothing,
//	  nothing                                     ZeroCostOpensNothing, CostExceedsCapacityFixed
//	Fixed 3: allowed iff Used + n <= Max; denied  FixedWindowCostAboveOne, DenialConsumesNothingFixed, PolicyAllOrNothing
//	  requests do not consume
//	Fixed 4: Remaining = Max - Used, never        DenialConsumesNothingFixed; every subtest
//	  negative; cost-1 denial has Remaining 0
//	Fixed 5: identical ResetAt for every result   ResetAtStableWithinWindow, ResetAtStableAcrossInstancesSkew700ms,
//	  of a window, every instance (Fix 1)         ResetAtStableAcrossInstancesSkew1s, ...Skew5s, ...Skew30s, ConcurrentFixedWindowExact,
//	                                              ConcurrentAlignedWindowExact, ConcurrentTwoInstances
//	Fixed 6: RetryAfter 0 / ResetAt - now         all fixed-window timelines; every subtest
//	GCRA: T = ceil(Window / Max)                  GCRAEmissionIntervalRoundsUp
//	GCRA 1: newTAT, allowed iff, denied changes   GCRATimeline, GCRABurstTimeline, GCRACostAboveOne,
//	  nothing                                     DenialConsumesNothingGCRA
//	GCRA 2: Limit = B, Remaining, Used            GCRATimeline, GCRABurstTimeline, ClockBackwardsGCRA; every subtest
//	GCRA 3: ResetAt = max(TAT', now)              GCRATimeline, ClosedWindowIgnoredGCRA
//	GCRA 4: RetryAfter = newTAT - B*T - now       GCRARetryAfterIsExact; every subtest
//	Sliding 1-2: counts in force, allowed iff,    SlidingWindowTimeline, SlidingWindowClockBehind,
//	  a clock ahead's window kept                 DifferentialAgainstModel
//	Sliding 3-4: Remaining, Used, ResetAt         SlidingWindowTimeline; every subtest
//	Sliding 5: RetryAfter exact, <= ResetAt - now SlidingWindowRetryAfterIsExact; every subtest
//	Sliding 6: refund of the current window       DifferentialAgainstModel
//	Take up to N: largest k, charged atomically   TakeUpToTightestLimit, TakeUpToEveryAlgorithm,
//	  to every limit; Granted                     ConcurrentTakeExact, DifferentialAgainstModel
//	Never succeed: cost > Max or B is refused,    CostExceedsCapacityFixed, CostExceedsCapacityGCRA,
//	  no state change, RetryAfter Never           CostExceedsCapacityPolicy, GCRATimeline, GCRABurstTimeline
//	Policies 1: all or nothing                    PolicyAllOrNothing, ConcurrentPolicyAllOrNothing, ZeroCostOpensNothing
//	Policies 2: binding limit, per-limit results  PolicyBindingOnAllow, PolicyBindingOnDeny, PolicyPerLimitResults;
//	                                              every subtest
//	Several identifiers: allowed only if each     AllowAllGivesBack, AllowAllAllowsWhenAllAllow
//	  allows; a denial gives the others back
//	Peek: a cost-0 result, never changes state    PeekNeverChangesState, PeekOpensNothing, PeekerMatchesDecide,
//	                                              ClosedWindowIgnored
//	Refund: up to n, not below 0 / now; nothing   RefundFixedWindow, RefundGCRA, RefundAfterWindowClosed,
//	  after the window closed                     ConcurrentRefund
//	Reset: forgets one identifier's state         ResetForgetsState
//	Policies redefined 1: identity is name,       RaisingMaxKeepsWindow, PoliciesNeverShareCounters,
//	  window, algorithm, burst; never Max, named  LimitsNeverShareCounters
//	  or not
//	Policies redefined 2: a dropped limit keeps   PolicyRedefinitionKeepsDroppedLimits
//	  its state for the old definition
//	Keys 1: policy and limit identity; two        PoliciesNeverShareCounters, LimitsNeverShareCounters, KeyJoinCollisions
//	  limits never share a counter
//	Keys 2: distinct identifiers never collide    IdentifierArbitraryBytes, IdentifierLongNearDuplicates, KeyJoinCollisions,
//	  and never lose state as the store grows     ConcurrentDistinctIdentifiers, ManyIdentifiersKeepTheirState
//	Keys 3/4: braces and long or unsafe ids work  IdentifierArbitraryBytes, IdentifierLength, IdentifierLongNearDuplicates
//	  (slots and the 250-byte key bound are the
//	  Redis and memcached backends' own tests)
//	Errors 1: invalid input is an errors.Is       IdentifierEmptyRejected, IdentifierLength, NegativeCostRejected,
//	  error, never a panic                        NilPolicyRejected
//	Errors 2: a backend failure is never a        every subtest (degraded results and observed errors fail it)
//	  silent verdict
//	Concurrency: exactly Max per window with      ConcurrentFixedWindowExact, ConcurrentAlignedWindowExact,
//	  cost 1; GCRA never above its formula;       ConcurrentGCRAExact, ConcurrentCostAboveOne, ConcurrentPolicyAllOrNothing,
//	  weaker cost > 1 guarantees declared         ConcurrentTwoInstances, ConcurrentRefund, ConcurrentDistinctIdentifiers
//	Concurrency limits 1: at most Max leases;     LeaseAcquireUpToMax, ConcurrentLeasesExact
//	  InFlight; RetryAfter to earliest expiry
//	Concurrency limits 2: release frees a slot;   LeaseReleaseFreesSlot, LeaseReleaseUnknownHarmless,
//	  a second, late or unknown release is        LeaseOutcomeReportsHeld, LeaseExpiresAfterTTL
//	  harmless
//	Concurrency limits 3: expiry <= now counts    LeaseExpiresAfterTTL, LeaseExpiredDoNotCount, LeaseAcrossInstances
//	  as released
//	Concurrency limits 4: renew extends, never    LeaseRenew, LeaseOutcomeReportsHeld
//	  counts twice, never shortens
//	Concurrency limits 5: shared by every         LeaseAcrossInstances, ConcurrentLeasesExact, ConcurrentLeaseChurn
//	  instance, exact under concurrency
//	Concurrency limits 6: limits and identifiers  LeaseKeysIndependent
//	  never share leases or a policy's state
//	Concurrency limits 7: invalid input is an     LeaseInvalidInput (failure modes: the throttler's tests)
//	  errors.Is error
//	Seeding 1: one state per limit, no negative   SeedInvalidState
//	  field, else ErrInvalidState
//	Seeding 2: what counts nothing at now is      SeedClosedWindowIgnored
//	  ignored
//	Seeding 3: nothing held takes the given       SeedEveryAlgorithm, SeedThenDecide
//	  state
//	Seeding 4: both count: a fixed window keeps   SeedKeepsHeldWindow, SeedKeepsNewer,
//	  the held End and the larger Used; GCRA and  SeedConcurrentWriters
//	  sliding the newer
//	Seeding 5: merge, then decide, one atomic     SeedThenDecide, SeedConcurrentWriters
//	  step; a denial keeps the merge
//	Seeding 6: Prior is what the store held       SeedEveryAlgorithm, SeedKeepsNewer; every seed the
//	                                              Seed* subtests make
//	Everything above, at random                   DifferentialAgainstModel
//
// Not checked here, because one backend in one harness cannot show them:
// one round trip per decision (Policies 3), per-call timeouts and failure
// modes under a failing server (Errors 3 and 4), hash slots in Redis
// Cluster (Keys 3), the 250-byte memcached key bound (Keys 4), stored TTLs
// running out in real time (the rest of Time 2: the suite checks only that
// live state outlives a lagging clock), rollout between two backends, the
// failure modes of leases (Concurrency limits 7) and the middleware's
// leases (8). The backends', the throttler's and the middleware's own
// tests cover those.
//
// # Benchmarks
//
// RunBenchmarks measures a backend on the wall clock at 1, 16 and 64
// goroutines: one hot identifier, 10,000 identifiers, a policy of three
// limits, and peeks, each reporting decisions/s; and a concurrency lease
// acquired and released on one identifier, reporting leases/s (skipped
// without driver.Leaser).
package conformance
