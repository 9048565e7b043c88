package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	redisgroups "github.com/throttlekit/throttlekit/backend/redis/groups"
	"github.com/throttlekit/throttlekit/internal/localserver"
	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler"
)

// stallLegName names the stalled group's leg in the verdict and the report.
const stallLegName = "stalled Redis group"

// Bursts of the stalled group: its primary is stopped (SIGSTOP) for
// stallBurst at the start of every stallPeriod, longer than the
// throttler's default call timeout (100 ms), so that calls routed to the
// group time out while it is stopped and others, queued with them in a
// batch or not, go on.
const (
	stallPeriod = time.Second
	stallBurst  = 250 * time.Millisecond
)

// stallPlan is what the stalled group's leg does, or why it does not run.
type stallPlan struct {
	// skipped says why the leg does not run; empty when it does.
	skipped string
	// group names the stopped group, primary its primary.
	group   string
	primary *localserver.Redis
}

// stallPlan returns the stalled group's plan: the first group's primary,
// when the demo started the Redis servers itself (it cannot stop servers
// it did not start).
func (s *servers) stallPlan(cfg Config) stallPlan {
	switch {
	case !cfg.Stall:
		return stallPlan{skipped: "-stall=false"}
	case cfg.Embedded:
		return stallPlan{skipped: "-embedded: no server to stop"}
	case s.primaries[shardNames[0]] == nil:
		return stallPlan{skipped: "the Redis groups were not started by the demo, which stops only its own servers"}
	}
	return stallPlan{group: shardNames[0], primary: s.primaries[shardNames[0]]}
}

// describe says what the leg does, in one line.
func (p stallPlan) describe() string {
	return fmt.Sprintf("Redis group %s's primary stopped (SIGSTOP) for %s every %s, clients calling, default options",
		p.group, stallBurst, stallPeriod)
}

// stallDuration returns the stalled phase's length: three ramp phases
// (15 s, or 3.75 s with -short).
func stallDuration(cfg Config) time.Duration { return 3 * cfg.PhaseDuration }

// runStall is the stalled Redis group (issue 27, item 7): after the
// migration, the API decides on the Redis groups alone with the
// throttler's and the backend's default options (call timeout 100 ms,
// batching on), twice as many clients as the modes call it, and one
// group's primary is stopped in short bursts for the whole phase. Calls
// to the stopped group time out and the middleware marks their responses
// degraded, which is allowed; every other response must be the store's
// own verdict. The clients count the results that contradict the store
// (see contradicts) beside the ResetAt changes and double grants, and the
// leg passes only with none of the three, some responses degraded (the
// stall reached the clients), and no failed request.
func runStall(ctx context.Context, cfg Config, srv *servers, plan stallPlan, policy *throttler.Policy,
	w outputs) (legRecord, error) {
	out := w.detail
	started := time.Now()
	prefix := "mdemo-" + fmt.Sprintf("%x", started.UnixNano()) + "-stall"
	shards, err := redisgroups.Open(srv.shardConfig, redisgroups.WithBackendOptions(redisbackend.WithPrefix(prefix+":")))
	if err != nil {
		return legRecord{}, fmt.Errorf("redis shards: %w", err)
	}
	defer func() {
		if err := shards.Close(); err != nil {
			fmt.Fprintf(out, "migrate-demo: closing the Redis groups: %v\n", err)
		}
	}()
	store := labelled{backend: shards, side: rollout.SideNew, label: shardLabel("redis", shards)}
	// The defaults (a call timeout of 100 ms), but for the log lines,
	// which go to the run's log rather than the screen.
	th, err := throttler.New(store, throttler.WithLogger(w.logger))
	if err != nil {
		return legRecord{}, err
	}
	handler, err := newAPI(th, policy)
	if err != nil {
		return legRecord{}, err
	}
	api, err := startAPI(handler)
	if err != nil {
		return legRecord{}, err
	}
	defer func() {
		if err := api.Close(); err != nil {
			fmt.Fprintf(out, "migrate-demo: stopping the API: %v\n", err)
		}
	}()

	lcfg := cfg
	lcfg.Identifiers = 2 * cfg.Identifiers
	duration := stallDuration(cfg)
	// Clients start over the first period, before the first burst, so
	// that most hold an open window when the group first stops.
	lg := newLoad(lcfg, api.URL(), 1, stallPeriod*4/5, func(string) bool { return false })
	fmt.Fprintf(out, "\n== %s, keys %s* ==\n", stallLegName, prefix)
	fmt.Fprintf(out, "  %s; %s\n", plan.describe(), describeShards(srv.shardConfig))
	fmt.Fprintf(out, "  api: %s, policy %q, throttler and backend with default options (call timeout %s, batching on)\n",
		api.URL(), policy.String(), throttler.DefaultCallTimeout)
	fmt.Fprintf(out, "  load: %d clients, %d abusive at %g req/s, the others at %g req/s; one phase of %s\n",
		len(lg.clients), lg.abusive(), cfg.AbusiveRate, cfg.NormalRate, duration)

	stopLoad := lg.start(ctx, cfg, duration)
	defer stopLoad()

	stallCtx, stopStalls := context.WithCancel(ctx)
	type stallOutcome struct {
		bursts  int
		stalled time.Duration
		err     error
	}
	stalls := make(chan stallOutcome, 1)
	go func() {
		n, d, err := stallBursts(stallCtx, plan.primary, stallPeriod, stallBurst)
		stalls <- stallOutcome{n, d, err}
	}()
	always100 := func() int { return 100 }
	lg.setPhase(0)
	res, ok := runPhase(ctx, cfg, lg, always100, 0, 1, duration, w.progress)
	stopStalls()
	st := <-stalls
	lg.setPhase(1)
	res.totals = lg.collect(0)
	res.p50, res.p99 = lg.latencies(0)
	res.target, res.source, res.stalls, res.stalled = 100, "stalled", st.bursts, st.stalled
	res.interrupted = !ok
	stopLoad()

	names := reportNames{sides: [2]string{"-", "redis"}, plain: "no rollout: a throttler over the Redis groups alone"}
	writePhase(out, res, names)
	fmt.Fprintf(out, "  stalls: %d bursts of %s on group %s's primary, %.1f s stopped in all\n", st.bursts, stallBurst,
		plan.group, st.stalled.Seconds())
	for _, s := range []struct {
		title   string
		samples *errorSamples
	}{{"broken invariants", &lg.evidence}, {"failed requests", &lg.samples}} {
		if list := s.samples.list(); len(list) > 0 {
			fmt.Fprintf(out, "  %s (first examples):\n", s.title)
			for _, msg := range list {
				fmt.Fprintf(out, "    %s\n", msg)
			}
		}
	}
	v := judgeStall(res, st.err, len(lg.clients))
	fmt.Fprintf(out, "\n%s, in %.1f s\n", v.Line, time.Since(started).Seconds())
	return legRecord{key: "stall", name: stallLegName, verdict: v, phases: []phaseResult{res},
		timeline: lg.timeline.snapshot(), sides: names.sides, evidence: lg.evidence.list(),
		note: plan.describe()}, nil
}

// stallBursts stops primary for burst at the start of every period until
// ctx ends, and returns the bursts made and the time the server spent
// stopped. The server is always resumed before it returns.
func stallBursts(ctx context.Context, primary *localserver.Redis, period, burst time.Duration) (int, time.Duration, error) {
	ticker := time.NewTicker(period)
	defer ticker.Stop()
	var n int
	var stopped time.Duration
	for {
		select {
		case <-ctx.Done():
			return n, stopped, nil
		case <-ticker.C:
		}
		if err := primary.Pause(); err != nil {
			return n, stopped, err
		}
		began := time.Now()
		t := time.NewTimer(burst)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		err := primary.Resume()
		stopped += time.Since(began)
		n++
		if err != nil {
			return n, stopped, err
		}
	}
}

// judgeStall checks the stalled group's phase: no ResetAt change, no
// double grant, no result contradicting the store, no denial claiming
// quota, no failed request, some allowed and some denied responses, and
// the stall reached the clients (at least one burst, some degraded
// responses). Degraded responses are allowed: the middleware marks them.
func judgeStall(p phaseResult, stallErr error, clients int) ModeVerdict {
	all := p.totals.all()
	v := ModeVerdict{Leg: stallLegName, requests: all.requests, moves: all.moved, checked: all.checked}
	check := func(ok bool, format string, args ...any) {
		if !ok {
			v.Failures = append(v.Failures, fmt.Sprintf(format, args...))
		}
	}
	check(all.resetChanges == 0, "no ResetAt change (%d)", all.resetChanges)
	check(all.doubleGrants == 0, "no double grant (%d)", all.doubleGrants)
	check(all.contradictions == 0, "no result contradicting the store (%d)", all.contradictions)
	check(all.quotaClaims == 0, "no denial claiming quota (%d)", all.quotaClaims)
	check(p.totals.errors == 0, "no failed requests (%d)", p.totals.errors)
	check(all.allowed > 0 && all.denied > 0, "allowed and denied (%d allowed, %d denied)", all.allowed, all.denied)
	check(p.stalls > 0 && all.degraded > 0, "the stall reached the clients (%d bursts, %d degraded responses)",
		p.stalls, all.degraded)
	check(stallErr == nil, "the group stopped and resumed (%v)", stallErr)
	check(!p.interrupted, "complete run (interrupted)")
	if len(v.Failures) > 0 {
		v.Line = fmt.Sprintf("%s: FAIL: %s", stallLegName, strings.Join(v.Failures, "; "))
		return v
	}
	v.Pass = true
	v.Line = fmt.Sprintf("%s: PASS (%d bursts of %s, %.1f s stopped: %s responses from %d clients, %s degraded and marked; "+
		"0 results contradicting the store, 0 ResetAt changes, 0 double grants, 0 denials claiming quota, 0 failed)",
		stallLegName, p.stalls, stallBurst, p.stalled.Seconds(), fmtInt(all.requests), clients, fmtInt(all.degraded))
	return v
}
