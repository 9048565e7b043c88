//go:build linux

// The envoy ratelimit process is put in its own process group with
// Pdeathsig, so that it never outlives the test binary, even one killed by
// go test's timeout before any cleanup runs; Pdeathsig is Linux's.

package service

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/throttlekit/throttlekit/internal/localserver"
)

// This file checks, against the real envoy ratelimit built from its source,
// that a team replaces envoy ratelimit by throttlekit-rls with a rolling
// deploy and no window restarts and no quota is granted twice:
//
//  1. envoy ratelimit alone serves;
//  2. a throttlekit-rls instance joins it, on a mirror rollout at 0 % whose
//     old side is envoy's own Redis counters (envoy+redis://…?deciding=true)
//     and whose new side is another Redis, the new store;
//  3. envoy ratelimit is killed: throttlekit-rls alone;
//  4. a second instance, the same rollout at 100 %, replaces the first
//     (both serve for a while, then the first stops);
//  5. a third instance, on the new store alone, replaces the second.
//
// Eight gRPC callers ask about 20 values all along, round-robin over the
// instances serving at the moment, on the real clock. It is judged from
// the responses alone.

// envoySwapVersion is the envoy ratelimit the test runs, as go.mod would
// name it (a pseudo-version of its main branch: it tags no releases).
const (
	envoySwapModule  = "github.com/envoyproxy/ratelimit"
	envoySwapVersion = "v1.4.1-0.20260122083618-3fb702589d36"
	envoySwapDomain  = "swap"
	envoySwapValues  = 20
	envoySwapCallers = 8
)

// envoySwapPlan is the rule both services enforce and how long each phase
// lasts.
//
// The default plan counts per second, 5 requests a second, with phases of
// about 10 s. A minute rule, the realistic one, cannot show what matters in
// a test of a suite's length: a window boundary has to pass while each
// phase, and above all each rolling overlap, is in force, since that is
// where a window restarts (a store opening its own window, an end carried
// wrong) or a quota is granted twice (two stores each opening a fresh
// window, two primaries each granting the last units). Under two minutes a
// minute rule crosses at most two boundaries, so three phases of five would
// see no window roll over at all; a second rule crosses about 10 per phase
// and per value, 200 per phase in all, the overlap of phase 4 included, in
// under a minute. What a second rule gives up: envoy ratelimit answers
// whole seconds, always 1 s for a second rule, so its own answers carry no
// information about their window (their window is known from when they
// were sent and received, ambiguously for the few that straddle a
// boundary, which the over-grant count handles); throttlekit's answers are
// exact to the millisecond and are judged strictly whatever the unit.
//
// THROTTLEKIT_ENVOYSWAP_UNIT=minute runs the same scenario on a minute rule
// (30 a minute) with phases of 5 to 25 s, 100 to 160 s in all: fewer
// windows, but envoy's answers then name their window to the second. Phase
// 3 then lasts until the overlap of phase 4 straddles a minute boundary,
// the one moment a rolling deploy can grant a quota twice.
type envoySwapPlan struct {
	unit     time.Duration
	unitName string // in the configuration and the responses
	limit    int
	// phases are the lengths of phases 1 to 5.
	phases [5]time.Duration
	// overlap4 is how long the instances of phases 3 and 4 serve together;
	// overlap5 the same for phases 4 and 5 (the check of phase 5 must fit
	// in one window with it, and the instance that stops).
	overlap4, overlap5 time.Duration
	// straddle4 lengthens phase 3 so that the overlap of phase 4 straddles
	// a window boundary (for units longer than the phases).
	straddle4 bool
}

func envoySwapPlanFromEnv(t *testing.T) envoySwapPlan {
	switch u := os.Getenv("THROTTLEKIT_ENVOYSWAP_UNIT"); u {
	case "", "second":
		return envoySwapPlan{unit: time.Second, unitName: "second", limit: 5,
			phases:   [5]time.Duration{4 * time.Second, 10 * time.Second, 10 * time.Second, 10 * time.Second, 10 * time.Second},
			overlap4: 4 * time.Second, overlap5: 150 * time.Millisecond}
	case "minute":
		return envoySwapPlan{unit: time.Minute, unitName: "minute", limit: 30,
			phases:   [5]time.Duration{5 * time.Second, 25 * time.Second, 20 * time.Second, 25 * time.Second, 20 * time.Second},
			overlap4: 10 * time.Second, overlap5: 3 * time.Second, straddle4: true}
	default:
		t.Fatalf("THROTTLEKIT_ENVOYSWAP_UNIT=%q: want second or minute", u)
	}
	return envoySwapPlan{}
}

// config is the envoy ratelimit configuration both services load.
func (p envoySwapPlan) config() string {
	return fmt.Sprintf(`domain: %s
descriptors:
  - key: client
    rate_limit: {unit: %s, requests_per_unit: %d}
`, envoySwapDomain, p.unitName, p.limit)
}

// untilEnd is how long the window holding now has left.
func (p envoySwapPlan) untilEnd(now time.Time) time.Duration {
	u := p.unit.Nanoseconds()
	n := now.UnixNano()
	return time.Duration((n/u+1)*u - n)
}

// awayFromEnd waits, when less than need is left of the current window,
// for the next one to begin.
func (p envoySwapPlan) awayFromEnd(need time.Duration) {
	if left := p.untilEnd(time.Now()); left < need {
		time.Sleep(left + 15*time.Millisecond)
	}
}

// checkRoom is the part of a window a check of a few requests waits for.
func (p envoySwapPlan) checkRoom() time.Duration { return min(p.unit*8/10, 15*time.Second) }

// envoySwapInstance is one service process a caller may ask.
type envoySwapInstance struct {
	name   string
	envoy  bool // envoy ratelimit: whole-second resets
	client rlsv3.RateLimitServiceClient
	// mu is held for reading during each call; retire takes it for
	// writing, so that once retired no call is in flight or starts.
	mu      sync.RWMutex
	retired bool
}

// retire takes the instance out of service for good and waits for the
// calls in flight.
func (in *envoySwapInstance) retire() {
	in.mu.Lock()
	in.retired = true
	in.mu.Unlock()
}

// envoySwapAnswer is one response, with what the judge needs of it.
type envoySwapAnswer struct {
	inst       *envoySwapInstance
	phase      int
	value      string
	sent, recv time.Time
	code       rlsv3.RateLimitResponse_Code
	remaining  uint32
	reset      time.Duration
	limit      *rlsv3.RateLimitResponse_RateLimit
}

func (a envoySwapAnswer) String() string {
	return fmt.Sprintf("%s phase %d value %s: %v remaining %d reset %v (sent %s, received %s)",
		a.inst.name, a.phase, a.value, a.code, a.remaining, a.reset,
		a.sent.Format("15:04:05.000000"), a.recv.Format("15:04:05.000000"))
}

// ask sends one request about value to in; served is false when in was
// retired before the call could start.
func (in *envoySwapInstance) ask(value string, phase int) (a envoySwapAnswer, served bool, err error) {
	in.mu.RLock()
	defer in.mu.RUnlock()
	if in.retired {
		return a, false, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req := &rlsv3.RateLimitRequest{Domain: envoySwapDomain, Descriptors: []*commonv3.RateLimitDescriptor{{
		Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "client", Value: value}},
	}}}
	a = envoySwapAnswer{inst: in, phase: phase, value: value}
	a.sent = time.Now()
	resp, err := in.client.ShouldRateLimit(ctx, req)
	a.recv = time.Now()
	if err != nil {
		return a, true, fmt.Errorf("%s phase %d value %s: %w", in.name, phase, value, err)
	}
	if len(resp.Statuses) != 1 {
		return a, true, fmt.Errorf("%s phase %d value %s: %d statuses", in.name, phase, value, len(resp.Statuses))
	}
	st := resp.Statuses[0]
	if st.DurationUntilReset == nil || st.CurrentLimit == nil {
		return a, true, fmt.Errorf("%s phase %d value %s: no limit or reset in %v", in.name, phase, value, st)
	}
	if resp.OverallCode != st.Code {
		return a, true, fmt.Errorf("%s phase %d value %s: overall %v, descriptor %v", in.name, phase, value, resp.OverallCode, st.Code)
	}
	a.code, a.remaining, a.reset, a.limit = st.Code, st.LimitRemaining, st.DurationUntilReset.AsDuration(), st.CurrentLimit
	return a, true, nil
}

// envoySwapRotation is the set of instances serving, asked round-robin.
type envoySwapRotation struct {
	serving atomic.Pointer[[]*envoySwapInstance]
	next    atomic.Uint64
}

func (r *envoySwapRotation) set(in ...*envoySwapInstance) { r.serving.Store(&in) }

func (r *envoySwapRotation) pick() *envoySwapInstance {
	list := *r.serving.Load()
	return list[r.next.Add(1)%uint64(len(list))]
}

// envoySwapLogs collects the services' warnings, shown when the test fails.
type envoySwapLogs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *envoySwapLogs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.buf.Len() < 1<<20 {
		l.buf.Write(p)
	}
	return len(p), nil
}

func (l *envoySwapLogs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func TestEnvoySwapRollingDeploy(t *testing.T) {
	localserver.SkipIfShort(t)
	plan := envoySwapPlanFromEnv(t)
	bin := envoySwapBinary(t)
	oldRedis := localserver.RedisT(t, localserver.RedisOptions{}) // envoy ratelimit's
	newRedis := localserver.RedisT(t, localserver.RedisOptions{}) // throttlekit's new store

	runtimeRoot := t.TempDir()
	cfgDir := filepath.Join(runtimeRoot, "ratelimit", "config")
	require.NoError(t, os.MkdirAll(cfgDir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(cfgDir, "swap.yaml"), []byte(plan.config()), 0o644))

	logs := &envoySwapLogs{}
	t.Cleanup(func() {
		if t.Failed() {
			if s := logs.String(); s != "" {
				t.Logf("service logs:\n%s", s)
			}
		}
	})

	envoy := envoySwapStartEnvoy(t, bin, oldRedis.Addr(), runtimeRoot)
	oldSpec := "envoy+redis://" + oldRedis.Addr() + "?deciding=true"
	newSpec := "redis://" + newRedis.Addr()

	var (
		phase    atomic.Int32
		rotation envoySwapRotation
		mu       sync.Mutex
		answers  []envoySwapAnswer
		failures []error
		stop     = make(chan struct{})
		load     sync.WaitGroup
	)
	record := func(a []envoySwapAnswer, errs []error) {
		mu.Lock()
		answers = append(answers, a...)
		failures = append(failures, errs...)
		mu.Unlock()
	}
	phase.Store(1)
	rotation.set(envoy.inst)
	for g := range envoySwapCallers {
		load.Add(1)
		go func() {
			defer load.Done()
			var mine []envoySwapAnswer
			var errs []error
			defer func() { record(mine, errs) }()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				value := fmt.Sprintf("c%02d", (g*7+i)%envoySwapValues)
				a, served, err := rotation.pick().ask(value, int(phase.Load()))
				switch {
				case !served:
					continue // retired between the pick and the call
				case err != nil:
					errs = append(errs, err)
					if len(errs) > 20 {
						return
					}
					continue
				}
				mine = append(mine, a)
			}
		}()
	}
	stopLoad := sync.OnceFunc(func() {
		close(stop)
		load.Wait()
	})
	t.Cleanup(stopLoad) // before the instances' own cleanups
	began := time.Now()
	phaseStart := [6]time.Time{1: began}
	startPhase := func(n int) {
		phaseStart[n] = time.Now()
		phase.Store(int32(n))
	}
	// askOne asks in once on behalf of a check and records the answer.
	askOne := func(in *envoySwapInstance, value string) envoySwapAnswer {
		t.Helper()
		a, served, err := in.ask(value, int(phase.Load()))
		require.True(t, served, "%s retired", in.name)
		require.NoError(t, err)
		record([]envoySwapAnswer{a}, nil)
		return a
	}

	// 1. envoy ratelimit alone.
	time.Sleep(plan.phases[0])

	// 2. A rolling deploy: throttlekit-rls joins, counting in envoy's keys
	// and mirroring into the new store.
	tk1 := envoySwapStartService(t, "throttlekit-1 (mirror 0%)", cfgDir, "",
		&RolloutYAML{Old: oldSpec, New: newSpec, Mode: "mirror", Percent: 0}, logs)
	startPhase(2)
	rotation.set(envoy.inst, tk1.inst)
	time.Sleep(plan.phases[1] / 2)
	// Shared counters: a value's quota spent through envoy ratelimit is
	// spent for throttlekit-rls in the same window.
	sharedChecked := false
	for attempt := 0; attempt < 5 && !sharedChecked; attempt++ {
		plan.awayFromEnd(plan.checkRoom())
		value := "shared-" + strconv.Itoa(attempt)
		var spent []envoySwapAnswer
		for range plan.limit {
			spent = append(spent, askOne(envoy.inst, value))
		}
		probe := askOne(tk1.inst, value)
		if !envoySwapOneWindow(plan, append(slices.Clone(spent), probe)) {
			t.Logf("shared-counter check %d straddled a window boundary; again", attempt)
			continue
		}
		for i, a := range spent {
			assert.Equal(t, rlsv3.RateLimitResponse_OK, a.code, "spend %d through envoy: %v", i+1, a)
		}
		assert.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, probe.code,
			"throttlekit-rls after the quota was spent through envoy ratelimit in the same window: %v", probe)
		assert.Zero(t, probe.remaining, "throttlekit-rls's remaining after envoy spent the window: %v", probe)
		sharedChecked = true
	}
	assert.True(t, sharedChecked, "the shared-counter check never fit in one window")
	time.Sleep(time.Until(phaseStart[2].Add(plan.phases[1])))

	// 3. envoy ratelimit stops: throttlekit-rls alone, still mirror 0 %.
	startPhase(3)
	rotation.set(tk1.inst)
	envoy.inst.retire()
	envoy.kill(t)
	time.Sleep(plan.phases[2])
	if plan.straddle4 {
		// Until the overlap's middle is a boundary.
		wait := plan.untilEnd(time.Now()) - plan.overlap4/2
		if wait < 0 {
			wait += plan.unit
		}
		time.Sleep(wait)
	}

	// 4. The rollout goes to 100 %: an instance at 100 % replaces the one at
	// 0 %, both serving for a while.
	tk2 := envoySwapStartService(t, "throttlekit-2 (mirror 100%)", cfgDir, "",
		&RolloutYAML{Old: oldSpec, New: newSpec, Mode: "mirror", Percent: 100}, logs)
	startPhase(4)
	// Two instances decide on two primaries from now until the first has
	// stopped: envoy's keys for the one at 0 %, the new store for the one
	// at 100 %.
	twoPrimaries := [2]time.Time{time.Now()}
	rotation.set(tk1.inst, tk2.inst)
	time.Sleep(plan.overlap4)
	rotation.set(tk2.inst)
	tk1.stop(t)
	twoPrimaries[1] = time.Now()
	// The last instance is started now, before it serves, so that the
	// checks below spend a value in phase 4 and ask phase 5's instance
	// within one window.
	tk3 := envoySwapStartService(t, "throttlekit-3 (new store)", cfgDir, newSpec, nil, logs)
	time.Sleep(time.Until(phaseStart[4].Add(plan.phases[3])))
	// A value spent through the 100 % instance is spent for an instance on
	// the new store alone, in the same window: asked while the 100 %
	// instance still runs, as often as it takes to fit in one window ...
	spentChecked := false
	for attempt := 0; attempt < 5 && !spentChecked; attempt++ {
		plan.awayFromEnd(plan.checkRoom())
		value := "spent-4-" + strconv.Itoa(attempt)
		var spent []envoySwapAnswer
		for range plan.limit {
			spent = append(spent, askOne(tk2.inst, value))
		}
		probe := askOne(tk3.inst, value)
		if !envoySwapOneWindow(plan, append(slices.Clone(spent), probe)) {
			t.Logf("spent-in-phase-4 check %d straddled a window boundary; again", attempt)
			continue
		}
		for i, a := range spent {
			assert.Equal(t, rlsv3.RateLimitResponse_OK, a.code, "spend %d through the 100%% instance: %v", i+1, a)
		}
		assert.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, probe.code,
			"the new store alone, in the window a value was spent through the 100%% instance: %v", probe)
		assert.Zero(t, probe.remaining, "the new store alone, remaining of a window spent through the 100%% instance: %v", probe)
		spentChecked = true
	}
	assert.True(t, spentChecked, "the spent-in-phase-4 check never fit in one window")
	// ... and once more across the change of phase: spent at the end of
	// phase 4, asked after the 100 % instance has stopped, when that fits
	// in the window (it takes a few hundred milliseconds; a machine too
	// loaded for that is logged, not failed: the check above holds).
	plan.awayFromEnd(plan.checkRoom())
	var spent4 []envoySwapAnswer
	for range plan.limit {
		spent4 = append(spent4, askOne(tk2.inst, "spent-4"))
	}

	// 5. The new store alone: the last instance replaces the one at 100 %.
	startPhase(5)
	rotation.set(tk2.inst, tk3.inst)
	time.Sleep(plan.overlap5)
	rotation.set(tk3.inst)
	stopping := time.Now()
	tk2.stop(t)
	stopTook := time.Since(stopping)
	after := askOne(tk3.inst, "spent-4")
	acrossPhases := envoySwapOneWindow(plan, append(slices.Clone(spent4), after))
	if acrossPhases {
		for i, a := range spent4 {
			assert.Equal(t, rlsv3.RateLimitResponse_OK, a.code, "spend %d through the 100%% instance: %v", i+1, a)
		}
		assert.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, after.code,
			"the new store alone, the 100%% instance gone, in the window a value was spent in phase 4: %v", after)
		assert.Zero(t, after.remaining, "the new store alone, the 100%% instance gone, remaining of a window spent in phase 4: %v", after)
	} else {
		t.Logf("the check across phases 4 and 5 did not fit in one window (the 100%% instance took %v to stop): %v then %v",
			stopTook, spent4[len(spent4)-1], after)
	}
	time.Sleep(time.Until(phaseStart[5].Add(plan.phases[4])))
	stopLoad()
	ended := time.Now()

	mu.Lock()
	defer mu.Unlock()
	for i, err := range failures {
		if i == 10 {
			t.Errorf("… %d call errors in all", len(failures))
			break
		}
		t.Errorf("call error: %v", err)
	}

	j := envoySwapJudge(plan, answers, twoPrimaries)
	var perPhase [6]int
	for _, a := range answers {
		perPhase[a.phase]++
	}
	for _, s := range j.resetChanges {
		t.Errorf("ResetAt change: %s", s)
	}
	// While instances at 0 % and at 100 % decide on different stores
	// (docs/SPEC.md, Rollout 7), each writes its states to the other by a
	// merge, which keeps the larger count: a window that fills meanwhile can
	// grant past its limit by about the requests in flight on both stores,
	// at most one per caller. Outside that overlap, and beyond that bound,
	// an over-grant fails the test.
	for _, s := range j.overGrants {
		t.Log("over-grant: " + s)
	}
	assert.Equal(t, j.overGrantsTwoPrimaries, len(j.overGrants), "over-grants outside the windows two primaries decided in")
	assert.LessOrEqual(t, j.maxExcess, envoySwapCallers, "granted past the limit in one window by more than the requests in flight")
	for _, s := range j.badLimits {
		t.Errorf("wrong limit: %s", s)
	}
	t.Logf("envoy swap (%s rule, %d/%s, %d values, %d callers, %v): calls per phase %v; %d windows judged (boundaries crossed per phase %v, %d envoy answers straddling one); %d ResetAt changes, %d over-grants (%d in windows open while two primaries decided, %v; at most %d over the limit in one window)",
		plan.unitName, plan.limit, plan.unitName, envoySwapValues, envoySwapCallers, ended.Sub(began).Round(100*time.Millisecond),
		perPhase[1:], j.windows, j.boundaries[1:], j.ambiguous, len(j.resetChanges), len(j.overGrants),
		j.overGrantsTwoPrimaries, twoPrimaries[1].Sub(twoPrimaries[0]).Round(10*time.Millisecond), j.maxExcess)
	t.Logf("checks: shared counters (phase 2) %t; spent in phase 4, new store alone %t; the same with the 100%% instance stopped %t (it stopped in %v)",
		sharedChecked, spentChecked, acrossPhases, stopTook.Round(time.Millisecond))

	for n := 1; n <= 5; n++ {
		assert.Greater(t, perPhase[n], 50, "calls in phase %d", n)
		if plan.unit == time.Second {
			assert.GreaterOrEqual(t, j.boundaries[n], 2, "window boundaries crossed in phase %d", n)
		}
	}
	assert.Greater(t, j.windows, 40)
}

// envoySwapOneWindow reports whether every answer names one and the same
// window (no envoy answer straddling a boundary).
func envoySwapOneWindow(plan envoySwapPlan, as []envoySwapAnswer) bool {
	var end int64
	for i, a := range as {
		ends := envoySwapWindows(plan, a)
		if len(ends) != 1 || (i > 0 && ends[0] != end) {
			return false
		}
		end = ends[0]
	}
	return true
}

// envoySwapSlack is the error allowed on throttlekit's reset beyond the
// time the call took: clock reads and the response's rounding.
const envoySwapSlack = 2 * time.Millisecond

// envoySwapWindows returns the ends (Unix ns) of the windows a's response
// may belong to: the aligned ends between those of the windows holding its
// sending and its receipt, which its reset names. Empty means the reset is
// no window's end: a ResetAt change. Two ends mean an envoy answer whose
// call straddled a boundary and whose whole seconds cannot tell which.
//
// throttlekit answers exactly: ResetAt − At with At, the decision's now,
// between sending and receipt, so the window's end lies in [sent + reset,
// received + reset] give or take the slack. envoy ratelimit answers unit −
// now % unit in whole seconds of its own Unix now, which is between the
// seconds of sending and receipt: the end minus the reset is one of those
// seconds, exactly.
func envoySwapWindows(plan envoySwapPlan, a envoySwapAnswer) []int64 {
	u := plan.unit.Nanoseconds()
	s, r := a.sent.UnixNano(), a.recv.UnixNano()
	d := a.reset.Nanoseconds()
	sec := time.Second.Nanoseconds()
	var ends []int64
	for b := (s/u + 1) * u; b <= (r/u+1)*u; b += u {
		if a.inst.envoy {
			start := b - d
			if d%sec == 0 && start >= s/sec*sec && start <= r/sec*sec {
				ends = append(ends, b)
			}
		} else if b >= s+d-envoySwapSlack.Nanoseconds() && b <= r+d+envoySwapSlack.Nanoseconds() {
			ends = append(ends, b)
		}
	}
	return ends
}

// envoySwapVerdict is what the judge found.
type envoySwapVerdict struct {
	windows int // (value, window) pairs answered about
	// ambiguous counts the answers whose call lasted across a boundary and
	// whose reset cannot tell which window they were decided in: envoy's
	// whole seconds, or any call slower than the unit.
	ambiguous    int
	boundaries   [6]int // per phase, window ends seen minus one
	resetChanges []string
	overGrants   []string
	badLimits    []string
	// overGrantsTwoPrimaries counts the over-grants in windows open while
	// two instances decided on different primaries; maxExcess is the most
	// granted over the limit in one window.
	overGrantsTwoPrimaries, maxExcess int
}

// envoySwapJudge judges every answer: its reset names the end of a window
// aligned on the clock (else a ResetAt change), and no (value, window) is
// granted more than the limit (else an over-grant). An ambiguous OK answer
// counts in whichever of its windows leaves the fewest over-grants: per
// value, windows in order, each takes first the ambiguous answers whose
// last possible window ends soonest (earliest deadline first, which finds
// a placement without over-grants whenever there is one); one left over
// past its last window is an over-grant there.
func envoySwapJudge(plan envoySwapPlan, answers []envoySwapAnswer, twoPrimaries [2]time.Time) envoySwapVerdict {
	var v envoySwapVerdict
	type key struct {
		value string
		end   int64
	}
	type span struct{ first, last int64 } // the windows an ambiguous OK may be in
	var (
		granted   = map[key]int{}
		seen      = map[key]bool{}
		grantedBy = map[key]map[string]int{}
		spans     = map[string][]span{}
		values    = map[string]bool{}
		phaseEnds [6]map[int64]bool
	)
	for i := range phaseEnds {
		phaseEnds[i] = map[int64]bool{}
	}
	wantUnit := rlsv3.RateLimitResponse_RateLimit_SECOND
	if plan.unit == time.Minute {
		wantUnit = rlsv3.RateLimitResponse_RateLimit_MINUTE
	}
	for _, a := range answers {
		if a.limit.RequestsPerUnit != uint32(plan.limit) || a.limit.Unit != wantUnit {
			if len(v.badLimits) < 10 {
				v.badLimits = append(v.badLimits, fmt.Sprintf("%v: limit %v", a, a.limit))
			}
		}
		ends := envoySwapWindows(plan, a)
		ok := a.code == rlsv3.RateLimitResponse_OK
		values[a.value] = true
		for _, e := range ends {
			seen[key{a.value, e}] = true
		}
		switch len(ends) {
		case 0:
			v.resetChanges = append(v.resetChanges, fmt.Sprintf("%v: names no aligned window end", a))
		case 1:
			k := key{a.value, ends[0]}
			phaseEnds[a.phase][ends[0]] = true
			if ok {
				granted[k]++
				if grantedBy[k] == nil {
					grantedBy[k] = map[string]int{}
				}
				grantedBy[k][fmt.Sprintf("%s in phase %d", a.inst.name, a.phase)]++
			}
		default:
			v.ambiguous++
			if ok {
				spans[a.value] = append(spans[a.value], span{ends[0], ends[len(ends)-1]})
			}
		}
	}
	v.windows = len(seen)
	for p := 1; p <= 5; p++ {
		v.boundaries[p] = max(0, len(phaseEnds[p])-1)
	}
	sorted := make([]string, 0, len(values))
	for value := range values {
		sorted = append(sorted, value)
	}
	slices.Sort(sorted)
	u := plan.unit.Nanoseconds()
	for _, value := range sorted {
		var first, last int64 = -1, -1
		for k := range seen {
			if k.value == value {
				if first < 0 || k.end < first {
					first = k.end
				}
				last = max(last, k.end)
			}
		}
		todo := spans[value]
		slices.SortFunc(todo, func(a, b span) int { return cmp.Compare(a.first, b.first) })
		var open []span // ambiguous OKs whose first window has come, not yet placed
		for end := first; end <= last; end += u {
			for len(todo) > 0 && todo[0].first == end {
				open = append(open, todo[0])
				todo = todo[1:]
			}
			slices.SortFunc(open, func(a, b span) int { return cmp.Compare(a.last, b.last) })
			k := key{value, end}
			load := granted[k]
			n := min(max(0, plan.limit-load), len(open))
			load += n
			open = open[n:]
			for len(open) > 0 && open[0].last == end {
				load++ // no room left in any of its windows
				open = open[1:]
			}
			if load > plan.limit {
				v.overGrants = append(v.overGrants, fmt.Sprintf("value %s, window ending %s: %d granted of %d, by %v and %d ambiguous answers",
					value, time.Unix(0, end).Format("15:04:05.000"), load, plan.limit, grantedBy[k], load-granted[k]))
				v.maxExcess = max(v.maxExcess, load-plan.limit)
				if end > twoPrimaries[0].UnixNano() && end-u <= twoPrimaries[1].UnixNano() {
					v.overGrantsTwoPrimaries++
				}
			}
		}
	}
	return v
}

// envoySwapService is one throttlekit-rls instance running in process.
type envoySwapService struct {
	inst    *envoySwapInstance
	cancel  context.CancelFunc
	done    chan error
	stopped sync.Once
}

// envoySwapStartService runs throttlekit-rls on loopback ports, on store or
// on the rollout ro, and returns it once it answers about the domain.
func envoySwapStartService(t *testing.T, name, cfgDir, store string, ro *RolloutYAML, logs io.Writer) *envoySwapService {
	t.Helper()
	s := defaults()
	s.ConfigDir = cfgDir
	s.GRPCAddr, s.HTTPAddr, s.DebugAddr = "127.0.0.1:0", "127.0.0.1:0", "off"
	if store != "" {
		s.Store = store
	}
	s.Rollout = ro
	// A store that fails is an error the test sees, never a silent OK (the
	// default, fail open, would look like an over-grant); the call timeout
	// is far above a round trip even under the race detector.
	s.FailureMode = "error"
	s.CallTimeout = 5 * time.Second
	s.Shutdown = 5 * time.Second
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})).With("instance", name)

	ctx, cancel := context.WithCancel(context.Background())
	svc := &envoySwapService{cancel: cancel, done: make(chan error, 1)}
	ready := make(chan Addrs, 1)
	go func() { svc.done <- Run(ctx, &s, log, func(a Addrs) { ready <- a }) }()
	t.Cleanup(func() { svc.stop(t) })
	var addr string
	select {
	case a := <-ready:
		addr = a.GRPC
	case err := <-svc.done:
		svc.done <- err
		t.Fatalf("%s: Run returned before serving: %v", name, err)
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: not serving within 30s", name)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	svc.inst = &envoySwapInstance{name: name, client: rlsv3.NewRateLimitServiceClient(conn)}
	_, _, err = svc.inst.ask("probe-"+strconv.Itoa(int(time.Now().UnixNano()%1000)), 0)
	require.NoError(t, err, "%s: first request", name)
	return svc
}

// stop takes the instance out of service and ends Run, as a rolling deploy
// stops a pod once the balancer sends it nothing.
func (svc *envoySwapService) stop(t *testing.T) {
	svc.stopped.Do(func() {
		if svc.inst != nil {
			svc.inst.retire()
		}
		svc.cancel()
		select {
		case err := <-svc.done:
			assert.NoError(t, err, "Run")
		case <-time.After(15 * time.Second):
			t.Error("Run did not return within 15s of its context's end")
		}
	})
}

// envoySwapEnvoy is the envoy ratelimit process.
type envoySwapEnvoy struct {
	inst   *envoySwapInstance
	cmd    *exec.Cmd
	exited chan struct{}
	out    string // its log file
	killed sync.Once
}

// envoySwapStartEnvoy runs envoy ratelimit on loopback ports over the Redis
// at redisAddr, with its configuration under runtimeRoot, and returns it
// once it answers about the domain. It is killed at cleanup, with its whole
// process group.
func envoySwapStartEnvoy(t *testing.T, bin, redisAddr, runtimeRoot string) *envoySwapEnvoy {
	t.Helper()
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		e, err := envoySwapTryEnvoy(t, bin, redisAddr, runtimeRoot)
		if err == nil {
			return e
		}
		lastErr = err
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	t.Fatalf("envoy ratelimit: %v", lastErr)
	return nil
}

func envoySwapTryEnvoy(t *testing.T, bin, redisAddr, runtimeRoot string) (*envoySwapEnvoy, error) {
	// Three distinct free ports (http, grpc, debug): each listener is held
	// until all three are chosen, and closed just before envoy binds them.
	ports := make([]string, 3)
	var holds []net.Listener
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			for _, h := range holds {
				h.Close()
			}
			return nil, err
		}
		holds = append(holds, l)
		ports[i] = strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	}
	for _, h := range holds {
		h.Close()
	}
	cmd := exec.Command(bin)
	cmd.Env = []string{
		"USE_STATSD=false", "LOG_LEVEL=warn",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + redisAddr,
		"RUNTIME_ROOT=" + runtimeRoot, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_APPDIRECTORY=config",
		"RUNTIME_WATCH_ROOT=false", "RUNTIME_IGNOREDOTFILES=true",
		"HOST=127.0.0.1", "PORT=" + ports[0],
		"GRPC_HOST=127.0.0.1", "GRPC_PORT=" + ports[1],
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + ports[2],
	}
	// Its output goes to a file: without statsd, envoy ratelimit logs every
	// statistic it flushes, whatever LOG_LEVEL says.
	out, err := os.Create(filepath.Join(t.TempDir(), "envoy-ratelimit.log"))
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { out.Close() })
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	e := &envoySwapEnvoy{cmd: cmd, exited: make(chan struct{}), out: out.Name()}
	if err := e.start(); err != nil {
		return nil, err
	}
	t.Cleanup(func() { e.kill(t) })

	health := "http://127.0.0.1:" + ports[0] + "/healthcheck"
	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case <-e.exited:
			return nil, fmt.Errorf("exited before it was healthy (%v); its output:\n%s", cmd.ProcessState, envoySwapTail(out.Name()))
		default:
		}
		resp, err := http.Get(health)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("not healthy within 30s (last: %v); its output:\n%s", err, envoySwapTail(out.Name()))
		}
		time.Sleep(50 * time.Millisecond)
	}
	conn, err := grpc.NewClient("127.0.0.1:"+ports[1], grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { conn.Close() })
	e.inst = &envoySwapInstance{name: "envoy-ratelimit", envoy: true, client: rlsv3.NewRateLimitServiceClient(conn)}
	// Healthy is not yet answering: wait for an answer under the
	// configuration.
	for {
		_, _, err := e.inst.ask("probe-envoy", 0)
		if err == nil {
			return e, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no answer within 30s: %v; its output:\n%s", err, envoySwapTail(out.Name()))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// start starts the process and reaps it when it exits.
func (e *envoySwapEnvoy) start() error {
	if err := e.cmd.Start(); err != nil {
		return err
	}
	go func() {
		_ = e.cmd.Wait()
		close(e.exited)
	}()
	return nil
}

// kill kills envoy ratelimit's process group and waits for the process.
func (e *envoySwapEnvoy) kill(t *testing.T) {
	e.killed.Do(func() {
		select {
		case <-e.exited:
			return
		default:
		}
		_ = syscall.Kill(-e.cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-e.exited:
		case <-time.After(10 * time.Second):
			t.Errorf("envoy ratelimit (pid %d) still running 10s after SIGKILL", e.cmd.Process.Pid)
		}
	})
}

// envoySwapBinary returns envoy ratelimit's service binary, built from its
// source in the Go module cache (fetched through the module proxy when
// missing) and kept under the user's cache directory, so that later runs
// skip the build. It skips the test when the source cannot be fetched or
// built for want of a network, and fails it on any other build failure.
func envoySwapBinary(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("envoy swap: no go command to build envoy ratelimit with")
	}
	var cached string
	if dir, err := os.UserCacheDir(); err == nil {
		cached = filepath.Join(dir, "throttlekit-envoy-ratelimit", envoySwapVersion, "ratelimit")
		if fi, err := os.Stat(cached); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return cached
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	env := append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod", "CGO_ENABLED=0")
	tmp := t.TempDir()

	// The module's source: in the module cache, or fetched into it.
	dl := exec.CommandContext(ctx, goBin, "mod", "download", "-json", envoySwapModule+"@"+envoySwapVersion)
	dl.Dir, dl.Env = tmp, env
	var dlErr bytes.Buffer
	dl.Stderr = &dlErr
	js, err := dl.Output()
	var mod struct{ Dir, Error string }
	_ = json.Unmarshal(js, &mod)
	if err != nil || mod.Error != "" || mod.Dir == "" {
		envoySwapSkipOrFail(t, ctx, "fetching", fmt.Sprintf("%v %s %s", err, mod.Error, dlErr.String()))
	}

	built := filepath.Join(tmp, "ratelimit")
	start := time.Now()
	build := exec.CommandContext(ctx, goBin, "build", "-trimpath", "-o", built, "./src/service_cmd")
	build.Dir, build.Env = mod.Dir, env
	if out, err := build.CombinedOutput(); err != nil {
		envoySwapSkipOrFail(t, ctx, "building", fmt.Sprintf("%v\n%s", err, out))
	}
	t.Logf("built envoy ratelimit %s in %v", envoySwapVersion, time.Since(start).Round(time.Second))
	if cached == "" {
		return built
	}
	// Into the cache through a rename, so that a concurrent run never
	// sees half a binary.
	if err := os.MkdirAll(filepath.Dir(cached), 0o755); err != nil {
		t.Logf("not caching envoy ratelimit: %v", err)
		return built
	}
	staging := cached + ".tmp-" + strconv.Itoa(os.Getpid())
	if err := envoySwapCopy(built, staging); err != nil {
		t.Logf("not caching envoy ratelimit: %v", err)
		return built
	}
	if err := os.Rename(staging, cached); err != nil {
		_ = os.Remove(staging)
		t.Logf("not caching envoy ratelimit: %v", err)
		return built
	}
	return cached
}

// envoySwapNoNetwork matches what the go command says when it cannot
// reach the module proxy (or a toolchain download).
var envoySwapNoNetwork = regexp.MustCompile(`(?i)dial tcp|no such host|i/o timeout|connection refused|connection reset|network is unreachable|tls handshake timeout|proxyconnect|goproxy=off|module lookup disabled|temporary failure in name resolution|server misbehaving|unexpected eof|context deadline exceeded|signal: killed`)

// envoySwapSkipOrFail ends the test over a failed fetch or build: a skip
// (one line) when the network is to blame or the bound ran out, a failure
// otherwise.
func envoySwapSkipOrFail(t *testing.T, ctx context.Context, what, detail string) {
	t.Helper()
	first := strings.TrimSpace(detail)
	if i := strings.IndexByte(first, '\n'); i >= 0 {
		first = first[:i]
	}
	if ctx.Err() != nil || envoySwapNoNetwork.MatchString(detail) {
		t.Skipf("envoy swap: %s envoy ratelimit %s failed (no network?): %s", what, envoySwapVersion, first)
	}
	t.Fatalf("envoy swap: %s envoy ratelimit %s: %s", what, envoySwapVersion, detail)
}

// envoySwapTail returns the end of envoy ratelimit's log, less the
// statistics it logs.
func envoySwapTail(name string) string {
	b, _ := os.ReadFile(name)
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if l != "" && !strings.Contains(l, "gostats") {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines[max(0, len(lines)-30):], "\n")
}

func envoySwapCopy(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return errors.Join(err, os.Remove(dst))
	}
	return out.Close()
}

// TestEnvoySwapJudge checks the judge on made-up answers: it must see a
// window restarted or carried with a wrong end, and a quota granted twice,
// and must not see one where there is none.
func TestEnvoySwapJudge(t *testing.T) {
	plan := envoySwapPlan{unit: time.Second, unitName: "second", limit: 5}
	tk := &envoySwapInstance{name: "throttlekit"}
	envoy := &envoySwapInstance{name: "envoy", envoy: true}
	base := time.Unix(1_800_000_000, 0) // a second boundary
	at := func(ms int) time.Time { return base.Add(time.Duration(ms) * time.Millisecond) }
	// answer is a response to a call from sentMs to recvMs (after base).
	answer := func(in *envoySwapInstance, value string, sentMs, recvMs int, reset time.Duration, ok bool) envoySwapAnswer {
		code := rlsv3.RateLimitResponse_OVER_LIMIT
		if ok {
			code = rlsv3.RateLimitResponse_OK
		}
		return envoySwapAnswer{inst: in, phase: 1, value: value, sent: at(sentMs), recv: at(recvMs), code: code, reset: reset,
			limit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 5, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND}}
	}
	judge := func(as ...envoySwapAnswer) envoySwapVerdict {
		return envoySwapJudge(plan, as, [2]time.Time{})
	}

	// Exact answers: throttlekit decided at 101 ms (reset 899 ms), envoy at
	// second 0 (reset 1 s).
	v := judge(answer(tk, "a", 100, 102, 899*time.Millisecond, true), answer(envoy, "a", 100, 102, time.Second, true))
	assert.Empty(t, v.resetChanges)
	assert.Equal(t, 1, v.windows)

	// A window opened at the first request (ends at 1.337 s), one carried
	// with the previous window's end (reset 0), an envoy reset of 2 s.
	v = judge(answer(tk, "a", 100, 102, 1236*time.Millisecond, true), answer(tk, "a", 100, 102, 0, true),
		answer(envoy, "a", 100, 102, 2*time.Second, true))
	assert.Len(t, v.resetChanges, 3)

	// An envoy call straddling a boundary may belong to either window.
	assert.Len(t, envoySwapWindows(plan, answer(envoy, "a", 999, 1001, time.Second, true)), 2)
	assert.Len(t, envoySwapWindows(plan, answer(tk, "a", 999, 1001, 999*time.Millisecond+500*time.Microsecond, true)), 1)

	var as []envoySwapAnswer
	for i := range 6 {
		as = append(as, answer(tk, "b", 10*i, 10*i+1, time.Second-time.Duration(10*i)*time.Millisecond, true))
	}
	v = judge(as...)
	assert.Len(t, v.overGrants, 1, "6 granted in one window")
	assert.Equal(t, 1, v.maxExcess)

	// Five granted in each of two windows and one straddler between them:
	// an over-grant whichever window it was; with four in the second, none.
	full := func(value string, n, window int) []envoySwapAnswer {
		var out []envoySwapAnswer
		for i := range n {
			ms := 1000*window + 100 + 10*i
			out = append(out, answer(tk, value, ms, ms+1, time.Duration(1000*(window+1)-ms)*time.Millisecond, true))
		}
		return out
	}
	straddler := answer(envoy, "c", 999, 1001, time.Second, true)
	v = judge(append(append(full("c", 5, 0), full("c", 5, 1)...), straddler)...)
	assert.Len(t, v.overGrants, 1)
	straddler.value = "d"
	v = judge(append(append(full("d", 5, 0), full("d", 4, 1)...), straddler)...)
	assert.Empty(t, v.overGrants)
	assert.Equal(t, 1, v.ambiguous)

	// A call slower than the unit may belong to any window it spans: room
	// in the last one is enough, none in any is an over-grant.
	slow := answer(envoy, "e", 900, 2100, time.Second, true)
	assert.Len(t, envoySwapWindows(plan, slow), 3)
	v = judge(append(append(append(full("e", 5, 0), full("e", 5, 1)...), full("e", 4, 2)...), slow)...)
	assert.Empty(t, v.overGrants)
	slow.value = "f"
	v = judge(append(append(append(full("f", 5, 0), full("f", 5, 1)...), full("f", 5, 2)...), slow)...)
	assert.Len(t, v.overGrants, 1)
}
