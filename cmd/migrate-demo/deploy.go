package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"

	legacybackend "github.com/throttlekit/throttlekit/backend/legacy"
	memcachedbackend "github.com/throttlekit/throttlekit/backend/memcached"
	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	redisgroups "github.com/throttlekit/throttlekit/backend/redis/groups"
	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler"
)

// deployLegName names the rolling deploy's leg in the verdict and the
// report; deployLegKey is its short name.
const (
	deployLegName = "rolling deploy"
	deployLegKey  = "deploy"
)

// deployingStore is the X-Demo-Store value of responses a new process
// decided in the legacy keys (backend/legacy with Deciding). Its kind
// (storeKind) is the hand-written limiter's, legacyStore: both count in
// the same keys, so a client served by an old and then a new process has
// not moved.
const deployingStore = legacyStore + "/deciding"

// deployProcesses is the number of API processes behind the round-robin
// during the rolling deploy.
const deployProcesses = 3

// maxDeployWindow bounds the leg's window, so that several windows roll
// over while old and new processes serve together.
const maxDeployWindow = 5 * time.Second

// The leg's phases, in order.
const (
	deployOldOnly = iota
	deployOverlap
	deployMirror100
	deployRedisAlone
	deployPhases
)

// deployPhaseNames name the phases in the summary and the report.
var deployPhaseNames = [deployPhases]string{"old only", "overlap", "100% mirror", "Redis alone"}

// deployPlan is what the rolling deploy's leg does, or why it does not run.
type deployPlan struct {
	// skipped says why the leg does not run; empty when it does.
	skipped string
	// policy is the leg's policy: the one limit the hand-written limiter
	// counts (the demo policy's shortest fixed window), at a window of at
	// most maxDeployWindow and the same rate; from names the demo
	// policy's limit it stands for.
	policy *throttler.Policy
	from   throttler.Limit
	// window is the policy's window; overlap how long old and new
	// processes serve together (three windows).
	window, overlap time.Duration
}

// planRollingDeploy returns the rolling deploy's plan. It needs memcached
// for the hand-written limiter, so it does not run with -embedded.
func planRollingDeploy(cfg Config, policy *throttler.Policy) (deployPlan, error) {
	switch {
	case !cfg.RollingDeploy:
		return deployPlan{skipped: "-rolling-deploy=false"}, nil
	case cfg.Embedded:
		return deployPlan{skipped: "-embedded: the hand-written limiter needs memcached"}, nil
	}
	limit, ok := legacyLimit(policy)
	if !ok {
		return deployPlan{skipped: "the policy has no fixed window for the hand-written limiter to count"}, nil
	}
	window, quota := limit.Window, limit.Max
	if window > maxDeployWindow {
		// The same rate on a shorter window: a client's share of its quota
		// stays what it is in the modes.
		quota = max(1, (quota*int64(maxDeployWindow)+int64(window)/2)/int64(window))
		window = maxDeployWindow
	}
	p, err := throttler.ParsePolicy(resourceName, fmt.Sprintf("%d/%s", quota, window))
	if err != nil {
		return deployPlan{}, fmt.Errorf("rolling deploy: %w", err)
	}
	return deployPlan{policy: p, from: limit, window: window, overlap: 3 * window}, nil
}

// describePolicy says what the leg's policy is and where it comes from.
func (p deployPlan) describePolicy() string {
	l := p.policy.Limits()[0]
	s := fmt.Sprintf("policy %d/%s, the hand-written limiter's own limit", l.Max, l.Window)
	if l.Window != p.from.Window {
		s += fmt.Sprintf(" (the demo policy's %d/%s at %s windows)", p.from.Max, p.from.Window, l.Window)
	}
	return s
}

// describe says what the leg does, in one line.
func (p deployPlan) describe() string {
	return fmt.Sprintf("%d processes behind a round-robin, from the hand-written limiter to a mirror rollout at 0%% "+
		"from backend/legacy (Deciding) to the Redis groups, old and new together for %s; then 100%%, then Redis alone; %s",
		deployProcesses, p.overlap, p.describePolicy())
}

// deployRun is what judgeDeploy needs beyond the phases.
type deployRun struct {
	plan deployPlan
	// clients counts the clients; overlap is how long old and new
	// processes served together, as measured.
	clients int
	overlap time.Duration
	// secondaryErrors counts mirror writes lost; unmatched the legacy
	// backends' calls for a policy whose limit is not the legacy one;
	// deployErr is the deployers' failure, if any.
	secondaryErrors, unmatched uint64
	deployErr                  error
}

// runRollingDeploy is the rolling deploy of the legacy leg (issue 27,
// items 3 and 7), on keys of its own. Three API processes behind the
// round-robin run the hand-written limiter, every client on it; then a
// rolling deploy replaces them one at a time, over three windows, by new
// processes whose throttler decides through a mirror rollout at 0 % from
// backend/legacy with Deciding (counting in the hand-written limiter's
// keys, as the old code does) to the Redis groups, written alongside.
// Once no old process remains, each new process goes to 100 % (the Redis
// groups decide, the legacy keys still written), a tenth of a window
// apart, as processes read a flag at their own times; a window later,
// a second rolling deploy puts a throttler over the Redis groups alone
// in their place. Clients call throughout, and the leg passes only with
// no ResetAt change, no double grant and no result contradicting the
// store, in any phase.
func runRollingDeploy(ctx context.Context, cfg Config, srv *servers, plan deployPlan, w outputs) (legRecord, error) {
	out := w.detail
	started := time.Now()
	prefix := "mdemo-" + fmt.Sprintf("%x", started.UnixNano()) + "-deploy"
	client, err := memcachedbackend.NewClient(cfg.CallTimeout, srv.memcachedAddr)
	if err != nil {
		return legRecord{}, fmt.Errorf("memcached %q: %w", srv.memcachedAddr, err)
	}
	defer func() { _ = client.Close() }()
	groups, err := redisgroups.Open(srv.shardConfig, redisgroups.WithBackendOptions(redisbackend.WithPrefix(prefix+":")))
	if err != nil {
		return legRecord{}, fmt.Errorf("redis shards: %w", err)
	}
	defer func() {
		if err := groups.Close(); err != nil {
			fmt.Fprintf(out, "migrate-demo: closing the Redis groups: %v\n", err)
		}
	}()
	redis := labelled{backend: groups, side: rollout.SideNew, label: shardLabel("redis", groups)}
	legacy := newLegacyLimiter(client, plan.policy, prefix)

	var secondary, backendErrs errorSamples
	opts := []throttler.Option{
		throttler.WithCallTimeout(cfg.CallTimeout),
		throttler.WithLogger(w.logger),
		throttler.WithObserver(throttler.ObserverFunc(func(_ context.Context, e throttler.Event) {
			if e.Err != nil {
				backendErrs.add(e.Err)
			}
		})),
	}
	// The new processes, each with its own legacy backend, rollout and
	// flag, as separate processes have.
	type newProcess struct {
		api      http.Handler
		flag     *rollout.StaticSource
		rollout  *rollout.Backend
		deciding *legacybackend.Memcached
	}
	var fresh []newProcess
	for range deployProcesses {
		deciding, err := legacybackend.NewMemcached(client, legacy.window, // the hand-written limiter's window
			legacybackend.Deciding(), legacybackend.WithKeyFunc(legacy.key), legacybackend.WithLogger(w.logger))
		if err != nil {
			return legRecord{}, err
		}
		flag, err := rollout.NewStaticSource(0)
		if err != nil {
			return legRecord{}, err
		}
		rb, err := rollout.New(labelled{backend: deciding, side: rollout.SideOld, label: constLabel(deployingStore)},
			redis, flag, rollout.WithMode(rollout.MirrorMode), rollout.WithSecondaryErrorHandler(secondary.add))
		if err != nil {
			return legRecord{}, err
		}
		th, err := throttler.New(rb, opts...)
		if err != nil {
			return legRecord{}, err
		}
		api, err := newAPI(th, plan.policy)
		if err != nil {
			return legRecord{}, err
		}
		fresh = append(fresh, newProcess{api: api, flag: flag, rollout: rb, deciding: deciding})
	}
	alone, err := throttler.New(redis, opts...)
	if err != nil {
		return legRecord{}, err
	}
	aloneAPI, err := newAPI(alone, plan.policy)
	if err != nil {
		return legRecord{}, err
	}

	dep := newDeployment(deployProcesses, legacy.handler(identify, app))
	api, err := startAPI(dep)
	if err != nil {
		return legRecord{}, err
	}
	defer func() {
		if err := api.Close(); err != nil {
			fmt.Fprintf(out, "migrate-demo: stopping the API: %v\n", err)
		}
	}()

	window := plan.window
	rampSpread := window / 10
	durations := [deployPhases]time.Duration{window, plan.overlap, window + deployProcesses*rampSpread, window}
	var total time.Duration
	for _, d := range durations {
		total += d
	}
	lg := newLoad(cfg, api.URL(), deployPhases, window*4/5, func(string) bool { return true })
	fmt.Fprintf(out, "\n== %s, keys %s* ==\n", deployLegName, prefix)
	fmt.Fprintf(out, "  %s\n", plan.describe())
	fmt.Fprintf(out, "  old: memcached %s, the hand-written limiter (INCR %s:rl:<id>, <key>%s in Unix seconds); "+
		"new: backend/legacy Deciding in the same keys, mirrored to redis %s\n", srv.memcachedAddr, prefix,
		legacybackend.ResetSuffix, describeShards(srv.shardConfig))
	fmt.Fprintf(out, "  api: %s, %s; load: %d clients, %d abusive at %g req/s, the others at %g req/s, all on the old processes first\n",
		api.URL(), plan.describePolicy(), len(lg.clients), lg.abusive(), cfg.AbusiveRate, cfg.NormalRate)

	stopLoad := lg.start(ctx, cfg, total)
	defer stopLoad()

	run := deployRun{plan: plan, clients: len(lg.clients)}
	names := reportNames{mode: rollout.MirrorMode, sides: [2]string{"legacy", "redis"}}
	var results []phaseResult
	var before rollout.Stats
	interrupted := false
	for i := range deployPhases {
		lg.setPhase(i)
		target := 0
		// What changes at the phase's start runs beside the load, and the
		// phase lasts at least as long as it does.
		var change func() error
		switch i {
		case deployOverlap:
			spread := plan.overlap / (deployProcesses - 1)
			change = func() error {
				began := time.Now()
				err := rollingDeploy(spread)(ctx, dep, func(p int) http.Handler { return fresh[p].api })
				run.overlap = time.Since(began)
				return err
			}
		case deployMirror100:
			target = 100
			change = func() error {
				began := time.Now()
				for p, proc := range fresh {
					if err := sleepUntil(ctx, began.Add(time.Duration(p)*rampSpread)); err != nil {
						return err
					}
					if err := proc.flag.Set(100); err != nil {
						return err
					}
				}
				return nil
			}
		case deployRedisAlone:
			target = 100
			change = func() error {
				return rollingDeploy(rampSpread)(ctx, dep, func(int) http.Handler { return aloneAPI })
			}
		}
		changed := make(chan error, 1)
		if change != nil {
			go func() { changed <- change() }()
		} else {
			changed <- nil
		}
		fixed := func() int { return target }
		res, ok := runPhase(ctx, cfg, lg, fixed, i, deployPhases, durations[i], w.progress)
		if err := <-changed; err != nil && run.deployErr == nil {
			run.deployErr = err
		}
		lg.setPhase(i + 1)
		res.name = deployPhaseNames[i]
		res.about = describeDeployPhase(i, plan)
		res.totals = lg.collect(i)
		res.p50, res.p99 = lg.latencies(i)
		var after rollout.Stats
		for _, proc := range fresh {
			after = addStats(after, proc.rollout.Stats())
		}
		res.stats, before = statsDelta(after, before), after
		res.target, res.source = target, deployLegName
		res.interrupted = !ok
		phaseNames := names
		if i == deployOldOnly || i == deployRedisAlone {
			phaseNames.plain = []string{"no rollout: the hand-written limiter in every process",
				"", "", "no rollout: a throttler over the Redis groups alone"}[i]
		}
		writePhase(out, res, phaseNames)
		results = append(results, res)
		if !ok {
			interrupted = true
			break
		}
	}
	stopLoad()

	for p, proc := range fresh {
		s := proc.deciding.Stats()
		run.unmatched += s.Unmatched
		run.secondaryErrors += proc.rollout.Stats().SecondaryErrors
		fmt.Fprintf(out, "  new process %d: legacy keys: %s decisions (%s opened a window), %s windows written by the mirror, "+
			"%s contended, %s unmatched\n", p+1, fmtUint(s.Decided), fmtUint(s.Opened), fmtUint(s.Seeded),
			fmtUint(s.Contended), fmtUint(s.Unmatched))
	}
	for _, s := range []struct {
		title   string
		samples *errorSamples
	}{{"broken invariants", &lg.evidence}, {"failed requests", &lg.samples}, {"backend errors", &backendErrs},
		{"other store errors", &secondary}} {
		if list := s.samples.list(); len(list) > 0 {
			fmt.Fprintf(out, "  %s (first examples):\n", s.title)
			for _, msg := range list {
				fmt.Fprintf(out, "    %s\n", msg)
			}
		}
	}
	v := judgeDeploy(results, run, interrupted)
	fmt.Fprintf(out, "\n%s, in %.1f s\n", v.Line, time.Since(started).Seconds())
	return legRecord{key: deployLegKey, name: deployLegName, verdict: v, phases: results,
		timeline: lg.timeline.snapshot(), sides: names.sides, evidence: lg.evidence.list(),
		note: plan.describe()}, nil
}

// describeDeployPhase says what phase i of the rolling deploy does.
func describeDeployPhase(i int, plan deployPlan) string {
	switch i {
	case deployOldOnly:
		return fmt.Sprintf("old processes only: %d running the hand-written limiter", deployProcesses)
	case deployOverlap:
		return fmt.Sprintf("rolling deploy: one process replaced every %s by new code (mirror at 0%%: the legacy keys "+
			"decide, Redis written alongside), old and new serving together", plan.overlap/(deployProcesses-1))
	case deployMirror100:
		return "no old process left: each new process at 100% in mirror mode (Redis decides, the legacy keys written), " +
			"a tenth of a window apart"
	}
	return "a second rolling deploy: a throttler over the Redis groups alone"
}

// addStats sums two processes' rollout counters.
func addStats(a, b rollout.Stats) rollout.Stats {
	return rollout.Stats{
		DefaultRouted:        a.DefaultRouted + b.DefaultRouted,
		Mirrored:             a.Mirrored + b.Mirrored,
		MirrorShortfalls:     a.MirrorShortfalls + b.MirrorShortfalls,
		MirrorShortfallUnits: a.MirrorShortfallUnits + b.MirrorShortfallUnits,
		SecondaryErrors:      a.SecondaryErrors + b.SecondaryErrors,
		ShadowCompared:       a.ShadowCompared + b.ShadowCompared,
		ShadowMismatches:     a.ShadowMismatches + b.ShadowMismatches,
		AllowedDenied:        a.AllowedDenied + b.AllowedDenied,
		DeniedAllowed:        a.DeniedAllowed + b.DeniedAllowed,
		RemainingDiffers:     a.RemainingDiffers + b.RemainingDiffers,
		ResetDiffers:         a.ResetDiffers + b.ResetDiffers,
		MirrorDiverged:       a.MirrorDiverged + b.MirrorDiverged,
		SeedChecks:           a.SeedChecks + b.SeedChecks,
		Seeded:               a.Seeded + b.Seeded,
		SeedUnsupported:      a.SeedUnsupported + b.SeedUnsupported,
	}
}

// judgeDeploy checks the rolling deploy's phases: in every phase no ResetAt
// change, no double grant, no result contradicting the store, no denial
// claiming quota, no degraded response and no failed request; some
// allowed and some denied; during the overlap both old and new processes
// served and windows rolled over; at 100 % windows moved to Redis and
// some moves were checked in an open window; Redis alone decided the last
// phase; no mirror write lost, no call for a policy the legacy backend
// does not match, and every phase ran.
func judgeDeploy(results []phaseResult, run deployRun, interrupted bool) ModeVerdict {
	var broken breaches
	fail := broken.fail
	var total sideCounts
	var rolled int64
	for _, p := range results {
		all := p.totals.all()
		total.add(all)
		ph := fmt.Sprintf("phase %d %s", p.index+1, p.name)
		for _, c := range []struct {
			invariant string
			n         int64
		}{{"no ResetAt change", all.resetChanges}, {"no double grant", all.doubleGrants},
			{"no result contradicting the store", all.contradictions}, {"no denial claiming quota", all.quotaClaims},
			{"no degraded responses", all.degraded}, {"no failed requests", p.totals.errors}} {
			if c.n > 0 {
				fail(c.invariant, fmt.Sprintf("%s: %d", ph, c.n))
			}
		}
		switch p.index {
		case deployOverlap:
			rolled = all.rolled
			if p.totals.decisions[legacyStore] == 0 || p.totals.decisions[deployingStore] == 0 {
				fail("old and new processes served together", fmt.Sprintf("%s: %d responses from old processes, %d from new",
					ph, p.totals.decisions[legacyStore], p.totals.decisions[deployingStore]))
			}
			if all.rolled == 0 {
				fail("windows rolled over during the overlap", ph+": none")
			}
		case deployMirror100:
			if all.moved == 0 || all.checked == 0 {
				fail("windows carried to Redis", fmt.Sprintf("%s: %d moves, %d checked in an open window", ph, all.moved, all.checked))
			}
		case deployRedisAlone:
			for store, n := range p.totals.decisions {
				if storeKind(store) != "redis" {
					fail("Redis alone at the end", fmt.Sprintf("%s: %d responses from %s", ph, n, store))
				}
			}
		}
	}
	if total.allowed == 0 || total.denied == 0 {
		fail("allowed and denied", fmt.Sprintf("%d allowed, %d denied", total.allowed, total.denied))
	}
	if run.secondaryErrors > 0 {
		fail("no mirror write lost", fmt.Sprintf("%d", run.secondaryErrors))
	}
	if run.unmatched > 0 {
		fail("the legacy backend matched the policy", fmt.Sprintf("%d calls unmatched", run.unmatched))
	}
	if run.deployErr != nil {
		fail("the deploy ran", run.deployErr.Error())
	}
	if interrupted || len(results) < deployPhases {
		fail("complete run", fmt.Sprintf("%d of %d phases", len(results), deployPhases))
	}
	v := ModeVerdict{Leg: deployLegName, requests: total.requests, moves: total.moved, checked: total.checked}
	v.Failures = broken.failures()
	if len(v.Failures) > 0 {
		v.Line = fmt.Sprintf("%s: FAIL: %s", deployLegName, strings.Join(v.Failures, "; "))
		return v
	}
	v.Pass = true
	v.Line = fmt.Sprintf("%s: PASS · %s · %d processes, old and new together for %.1f s, %s windows rolled over meanwhile · "+
		"%s responses from %d clients, %s moves (%s checked in an open window), 0 ResetAt changes, 0 double grants, "+
		"0 contradicting", deployLegName, run.plan.describePolicy(), deployProcesses, run.overlap.Seconds(), fmtInt(rolled),
		fmtInt(total.requests), run.clients, fmtInt(total.moved), fmtInt(total.checked))
	return v
}
