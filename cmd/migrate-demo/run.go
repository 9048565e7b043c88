package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Unleash/unleash-client-go/v4"

	legacybackend "github.com/throttlekit/throttlekit/backend/legacy"
	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/rollout/unleashflag"
	"github.com/throttlekit/throttlekit/throttler"
)

// unleashWait bounds the wait for the Unleash server's first answer.
const unleashWait = 15 * time.Second

// flagSource is the rollout's flag source with what the demo needs to
// drive and describe it.
type flagSource struct {
	rollout.FlagSource
	// static is set for a static percentage, which the demo ramps itself.
	static *rollout.StaticSource
	// unleash is set when an Unleash server says the percentage.
	unleash *unleashflag.Source
}

func (f flagSource) name() string {
	if f.unleash != nil {
		return "unleash"
	}
	return "static"
}

// percent returns the percentage in force on the new side.
func (f flagSource) percent() int {
	if sp := f.Split(); sp != nil {
		return sp.Percent()
	}
	return 0
}

// outputs are where a run writes: detail takes the full log (every
// phase's table, each mode's summary and evidence), progress the progress
// lines (io.Discard for none), logger the throttlers' own log lines (into
// detail). All are safe for concurrent use.
type outputs struct {
	detail, progress io.Writer
	logger           *slog.Logger
}

// lockedWriter serialises writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// run is the whole demo: it starts the servers (or checks those named),
// runs every mode of cfg.Modes one after another on fresh keys (see
// runMode), then the rolling deploy (see runRollingDeploy) and the stalled
// Redis group (see runStall), writes the HTML
// report and the full log, and ends with the summary on out, the verdict
// first. It stops everything it started. The full log goes to out as well
// with cfg.Verbose; without it out shows a line per leg, a progress line
// on a terminal, and the summary. An error means the demo could not run at
// all (missing servers, bad configuration); a run that went wrong is a
// failing Verdict.
func run(ctx context.Context, cfg Config, out io.Writer) (Verdict, error) {
	rec, err := runAll(ctx, cfg, out)
	if err != nil {
		return Verdict{}, err
	}
	rec.reportPath, rec.logPath = cfg.reportPaths(rec.started)
	var saveErr error
	if rec.reportPath != "" {
		saveErr = rec.save()
	}
	writeScreenSummary(out, rec, saveErr)
	return rec.verdict, nil
}

// runAll runs every leg and returns what the report and the summary show.
func runAll(ctx context.Context, cfg Config, out io.Writer) (*runRecord, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	policy, err := throttler.ParsePolicy(resourceName, cfg.Policy)
	if err != nil {
		return nil, err
	}
	rec := &runRecord{cfg: cfg, started: time.Now(), policy: policy.String()}
	// Throttlers log from their own goroutines, and the run's writes reach
	// out both through detail (-v) and as progress: each writer is locked.
	screen := &lockedWriter{w: out}
	w := outputs{detail: &lockedWriter{w: &rec.log}, progress: io.Discard}
	if cfg.Verbose {
		w.detail = &lockedWriter{w: io.MultiWriter(&rec.log, screen)}
	}
	w.logger = slog.New(slog.NewTextHandler(w.detail, nil))
	if cfg.Progress > 0 && (cfg.ProgressInPlace || cfg.Verbose) {
		w.progress = screen
	}
	out = screen
	srv, err := openServers(cfg)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := srv.Close(); err != nil {
			fmt.Fprintf(w.detail, "migrate-demo: stopping the servers: %v\n", err)
		}
	}()
	rec.journey = "memcached to sharded Redis"
	if cfg.Embedded {
		rec.journey = "memory to sharded memory (-embedded)"
	}
	header := fmt.Sprintf("migrate-demo: moving live rate-limit windows from %s, in %s mode; each mode: a warm-up of %s "+
		"on the old store alone, then the rollout, %d phases of %s", rec.journey,
		strings.Join(strings.Split(joinModes(cfg.Modes), ","), " then "), cfg.warmUp(policy).Round(time.Millisecond),
		len(cfg.Ramp), cfg.PhaseDuration)
	fmt.Fprintln(w.detail, header)
	if !cfg.Verbose {
		fmt.Fprintln(out, header)
		fmt.Fprintln(out, "  (the full log goes to the report; -v prints it here)")
	}

	source, err := openFlagSource(ctx, cfg, w.detail)
	if err != nil {
		return nil, err
	}
	if source.unleash != nil {
		defer source.unleash.Close()
	}

	stall := srv.stallPlan(cfg)
	deploy, err := planRollingDeploy(cfg, policy)
	if err != nil {
		return nil, err
	}
	planned := len(cfg.Modes)
	for _, skipped := range []string{deploy.skipped, stall.skipped} {
		if skipped == "" {
			planned++
		}
	}
	var verdicts []ModeVerdict
	for _, mode := range cfg.Modes {
		if !cfg.Verbose {
			fmt.Fprintf(out, "  %s mode: %d phases...\n", mode, 1+len(cfg.Ramp))
		}
		leg, err := runMode(ctx, cfg, mode, srv, source, policy, w)
		if err != nil {
			return nil, err
		}
		rec.legs = append(rec.legs, leg)
		verdicts = append(verdicts, leg.verdict)
		if ctx.Err() != nil {
			break
		}
	}
	if deploy.skipped == "" && ctx.Err() == nil {
		if !cfg.Verbose {
			fmt.Fprintf(out, "  %s: %s...\n", deployLegName, deploy.describe())
		}
		leg, err := runRollingDeploy(ctx, cfg, srv, deploy, w)
		if err != nil {
			return nil, err
		}
		rec.legs = append(rec.legs, leg)
		verdicts = append(verdicts, leg.verdict)
	} else if deploy.skipped != "" {
		rec.notes = append(rec.notes, deployLegName+": not run ("+deploy.skipped+")")
		fmt.Fprintf(w.detail, "\n%s: not run (%s)\n", deployLegName, deploy.skipped)
	}
	if stall.skipped == "" && ctx.Err() == nil {
		if !cfg.Verbose {
			fmt.Fprintf(out, "  %s: %s...\n", stallLegName, stall.describe())
		}
		leg, err := runStall(ctx, cfg, srv, stall, policy, w)
		if err != nil {
			return nil, err
		}
		rec.legs = append(rec.legs, leg)
		verdicts = append(verdicts, leg.verdict)
	} else if stall.skipped != "" {
		rec.notes = append(rec.notes, stallLegName+": not run ("+stall.skipped+")")
		fmt.Fprintf(w.detail, "\n%s: not run (%s)\n", stallLegName, stall.skipped)
	}
	rec.verdict = judgeRun(verdicts, planned)
	rec.took = time.Since(rec.started)
	fmt.Fprintf(w.detail, "\nrun time %.1f s\n", rec.took.Seconds())
	for _, m := range verdicts {
		fmt.Fprintln(w.detail, m.Line)
	}
	fmt.Fprintln(w.detail, rec.verdict.Line)
	return rec, nil
}

// runMode runs one mode on keys of its own. The API first runs on the old
// store alone for the warm-up, clients calling: a plain throttler over the
// old store, and for the legacy clients the hand-written limiter (on
// memcached only). Then the rollout is deployed in one step: a
// rollout.Backend in mode from the old store to the new one, whose old
// side, when there are legacy clients, is itself a split rollout at 100 %
// from the legacy counters (backend/legacy, read-only) to the old store,
// which carries each legacy window into the old store at the identifier's
// first decision. The ramp then runs while the clients keep calling. It
// prints a table per phase, the mode's summary and its verdict line.
func runMode(ctx context.Context, cfg Config, mode rollout.Mode, srv *servers, source flagSource,
	policy *throttler.Policy, w outputs) (legRecord, error) {
	out := w.detail
	started := time.Now()
	prefix := newKeyPrefix(started, mode)
	st, err := srv.openStores(ctx, cfg, prefix)
	if err != nil {
		return legRecord{}, err
	}
	defer func() {
		if err := st.Close(); err != nil {
			fmt.Fprintf(out, "migrate-demo: closing the stores: %v\n", err)
		}
	}()
	fmt.Fprintf(out, "\n== %s mode, keys %s* ==\n", mode, prefix)
	for _, line := range st.description {
		fmt.Fprintln(out, "  "+line)
	}

	var secondary, legacyErrs errorSamples
	oldSide := st.old
	var legacy *legacyLimiter
	var carrier *rollout.Backend
	if st.client != nil && cfg.LegacyShare > 0 {
		legacy = newLegacyLimiter(st.client, policy, prefix)
	}
	if legacy != nil {
		reader, err := legacybackend.NewMemcached(st.client, legacy.window, legacybackend.WithKeyFunc(legacy.key))
		if err != nil {
			return legRecord{}, err
		}
		all, err := rollout.NewStaticSource(100, rollout.WithStaticGroupID("throttlekit-legacy"))
		if err != nil {
			return legRecord{}, err
		}
		carrier, err = rollout.New(reader, st.old, all, rollout.WithSecondaryErrorHandler(legacyErrs.add))
		if err != nil {
			return legRecord{}, err
		}
		oldSide = carrier
		fmt.Fprintf(out, "  legacy: a hand-written limiter counts %q in memcached (INCR %s:rl:<id>, %s) until the deploy; "+
			"then backend/legacy reads its counters, through a split rollout at 100%% into the old store\n",
			legacy.member, prefix, "<key>"+legacybackend.ResetSuffix+" in Unix seconds")
	}
	rb, err := rollout.New(oldSide, st.new, source, rollout.WithMode(mode), rollout.WithSeeding(cfg.Seeding),
		rollout.WithSecondaryErrorHandler(secondary.add))
	if err != nil {
		return legRecord{}, err
	}
	var backendErrs errorSamples
	opts := []throttler.Option{ // a real run on the wall clock
		throttler.WithCallTimeout(cfg.CallTimeout),
		throttler.WithLogger(w.logger),
		throttler.WithObserver(throttler.ObserverFunc(func(_ context.Context, e throttler.Event) {
			if e.Err != nil {
				backendErrs.add(e.Err)
			}
		})),
	}
	plain, err := throttler.New(st.old, opts...)
	if err != nil {
		return legRecord{}, err
	}
	th, err := throttler.New(rb, opts...)
	if err != nil {
		return legRecord{}, err
	}
	plainAPI, err := newAPI(plain, policy)
	if err != nil {
		return legRecord{}, err
	}
	rolloutAPI, err := newAPI(th, policy)
	if err != nil {
		return legRecord{}, err
	}
	dep := newDeployment(1, warmUpAPI(plainAPI, legacy, cfg.LegacyShare))
	api, err := startAPI(dep)
	if err != nil {
		return legRecord{}, err
	}
	defer func() {
		if err := api.Close(); err != nil {
			fmt.Fprintf(out, "migrate-demo: stopping the API: %v\n", err)
		}
	}()

	// Clients start one after another over most of the warm-up, so that
	// their windows, which open at each identifier's first request, are out
	// of step: the deploy and every later step fall at every point of a
	// window, and every client holds an open window when the deploy comes.
	warm := cfg.warmUp(policy)
	stagger := warm * 4 / 5
	lg := newLoad(cfg, api.URL(), 1+len(cfg.Ramp), stagger, func(token string) bool {
		return legacy != nil && onLegacy(token, cfg.LegacyShare)
	})
	fmt.Fprintf(out, "  api: %s, policy %q, per SHA-256 of the Authorization token\n", api.URL(), policy.String())
	start := "all start on the old store"
	if n := lg.legacy(); n > 0 {
		start = fmt.Sprintf("%d start on the hand-written limiter, the others on the old store", n)
	}
	fmt.Fprintf(out, "  load: %d clients over loopback HTTP, %d abusive at %g req/s, the others at %g req/s; %s; "+
		"warm-up %s, then the ramp %s (%s)\n", len(lg.clients), lg.abusive(), cfg.AbusiveRate, cfg.NormalRate, start,
		warm.Round(time.Millisecond), describeRamp(cfg, source), source.name())
	fmt.Fprintf(out, "  setup took %.1f s\n", time.Since(started).Seconds())

	// Clients stop at the end of the ramp, or earlier on a signal; each is
	// also bounded in count, with room for jitter.
	total := warm + time.Duration(len(cfg.Ramp))*cfg.PhaseDuration
	stopLoad := lg.start(ctx, cfg, total)
	// Whatever way runMode returns, no client outlives it.
	defer stopLoad()

	names := reportNames{mode: mode, sides: [2]string{"memcached", "redis"}, seeding: cfg.Seeding, legacy: legacy != nil}
	if cfg.Embedded {
		names.sides = [2]string{"memory", "memory (sharded)"}
	}
	count := 1 + len(cfg.Ramp)
	var results []phaseResult
	interrupted := ""
	var before, legacyBefore rollout.Stats
	for i := 0; i < count; i++ {
		warmUp := i == 0
		duration := cfg.PhaseDuration
		percent := source.percent
		// Records move to the new phase before the split changes (or the
		// rollout is deployed), so that nothing counted in the old phase
		// was decided by the new split (see load.collect).
		lg.setPhase(i)
		switch {
		case warmUp:
			duration, percent = warm, func() int { return 0 }
		case source.static != nil:
			if err := source.static.Set(cfg.Ramp[i-1]); err != nil {
				return legRecord{}, err
			}
		}
		if i == 1 {
			if err := deployAtOnce(ctx, dep, func(int) http.Handler { return rolloutAPI }); err != nil {
				return legRecord{}, err
			}
			lg.deployed.Store(true)
		}
		res, ok := runPhase(ctx, cfg, lg, percent, i, count, duration, w.progress)
		lg.setPhase(i + 1)
		res.warmUp = warmUp
		res.totals = lg.collect(i)
		res.p50, res.p99 = lg.latencies(i)
		after := rb.Stats()
		res.stats, before = statsDelta(after, before), after
		if carrier != nil {
			after := carrier.Stats()
			res.legacy, legacyBefore = statsDelta(after, legacyBefore), after
		}
		res.target, res.source = percent(), source.name()
		if !ok {
			// Shown for what it is worth, but judged on nothing: a phase
			// cut short has not had time to show its share or its
			// denials.
			interrupted = "interrupted"
			res.interrupted = true
			writePhase(out, res, names)
			break
		}
		results = append(results, res)
		writePhase(out, res, names)
	}
	stopLoad()

	writeSummary(out, mode, results)
	if st.memcached != nil {
		ms := st.memcached.Stats()
		fmt.Fprintf(out, "  memcached backend: %s round trips · %s CAS conflicts · %s windows lost to eviction · "+
			"%s rollback failures · %s calls out of CAS retries\n", fmtUint(ms.RoundTrips), fmtUint(ms.CASConflicts),
			fmtUint(ms.WindowsLost), fmtUint(ms.RollbackFailures), fmtUint(ms.RetriesExhausted))
	}
	for _, s := range []struct {
		title   string
		samples *errorSamples
	}{{"broken invariants", &lg.evidence}, {"failed requests", &lg.samples}, {"backend errors", &backendErrs},
		{"other store errors", &secondary}, {"legacy counter errors", &legacyErrs}} {
		if list := s.samples.list(); len(list) > 0 {
			fmt.Fprintf(out, "  %s (first examples):\n", s.title)
			for _, msg := range list {
				fmt.Fprintf(out, "    %s\n", msg)
			}
		}
	}
	v := judgeMode(results, cfg, modeRun{mode: mode, clients: len(lg.clients), abusive: lg.abusive(),
		legacy: lg.legacy(), planned: count, interrupted: interrupted})
	outcome := "PASS"
	if !v.Pass {
		outcome = "FAIL (the reasons close the run)"
	}
	fmt.Fprintf(out, "\n%s mode: %s, in %.1f s\n", mode, outcome, time.Since(started).Seconds())
	return legRecord{key: mode.String(), name: mode.String() + " mode", verdict: v, phases: results,
		timeline: lg.timeline.snapshot(), sides: names.sides, evidence: lg.evidence.list()}, nil
}

// runPhase lets the load run for one phase of length d, printing
// progress; percent says the share on the new side in force. It reports
// false when ctx ended first.
func runPhase(ctx context.Context, cfg Config, lg *load, percent func() int, i, count int, d time.Duration,
	out io.Writer) (phaseResult, bool) {
	res := phaseResult{index: i, count: count}
	start := time.Now()
	res.start = start.Sub(lg.timeline.start)
	end := time.NewTimer(d)
	defer end.Stop()
	var tick <-chan time.Time
	if cfg.Progress > 0 {
		ticker := time.NewTicker(cfg.Progress)
		defer ticker.Stop()
		tick = ticker.C
	}
	see := func() {
		if p := percent(); len(res.seen) == 0 || res.seen[len(res.seen)-1] != p {
			res.seen = append(res.seen, p)
		}
	}
	see()
	var lastCount int64
	lastAt := start
	ok := true
loop:
	for {
		select {
		case <-ctx.Done():
			ok = false
			break loop
		case <-end.C:
			break loop
		case now := <-tick:
			see()
			t := lg.collect(i)
			n := t.all().requests + t.errors
			rate := perSecond(n-lastCount, now.Sub(lastAt))
			lastCount, lastAt = n, now
			line := progressLine(i, count, percent(), now.Sub(start), t, rate)
			if cfg.ProgressInPlace {
				fmt.Fprint(out, "\r"+line+"\033[K")
			} else {
				fmt.Fprintln(out, line)
			}
		}
	}
	if cfg.ProgressInPlace && cfg.Progress > 0 {
		fmt.Fprint(out, "\r\033[K")
	}
	see()
	res.duration = time.Since(start)
	return res, ok
}

// openFlagSource returns a static source at the ramp's first percentage,
// or one that follows the Unleash toggle, once the server has answered.
// Both hash identifiers with the toggle's name as group ID, so either puts
// an identifier on the same side at the same percentage.
func openFlagSource(ctx context.Context, cfg Config, out io.Writer) (flagSource, error) {
	if cfg.UnleashURL == "" {
		s, err := rollout.NewStaticSource(cfg.Ramp[0], rollout.WithStaticGroupID(cfg.UnleashFeature))
		if err != nil {
			return flagSource{}, err
		}
		return flagSource{FlagSource: s, static: s}, nil
	}
	apiURL := cfg.UnleashURL
	if !strings.HasSuffix(apiURL, "/") {
		apiURL += "/"
	}
	var lastErr atomic.Pointer[error]
	opts := []unleash.ConfigOption{
		unleash.WithRefreshInterval(time.Second),
	}
	if cfg.UnleashToken != "" {
		opts = append(opts, unleash.WithCustomHeaders(http.Header{"Authorization": {cfg.UnleashToken}}))
	}
	s, err := unleashflag.New(cfg.UnleashFeature,
		unleashflag.WithServer(apiURL, "throttlekit-migrate-demo"),
		unleashflag.WithClientOptions(opts...),
		unleashflag.WithErrorHandler(func(err error) { lastErr.Store(&err) }))
	if err != nil {
		return flagSource{}, fmt.Errorf("unleash: %w", err)
	}
	fmt.Fprintf(out, "  flag: Unleash toggle %q at %s (refreshed every second); waiting for its first answer\n",
		cfg.UnleashFeature, apiURL)
	deadline := time.NewTimer(unleashWait)
	defer deadline.Stop()
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	for s.Split() == nil {
		select {
		case <-ctx.Done():
			_ = s.Close()
			return flagSource{}, ctx.Err()
		case <-deadline.C:
			_ = s.Close()
			err := errors.New("no answer")
			if e := lastErr.Load(); e != nil {
				err = *e
			}
			return flagSource{}, fmt.Errorf("unleash server %s gave no usable answer for toggle %q within %s: %w",
				apiURL, cfg.UnleashFeature, unleashWait, err)
		case <-poll.C:
		}
	}
	fmt.Fprintf(out, "  flag: Unleash says %s\n", s.Split())
	return flagSource{FlagSource: s, unleash: s}, nil
}

// describeRamp shows the planned percentages, or that Unleash decides them.
func describeRamp(cfg Config, source flagSource) string {
	if source.unleash != nil {
		return fmt.Sprintf("%d phases at whatever the toggle says", len(cfg.Ramp))
	}
	parts := make([]string, len(cfg.Ramp))
	for i, p := range cfg.Ramp {
		parts[i] = fmt.Sprintf("%d%%", p)
	}
	return strings.Join(parts, " → ")
}
