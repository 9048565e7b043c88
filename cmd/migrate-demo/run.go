package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit/rollout/unleashflag"

	"github.com/Unleash/unleash-client-go/v4"
	"github.com/throttlekit/throttlekit/rollout"
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

// run is the whole demo: it opens the stores, serves the API, ramps the
// rollout through cfg.Ramp while the load generator runs, prints a table
// per phase and the verdict to out, and stops everything it started. An
// error means the demo could not run at all (missing servers, bad
// configuration); a run that went wrong is a failing Verdict.
func run(ctx context.Context, cfg Config, out io.Writer) (Verdict, error) {
	if err := cfg.validate(); err != nil {
		return Verdict{}, err
	}
	policy, err := throttler.ParsePolicy(resourceName, cfg.Policy)
	if err != nil {
		return Verdict{}, err
	}
	started := time.Now()
	st, err := openStores(ctx, cfg, newKeyPrefix(started))
	if err != nil {
		return Verdict{}, err
	}
	defer func() {
		if err := st.Close(); err != nil {
			fmt.Fprintf(out, "migrate-demo: stopping the stores: %v\n", err)
		}
	}()
	journey := "memcached to sharded Redis"
	if cfg.Embedded {
		journey = "memory to sharded memory (-embedded)"
	}
	fmt.Fprintf(out, "migrate-demo: moving rate-limit state from %s, %s mode, %d phases of %s\n",
		journey, cfg.Mode, len(cfg.Ramp), cfg.PhaseDuration)
	for _, line := range st.description {
		fmt.Fprintln(out, "  "+line)
	}

	source, err := openFlagSource(ctx, cfg, out)
	if err != nil {
		return Verdict{}, err
	}
	if source.unleash != nil {
		defer source.unleash.Close()
	}

	var secondary errorSamples
	rb, err := rollout.New(st.old, st.new, source, rollout.WithMode(cfg.Mode),
		rollout.WithSecondaryErrorHandler(secondary.add))
	if err != nil {
		return Verdict{}, err
	}
	var backendErrs errorSamples
	th, err := throttler.New(rb, // a real run on the wall clock
		throttler.WithCallTimeout(cfg.CallTimeout),
		throttler.WithObserver(throttler.ObserverFunc(func(_ context.Context, e throttler.Event) {
			if e.Err != nil {
				backendErrs.add(e.Err)
			}
		})))
	if err != nil {
		return Verdict{}, err
	}
	handler, err := newAPI(th, policy)
	if err != nil {
		return Verdict{}, err
	}
	api, err := startAPI(handler)
	if err != nil {
		return Verdict{}, err
	}
	defer func() {
		if err := api.Close(); err != nil {
			fmt.Fprintf(out, "migrate-demo: stopping the API: %v\n", err)
		}
	}()

	// Start the clients over the shortest window (within the first phase),
	// so that their windows are out of step and phase boundaries, where
	// identifiers move, fall at every point of a window.
	stagger := min(policy.Limits()[0].Window, cfg.PhaseDuration/2)
	for _, l := range policy.Limits() {
		stagger = min(stagger, l.Window)
	}
	lg := newLoad(cfg, api.URL(), len(cfg.Ramp), stagger)
	fmt.Fprintf(out, "  api: %s, policy %q, per SHA-256 of the Authorization token\n", api.URL(), policy.String())
	fmt.Fprintf(out, "  load: %d clients over loopback HTTP, %d abusive at %g req/s, the others at %g req/s; ramp %s (%s)\n",
		len(lg.clients), lg.abusive(), cfg.AbusiveRate, cfg.NormalRate, describeRamp(cfg, source), source.name())
	fmt.Fprintf(out, "  setup took %.1f s\n", time.Since(started).Seconds())

	// Clients stop at the end of the ramp, or earlier on a signal; each is
	// also bounded in count, with room for jitter.
	total := time.Duration(len(cfg.Ramp)) * cfg.PhaseDuration
	maxRequests := int(total.Seconds()*max(cfg.NormalRate, cfg.AbusiveRate)*2) + 10
	loadCtx, stopLoad := context.WithTimeout(ctx, total+5*time.Second)
	var loadDone sync.WaitGroup
	loadDone.Add(1)
	go func() {
		defer loadDone.Done()
		lg.run(loadCtx, maxRequests)
	}()
	// Whatever way run returns, no client outlives it.
	defer func() {
		stopLoad()
		loadDone.Wait()
	}()

	names := reportNames{mode: cfg.Mode, sides: [2]string{"memcached", "redis"}}
	if cfg.Embedded {
		names.sides = [2]string{"memory", "memory (sharded)"}
	}
	var results []phaseResult
	interrupted := ""
	before := rb.Stats()
	for i, percent := range cfg.Ramp {
		// Records move to the new phase before the split changes, so
		// that nothing counted in the old phase was decided by the new
		// split (see load.collect).
		lg.setPhase(i)
		if source.static != nil {
			if err := source.static.Set(percent); err != nil {
				return Verdict{}, err
			}
		}
		res, ok := runPhase(ctx, cfg, lg, source, i, out)
		lg.setPhase(i + 1)
		res.totals = lg.collect(i)
		after := rb.Stats()
		res.stats, before = statsDelta(after, before), after
		res.target, res.source = source.percent(), source.name()
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
	loadDone.Wait()

	writeSummary(out, results)
	if st.legacy != nil {
		ms := st.legacy.Stats()
		fmt.Fprintf(out, "  memcached backend: %s round trips · %s CAS conflicts · %s windows lost to eviction · "+
			"%s rollback failures · %s calls out of CAS retries\n", fmtUint(ms.RoundTrips), fmtUint(ms.CASConflicts),
			fmtUint(ms.WindowsLost), fmtUint(ms.RollbackFailures), fmtUint(ms.RetriesExhausted))
	}
	for _, s := range []struct {
		title   string
		samples *errorSamples
	}{{"broken invariants", &lg.evidence}, {"failed requests", &lg.samples}, {"backend errors", &backendErrs},
		{"secondary store errors", &secondary}} {
		if list := s.samples.list(); len(list) > 0 {
			fmt.Fprintf(out, "  %s (first examples):\n", s.title)
			for _, msg := range list {
				fmt.Fprintf(out, "    %s\n", msg)
			}
		}
	}
	v := judgeRun(results, cfg, len(lg.clients), lg.abusive(), len(cfg.Ramp), interrupted)
	fmt.Fprintf(out, "\nrun time %.1f s\n%s\n", time.Since(started).Seconds(), v.Line)
	return v, nil
}

// runPhase lets the load run for one phase, printing progress. It reports
// false when ctx ended first.
func runPhase(ctx context.Context, cfg Config, lg *load, source flagSource, i int, out io.Writer) (phaseResult, bool) {
	res := phaseResult{index: i, count: len(cfg.Ramp)}
	start := time.Now()
	end := time.NewTimer(cfg.PhaseDuration)
	defer end.Stop()
	var tick <-chan time.Time
	if cfg.Progress > 0 {
		ticker := time.NewTicker(cfg.Progress)
		defer ticker.Stop()
		tick = ticker.C
	}
	see := func() {
		if p := source.percent(); len(res.seen) == 0 || res.seen[len(res.seen)-1] != p {
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
			line := progressLine(i, len(cfg.Ramp), source.percent(), now.Sub(start), t, rate)
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
