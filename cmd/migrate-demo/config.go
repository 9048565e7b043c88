package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler"
)

// Environment variables that name servers and the flag server; the flags of
// the same meaning override them.
const (
	envMemcached      = "MIGRATE_DEMO_MEMCACHED"
	envRedisShards    = "MIGRATE_DEMO_REDIS_SHARDS"
	envUnleashURL     = "MIGRATE_DEMO_UNLEASH_URL"
	envUnleashToken   = "MIGRATE_DEMO_UNLEASH_TOKEN"
	envUnleashFeature = "MIGRATE_DEMO_UNLEASH_FEATURE"
)

// defaultFeature is the Unleash toggle the demo follows, and the group ID
// identifiers are hashed with in every mode, so that a static ramp and the
// toggle put each identifier on the same side at the same percentage.
const defaultFeature = "throttlekit.redis-rollout"

// errUsage reports flags that make no sense; main prints it with the usage.
var errUsage = errors.New("usage")

// Config is everything a run depends on. parseConfig fills it from flags and
// the environment; tests build it with demoConfig and adjust fields.
type Config struct {
	// Embedded runs on in-memory backends instead of servers.
	Embedded bool
	// Short selects the quick profile (see demoConfig).
	Short bool
	// WarmUp is how long the API runs on the old store alone, before the
	// rollout is deployed; 0 means one window of the policy's shortest
	// limit.
	WarmUp time.Duration
	// PhaseDuration is how long each step of the ramp lasts.
	PhaseDuration time.Duration
	// Ramp is the percentage of identifiers on the new backend, per phase.
	// With an Unleash server only its length counts: the server says the
	// percentage.
	Ramp []int
	// Identifiers is the number of API tokens, one client each.
	Identifiers int
	// AbusiveShare is the fraction of clients that send far over the limit.
	AbusiveShare float64
	// LegacyShare is the fraction of clients the hand-written limiter
	// serves during the warm-up (the others are on throttlekit's memcached
	// backend already). It needs memcached: -embedded has no legacy
	// limiter.
	LegacyShare float64
	// Policy is the limit notation, as throttler.ParsePolicy reads it.
	Policy string
	// NormalRate and AbusiveRate are the mean requests per second of one
	// well-behaved and of one abusive client.
	NormalRate, AbusiveRate float64
	// Modes are the rollout modes to run, one after another, each on
	// fresh keys.
	Modes []rollout.Mode
	// Seeding turns split mode's seeding on (rollout.WithSeeding). Off, a
	// moved identifier starts afresh, which the verdict reports.
	Seeding bool
	// MemcachedAddr and RedisShards name running servers; empty means the
	// demo starts its own.
	MemcachedAddr, RedisShards string
	// UnleashURL and UnleashToken name an Unleash server and its client
	// token; UnleashFeature the toggle. Empty URL: a static percentage.
	UnleashURL, UnleashToken, UnleashFeature string
	// Tolerance is how many percentage points the measured share of
	// identifiers on the new backend may stray from the target.
	Tolerance float64
	// CallTimeout bounds each backend call (throttler.WithCallTimeout).
	CallTimeout time.Duration
	// Progress is the interval between progress lines; 0 prints none.
	Progress time.Duration
	// ProgressInPlace rewrites one terminal line instead of printing lines.
	ProgressInPlace bool
	// Verbose prints the full log (every phase's table) as the run goes;
	// without it the screen shows a line per leg and the summary, and the
	// log goes to the report and to a file beside it.
	Verbose bool
	// ReportPath is where the HTML report goes; the full log goes beside
	// it, with the extension .log. Empty: a file named after the run's
	// start in the system's temporary directory.
	ReportPath string
	// Stall runs the stalled Redis group after the modes (see runStall);
	// it needs Redis servers the demo started itself.
	Stall bool
	// RollingDeploy runs the rolling deploy from the hand-written limiter
	// after the modes (see runRollingDeploy); it needs memcached.
	RollingDeploy bool
}

// reportPaths returns where the report and the log of a run started at
// started go.
func (c Config) reportPaths(started time.Time) (report, log string) {
	report = c.ReportPath
	if report == "" {
		report = filepath.Join(os.TempDir(), "throttlekit-migrate-demo-"+started.Format("20060102-150405")+".html")
	}
	return report, strings.TrimSuffix(report, filepath.Ext(report)) + ".log"
}

// demoConfig returns the configuration of the full demo, or of the quick
// one when short is set. The full one runs, in mirror and then in split
// mode, a warm-up of one 10 s window on the old store and six ramp phases
// of 5 s under a 30/10s limit, so that the deploy and every step fall in
// the middle of open windows (about 80 s for both); the quick one keeps
// every proportion (limit per second, clients over their limit) on 2 s
// windows and phases of 1.25 s, for about 20 s in all. The rolling deploy
// adds six windows of its policy and a little more (about 32 s at 5 s, 13 s
// at 2 s), the stalled Redis group three phases (15 s, or 3.75 s): about
// two minutes in all, or 40 s.
func demoConfig(short bool) Config {
	c := Config{
		Short:          short,
		PhaseDuration:  5 * time.Second,
		Ramp:           []int{0, 10, 50, 100, 50, 0},
		Identifiers:    200,
		AbusiveShare:   0.10,
		LegacyShare:    0.5,
		Policy:         "30/10s, 600/h",
		NormalRate:     2,
		AbusiveRate:    12,
		Modes:          []rollout.Mode{rollout.MirrorMode, rollout.SplitMode},
		Seeding:        true,
		UnleashFeature: defaultFeature,
		Tolerance:      5,
		CallTimeout:    500 * time.Millisecond,
		Progress:       time.Second,
		Stall:          true,
		RollingDeploy:  true,
	}
	if short {
		c.PhaseDuration = 1250 * time.Millisecond
		c.Policy = "6/2s, 600/h"
		c.NormalRate = 1.5
		c.AbusiveRate = 8
		c.Progress = 500 * time.Millisecond
	}
	return c
}

// parseConfig reads the command line and the environment (through getenv).
// The flags show the full profile's defaults; with -short, every profile
// flag not given explicitly takes the quick profile's value instead.
func parseConfig(args []string, getenv func(string) string, usageOut io.Writer) (Config, error) {
	fs := flag.NewFlagSet("migrate-demo", flag.ContinueOnError)
	fs.SetOutput(usageOut)
	c := demoConfig(false)
	var ramp, modes string
	fs.BoolVar(&c.Embedded, "embedded", false, "run on in-memory backends, without servers")
	fs.BoolVar(&c.Short, "short", false, `quick run (about 40 s): -duration 1.25s -policy "6/2s, 600/h" -rate 1.5 -abusive-rate 8 -progress 500ms`)
	fs.DurationVar(&c.WarmUp, "warmup", 0, "time on the old store alone before the rollout is deployed (0: one window of the shortest limit)")
	fs.DurationVar(&c.PhaseDuration, "duration", c.PhaseDuration, "length of each ramp phase")
	fs.StringVar(&ramp, "ramp", joinRamp(c.Ramp), "percentages of identifiers on the new backend, one per phase")
	fs.IntVar(&c.Identifiers, "identifiers", c.Identifiers, "number of clients, one API token each")
	fs.Float64Var(&c.AbusiveShare, "abusive", c.AbusiveShare, "fraction of clients that send far over their limit")
	fs.Float64Var(&c.LegacyShare, "legacy", c.LegacyShare,
		"fraction of clients on the hand-written memcached limiter before the deploy (none with -embedded)")
	fs.StringVar(&c.Policy, "policy", c.Policy, "rate-limit policy, in throttler.ParsePolicy's notation")
	fs.Float64Var(&c.NormalRate, "rate", c.NormalRate, "requests per second of a well-behaved client")
	fs.Float64Var(&c.AbusiveRate, "abusive-rate", c.AbusiveRate, "requests per second of an abusive client")
	fs.StringVar(&modes, "mode", joinModes(c.Modes), "rollout modes to run one after another: mirror, split or shadow, comma-separated")
	fs.BoolVar(&c.Seeding, "seeding", c.Seeding, "split mode carries a moved identifier's state over (false: it starts afresh)")
	fs.StringVar(&c.MemcachedAddr, "memcached", getenv(envMemcached),
		"host:port of a running memcached (env "+envMemcached+"); empty starts one")
	fs.StringVar(&c.RedisShards, "redis-shards", getenv(envRedisShards),
		`Redis shards, "a=redis://h:p?replica=redis://h:p,b=..." (env `+envRedisShards+"); empty starts 2 primaries + 2 replicas")
	fs.StringVar(&c.UnleashURL, "unleash-url", getenv(envUnleashURL),
		"Unleash API URL, e.g. https://unleash.example.com/api/ (env "+envUnleashURL+"); empty ramps a static percentage")
	fs.StringVar(&c.UnleashToken, "unleash-token", getenv(envUnleashToken),
		"Unleash client token, sent as Authorization (env "+envUnleashToken+")")
	fs.StringVar(&c.UnleashFeature, "unleash-feature", firstNonEmpty(getenv(envUnleashFeature), c.UnleashFeature),
		"Unleash toggle: a flexibleRollout whose groupId is the toggle's name (env "+envUnleashFeature+")")
	fs.Float64Var(&c.Tolerance, "tolerance", c.Tolerance, "allowed gap, in percentage points, between measured and target share")
	fs.DurationVar(&c.CallTimeout, "call-timeout", c.CallTimeout, "bound of each backend call")
	fs.DurationVar(&c.Progress, "progress", c.Progress, "interval between progress lines, 0 for none")
	fs.BoolVar(&c.Verbose, "v", false, "print the full log (every phase's table) instead of the summary alone")
	fs.StringVar(&c.ReportPath, "report", "", "path of the HTML report, the log beside it as .log (empty: in "+os.TempDir()+")")
	fs.BoolVar(&c.Stall, "stall", c.Stall, "after the modes, stop one Redis group's primary in short bursts while clients call "+
		"(only on servers the demo starts)")
	fs.BoolVar(&c.RollingDeploy, "rolling-deploy", c.RollingDeploy, "after the modes, a rolling deploy from the hand-written "+
		"limiter: old and new processes together behind a round-robin (not with -embedded)")
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("%w: unexpected argument %q", errUsage, fs.Arg(0))
	}
	if c.Short {
		given := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
		quick := demoConfig(true)
		for name, field := range map[string]func(){
			"duration":     func() { c.PhaseDuration = quick.PhaseDuration },
			"policy":       func() { c.Policy = quick.Policy },
			"rate":         func() { c.NormalRate = quick.NormalRate },
			"abusive-rate": func() { c.AbusiveRate = quick.AbusiveRate },
			"progress":     func() { c.Progress = quick.Progress },
		} {
			if !given[name] {
				field()
			}
		}
	}
	c.UnleashFeature = strings.TrimSpace(c.UnleashFeature)
	var err error
	if c.Ramp, err = parseRamp(ramp); err != nil {
		return Config{}, err
	}
	if c.Modes, err = parseModes(modes); err != nil {
		return Config{}, err
	}
	if err := c.validate(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// validate reports settings no run can use. The error wraps errUsage.
func (c Config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", errUsage, fmt.Sprintf(format, args...))
	}
	switch {
	case c.PhaseDuration <= 0:
		return bad("-duration must be positive")
	case c.WarmUp < 0:
		return bad("-warmup must not be negative")
	case len(c.Ramp) == 0:
		return bad("-ramp needs at least one percentage")
	case len(c.Modes) == 0:
		return bad("-mode needs at least one mode")
	case c.Identifiers < 1 || c.Identifiers > 100_000:
		return bad("-identifiers must be 1 to 100000")
	case !(c.AbusiveShare >= 0 && c.AbusiveShare <= 1):
		return bad("-abusive must be a fraction from 0 to 1")
	case !(c.LegacyShare >= 0 && c.LegacyShare <= 1):
		return bad("-legacy must be a fraction from 0 to 1")
	case !(c.NormalRate > 0 && c.NormalRate <= 1000) || !(c.AbusiveRate > 0 && c.AbusiveRate <= 1000):
		return bad("-rate and -abusive-rate must be above 0 and at most 1000")
	case !(c.Tolerance >= 0 && c.Tolerance <= 100):
		return bad("-tolerance must be 0 to 100 points")
	case c.CallTimeout <= 0:
		return bad("-call-timeout must be positive")
	case c.Embedded && (c.MemcachedAddr != "" || c.RedisShards != ""):
		return bad("-embedded runs without servers: drop -memcached and -redis-shards (or unset %s and %s)",
			envMemcached, envRedisShards)
	case c.UnleashURL != "" && c.UnleashFeature == "":
		return bad("-unleash-feature is empty")
	}
	for _, p := range c.Ramp {
		if p < 0 || p > 100 {
			return bad("ramp percentage %d is outside 0..100", p)
		}
	}
	p, err := throttler.ParsePolicy("core", c.Policy)
	if err != nil {
		return bad("-policy: %v", err)
	}
	for _, l := range p.Limits() {
		// The clients' checks read a stable X-RateLimit-Reset within a
		// window; a GCRA or sliding limit's reset moves with every request
		// by design.
		if l.Algorithm == throttler.GCRA || l.Algorithm == throttler.SlidingWindow {
			return bad("-policy: %q is %s; the demo checks fixed windows, whose reset time must not move", l.Name, l.Algorithm)
		}
	}
	return nil
}

// warmUp returns the warm-up's length: cfg.WarmUp, or one window of the
// policy's shortest limit.
func (c Config) warmUp(p *throttler.Policy) time.Duration {
	if c.WarmUp > 0 {
		return c.WarmUp
	}
	return shortestWindow(p)
}

// shortestWindow returns the window of p's shortest limit.
func shortestWindow(p *throttler.Policy) time.Duration {
	var w time.Duration
	for _, l := range p.Limits() {
		if w == 0 || l.Window < w {
			w = l.Window
		}
	}
	return w
}

// parseRamp reads "0,10,50,100".
func parseRamp(s string) ([]int, error) {
	var out []int
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSuffix(strings.TrimSpace(part), "%")
		p, err := strconv.Atoi(part)
		if err != nil || p < 0 || p > 100 {
			return nil, fmt.Errorf("%w: -ramp: %q is not a percentage from 0 to 100", errUsage, part)
		}
		out = append(out, p)
	}
	return out, nil
}

// parseModes reads "mirror,split", or a single mode.
func parseModes(s string) ([]rollout.Mode, error) {
	var out []rollout.Mode
	for _, part := range strings.Split(s, ",") {
		m, err := parseMode(part)
		if err != nil {
			return nil, err
		}
		if slices.Contains(out, m) {
			return nil, fmt.Errorf("%w: -mode %q names %s twice", errUsage, s, m)
		}
		out = append(out, m)
	}
	return out, nil
}

func parseMode(s string) (rollout.Mode, error) {
	for _, m := range []rollout.Mode{rollout.MirrorMode, rollout.SplitMode, rollout.ShadowMode} {
		if strings.EqualFold(strings.TrimSpace(s), m.String()) {
			return m, nil
		}
	}
	return 0, fmt.Errorf("%w: -mode %q: want mirror, split or shadow", errUsage, s)
}

// joinModes writes modes as -mode reads them.
func joinModes(modes []rollout.Mode) string {
	parts := make([]string, len(modes))
	for i, m := range modes {
		parts[i] = m.String()
	}
	return strings.Join(parts, ",")
}

// joinRamp writes a ramp as -ramp reads it.
func joinRamp(ramp []int) string {
	parts := make([]string, len(ramp))
	for i, p := range ramp {
		parts[i] = strconv.Itoa(p)
	}
	return strings.Join(parts, ",")
}

func firstNonEmpty(values ...string) string {
	for _, v := range values {
		if v != "" {
			return v
		}
	}
	return ""
}
