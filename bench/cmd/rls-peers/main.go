// Command rls-peers measures throttlekit's rate limit service,
// throttlekit-rls, against envoy ratelimit, side by side on one Redis, and
// writes RLS.md: the goals of the comparison with their figures, a table of
// every cell (one service on one workload, the median of its runs), each
// run's rate, what each service answers while Redis is down, and the top of
// a CPU profile of each service.
//
// Both services are built at run time into a temporary directory: envoy
// ratelimit from its module (fetched with go mod download, through the Go
// module proxy unless it is in the module cache; none of its code is kept
// here), throttlekit-rls from ../middleware/rls. When throttlekit-rls does
// not build yet, envoy ratelimit is measured alone and the report says why.
// One redis-server (the project's internal/localserver, as bench does) on a
// loopback port serves both; both read the same envoy ratelimit YAML file.
//
// Each workload starts both services, warms each up, then measures them in
// turn, envoy ratelimit first (A B A B A B), so that the ratio of their
// medians compares runs of the same minutes. A run flushes Redis, warms the
// service up again for a second and measures for -duration: 64 callers
// (-callers) over two gRPC connections (-conns), each calling
// ShouldRateLimit back to back with requests drawn at random from 10,000
// client values (-values). Per descriptor decision it reports Redis CPU
// (INFO cpu: used_cpu_sys + used_cpu_user), the service process's CPU
// (/proc/PID/stat utime + stime) and the load generator's (this process,
// getrusage), beside decisions/s, requests/s and p50 and p99 latency.
//
// Run it with make bench-rls, or
//
//	cd bench && go run ./cmd/rls-peers [-quick] [-duration 8s] [-runs 3] [-o RLS.md]
//
// BENCH_QUICK=1 in the environment is -quick (a smoke run of about 30 s
// once both services are built).
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/internal/localserver"
)

// config is how the harness runs.
type config struct {
	duration    time.Duration // each measured run
	runs        int           // measured runs per service and workload
	warmUp      time.Duration // each service's first warm-up on a workload
	runWarmUp   time.Duration // the warm-up before each measured run, after the flush
	callers     int
	conns       int
	values      int
	down        time.Duration // the Redis-down measurement
	callTimeout time.Duration // each call's deadline in the Redis-down test
	profile     time.Duration // CPU profile length; 0: none
	maxOthers   float64       // cores other processes may use during a run before it is run again
	retries     int           // runs made again, at most, per run
	quietWait   time.Duration // the longest wait for a quiet machine before a run
	quick       bool
}

func defaultConfig() config {
	return config{duration: 8 * time.Second, runs: 3, warmUp: 3 * time.Second, runWarmUp: time.Second,
		callers: 64, conns: 2, values: 10_000, down: 3 * time.Second, callTimeout: 2 * time.Second,
		profile: 5 * time.Second, maxOthers: 0.25 * float64(runtime.NumCPU()), retries: 3, quietWait: 30 * time.Second}
}

func main() {
	cfg := defaultConfig()
	flag.DurationVar(&cfg.duration, "duration", cfg.duration, "how long each measured run lasts")
	flag.IntVar(&cfg.runs, "runs", cfg.runs, "measured runs per service and workload; the median run is reported")
	flag.DurationVar(&cfg.warmUp, "warmup", cfg.warmUp, "each service's first warm-up on a workload")
	flag.IntVar(&cfg.callers, "callers", cfg.callers, "concurrent gRPC callers")
	flag.IntVar(&cfg.conns, "conns", cfg.conns, "gRPC connections the callers share (as many as an Envoy with that many workers opens)")
	flag.IntVar(&cfg.values, "values", cfg.values, "client descriptor values the requests are drawn from")
	flag.DurationVar(&cfg.down, "down", cfg.down, "how long the Redis-down test records answers")
	flag.DurationVar(&cfg.callTimeout, "call-timeout", cfg.callTimeout, "each call's deadline in the Redis-down test")
	flag.DurationVar(&cfg.profile, "profile", cfg.profile, "length of each service's CPU profile (0: none)")
	flag.Float64Var(&cfg.maxOthers, "max-others", cfg.maxOthers, "cores other processes on the machine may use during a run before it is run again (default: a quarter of the CPUs)")
	flag.IntVar(&cfg.retries, "retries", cfg.retries, "times a run is made again, at most, when other processes used more than -max-others")
	flag.DurationVar(&cfg.quietWait, "quiet-wait", cfg.quietWait, "the longest wait, before each run, for other processes to use at most -max-others")
	quick := flag.Bool("quick", os.Getenv("BENCH_QUICK") != "", "a smoke run of about 30 s: one run of 2 s per cell (also BENCH_QUICK=1)")
	out := flag.String("o", "", "write the report to this file, keeping what follows its hand-written marker, instead of standard output")
	version := flag.String("envoy-version", envoyVersion, "the version of "+envoyModule+" to build")
	var envoyEnv multiFlag
	flag.Var(&envoyEnv, "envoy-env", "an extra KEY=VALUE setting for envoy ratelimit (repeatable; named in the report)")
	tkSrc := flag.String("throttlekit-src", "../middleware/rls", "the module holding ./cmd/throttlekit-rls (empty: envoy ratelimit alone)")
	tkBin := flag.String("throttlekit-bin", "", "a throttlekit-rls binary to run instead of building one")
	tkArgs := flag.String("throttlekit-args", "", "extra arguments for throttlekit-rls, separated by spaces (named in the report)")
	keep := flag.Bool("keep", false, "keep the temporary directory (binaries, configuration, logs, profiles) and print its path")
	flag.Parse()
	if *quick {
		cfg.quick = true
		cfg.duration, cfg.runs, cfg.warmUp, cfg.runWarmUp, cfg.down, cfg.profile = 2*time.Second, 1, time.Second, 300*time.Millisecond, time.Second, 2*time.Second
		cfg.retries, cfg.quietWait = 1, 5*time.Second
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	rep, err := run(ctx, cfg, *version, envoyEnv, *tkSrc, *tkBin, strings.Fields(*tkArgs), *keep)
	if err != nil {
		log.Print(err)
		os.Exit(1)
	}
	rep.took = time.Since(start)
	if *out == "" {
		rep.write(os.Stdout, defaultTail)
		return
	}
	if err := writeFile(*out, rep); err != nil {
		log.Print(err)
		os.Exit(1)
	}
	fmt.Fprintln(os.Stderr, "wrote", *out)
}

// multiFlag is a repeatable string flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, " ") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

// harness holds what the runs share.
type harness struct {
	cfg   config
	dir   string
	redis *redisServer
}

// run builds and starts everything, measures, and returns the report.
func run(ctx context.Context, cfg config, version string, envoyEnv []string, tkSrc, tkBin string, tkArgs []string, keep bool) (*report, error) {
	dir, err := os.MkdirTemp("", "rls-peers-")
	if err != nil {
		return nil, err
	}
	if keep {
		fmt.Fprintln(os.Stderr, "keeping", dir)
	} else {
		defer os.RemoveAll(dir)
	}
	rs, err := startRedis()
	if err != nil {
		return nil, err
	}
	defer rs.close()
	h := &harness{cfg: cfg, dir: dir, redis: rs}
	rep := &report{cfg: cfg, commit: gitCommit(), redisVersion: rs.version, envoyVersion: version}

	logf("building envoy ratelimit %s", version)
	envoy := newEnvoy("", envoyEnv)
	if envoy.bin, err = buildEnvoy(ctx, dir, version); err != nil {
		return nil, err
	}
	tk := newThrottlekit(tkBin, tkArgs)
	switch {
	case tkBin != "":
	case tkSrc == "":
		tk.err = "not run (-throttlekit-src is empty)"
	default:
		logf("building throttlekit-rls in %s", tkSrc)
		if tk.bin, err = buildThrottlekit(ctx, dir, tkSrc); err != nil {
			tk.err = err.Error()
			logf("throttlekit-rls is left out: %v", err)
		}
	}
	rep.services = []*service{envoy, tk}
	ready := []*service{envoy}
	if tk.bin != "" {
		ready = append(ready, tk)
	}

	for wi, w := range workloads(cfg.values) {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		cd, err := writeConfig(dir, w)
		if err != nil {
			return nil, err
		}
		rep.workloads = append(rep.workloads, w)
		var procs []*running
		for _, s := range ready {
			r, err := s.start(ctx, dir, cd, rs.addr, cfg.conns, w.reqs[0])
			if err != nil {
				rep.results = append(rep.results, runResult{svc: s.name, workload: w.name, err: err.Error()})
				logf("%s: %v", s.name, err)
				continue
			}
			defer r.stop()
			procs = append(procs, r)
		}
		for _, r := range procs {
			logf("%s, %s: warm-up %v", w.name, r.svc.name, cfg.warmUp)
			l := startLoad(ctx, r.clients, w.reqs, cfg.callers, 0)
			sleep(ctx, cfg.warmUp)
			l.stop()
		}
		for i := range cfg.runs {
			for _, r := range procs {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				res := measureQuiet(ctx, h, r, w)
				rep.results = append(rep.results, res)
				logf("%s, %s, run %d: %s", w.name, r.svc.name, i+1, res.line())
			}
		}
		if wi == 0 {
			if cfg.profile > 0 {
				for _, r := range procs {
					waitQuiet(ctx, cfg.maxOthers, cfg.quietWait)
					p := captureProfile(ctx, h, r, w, cfg.profile)
					rep.profiles = append(rep.profiles, p)
					logf("%s: CPU profile of %v, %s", r.svc.name, cfg.profile, p.errOr("ok"))
				}
			}
			for _, r := range procs {
				waitQuiet(ctx, cfg.maxOthers, cfg.quietWait)
				d := redisDown(ctx, h, r, w, cfg.down, cfg.callTimeout)
				rep.down = append(rep.down, d)
				logf("%s, Redis down: %s", r.svc.name, d.line())
			}
		}
		for _, r := range procs {
			r.stop()
		}
	}
	return rep, nil
}

// logf prints progress to standard error.
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// redisServer is the one redis-server both services use, with a client for
// the harness's own commands (FLUSHALL, INFO, CONFIG RESETSTAT).
type redisServer struct {
	srv     *localserver.Redis
	addr    string
	admin   *redis.Client
	version string
}

// startRedis starts redis-server on a loopback port, as bench does.
func startRedis() (*redisServer, error) {
	srv, err := localserver.StartRedis(localserver.RedisOptions{Args: []string{"--maxmemory-policy", "noeviction"}})
	if err != nil {
		return nil, fmt.Errorf("starting redis-server: %w", err)
	}
	rs := &redisServer{srv: srv, addr: srv.Addr(), admin: redis.NewClient(&redis.Options{Addr: srv.Addr(), MaxRetries: -1})}
	rs.version = redisVersion()
	return rs, nil
}

func (r *redisServer) close() {
	_ = r.admin.Close()
	if err := r.srv.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping redis-server:", err)
	}
}

// flush empties the server (FLUSHALL SYNC).
func (r *redisServer) flush(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := r.admin.Do(ctx, "FLUSHALL", "SYNC").Err(); err != nil {
		return fmt.Errorf("flushing Redis: %w", err)
	}
	return nil
}

// resetStats resets the command statistics (CONFIG RESETSTAT).
func (r *redisServer) resetStats(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_ = r.admin.ConfigResetStat(ctx).Err()
}

// kill kills the server with SIGKILL, as a crash would.
func (r *redisServer) kill() { r.srv.Kill() }

// start restarts a killed server on the same port (a no-op when it runs).
func (r *redisServer) start() error { return r.srv.Start() }

// info reads the server's CPU time and the calls and time of each command
// but the harness's own (see parseInfo).
func (r *redisServer) info(ctx context.Context) (time.Duration, map[string]cmdStat, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	s, err := r.admin.Info(ctx, "cpu", "commandstats").Result()
	if err != nil {
		return 0, nil, fmt.Errorf("INFO: %w", err)
	}
	cpu, cmds := parseInfo(s)
	return cpu, cmds, nil
}

// waitCommands polls INFO commandstats every 10 ms until a command other
// than the harness's own has been counted since the statistics were last
// reset (or the server started), and returns how long that took.
func (r *redisServer) waitCommands(ctx context.Context, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	for n := 0; n < int(timeout/(10*time.Millisecond))+1 && ctx.Err() == nil; n++ {
		if _, cmds, err := r.info(ctx); err == nil && len(cmds) > 0 {
			return time.Since(start), nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start), fmt.Errorf("no command from the service reached Redis within %v", timeout)
}

// machineBusy returns the time the machine's CPUs have been busy, by every
// process (user, nice, system, irq, softirq and steal in /proc/stat), or 0.
func machineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var ticks int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		n, _ := strconv.ParseInt(f[i], 10, 64)
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks
}

// counters are what a run is measured by, read before and after it.
type counters struct {
	at      time.Time
	svc     time.Duration // the service process, user and system
	redis   time.Duration // redis-server, used_cpu_sys + used_cpu_user
	self    time.Duration // this process (the load generator), user and system
	machine time.Duration // every CPU's busy time, all processes (/proc/stat)
	cmds    map[string]cmdStat
}

// snapshot reads the counters of r, Redis and this process.
func (h *harness) snapshot(ctx context.Context, r *running) (counters, error) {
	c := counters{at: time.Now()}
	var err error
	if c.svc, err = procCPU(r.pid()); err != nil {
		return c, fmt.Errorf("%s's CPU: %w", r.svc.name, err)
	}
	if c.redis, c.cmds, err = h.redis.info(ctx); err != nil {
		return c, err
	}
	c.machine = machineBusy()
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return c, err
	}
	c.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	return c, nil
}
