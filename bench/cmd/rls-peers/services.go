package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// envoy ratelimit's source: the module and the pseudo-version the
// comparison is pinned to. Its code is never copied into this repository:
// the harness fetches it through the Go module proxy (the module cache when
// it is there) and builds it into the run's temporary directory.
const (
	envoyModule  = "github.com/envoyproxy/ratelimit"
	envoyVersion = "v1.4.1-0.20260122083618-3fb702589d36"
)

const (
	// buildTimeout bounds each go build (envoy ratelimit's first build
	// downloads and compiles about a minute's worth on two cores).
	buildTimeout = 10 * time.Minute
	// readyTimeout bounds how long a service may take to answer its first
	// ShouldRateLimit.
	readyTimeout = 60 * time.Second
	// stopTimeout is how long a service has after SIGTERM before SIGKILL.
	stopTimeout = 5 * time.Second
	// clockTicks is Linux's USER_HZ, the unit of utime and stime in
	// /proc/PID/stat (100 on every architecture Go supports on Linux).
	clockTicks = 100
)

// setting is one environment variable or flag a service runs with, for the
// report.
type setting struct{ name, value, why string }

// service is one rate limit service under test: how to run its binary on
// given loopback ports, against a Redis address, with envoy ratelimit's YAML
// files in a directory. Both services take the same files.
type service struct {
	name string // as the report names it
	bin  string // the built binary; empty when it could not be built
	err  string // why it cannot run, when bin is empty
	// command returns the arguments and the environment of one start.
	command func(p ports, redisAddr string, cfg configDir) (args, env []string)
	// settings lists what the command sets, for the report; ports and
	// paths are shown as placeholders.
	settings []setting
}

// ports are the loopback ports of one start of a service.
type ports struct{ grpc, http, debug int }

// configDir is where a workload's YAML file lives, laid out as envoy
// ratelimit's runtime expects it: root/sub/app/bench.yaml.
type configDir struct{ root, sub, app string }

// dir is the directory holding the YAML files.
func (c configDir) dir() string { return filepath.Join(c.root, c.sub, c.app) }

// writeConfig writes a workload's YAML file under dir and returns its
// layout.
func writeConfig(dir string, w *workload) (configDir, error) {
	c := configDir{root: filepath.Join(dir, "config-"+w.key, "runtime"), sub: "ratelimit", app: "config"}
	if err := os.MkdirAll(c.dir(), 0o755); err != nil {
		return c, err
	}
	return c, os.WriteFile(filepath.Join(c.dir(), "bench.yaml"), []byte(w.yaml), 0o644)
}

// baseEnv is the environment both services start from: nothing of the
// harness's own but what a Go program needs and the Go runtime's knobs, so
// that a variable set in the shell (PORT, say) cannot reach one service
// and not the other.
func baseEnv() []string {
	var env []string
	for _, k := range []string{"PATH", "HOME", "TMPDIR", "GOMAXPROCS", "GOGC", "GOMEMLIMIT", "GODEBUG"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// envoySettings are envoy ratelimit's settings (src/settings/settings.go)
// for a run: its listeners on loopback, one Redis over TCP, the YAML files
// read from the workload's directory without watching a symlinked root, no
// StatsD (there is no server here) and no statistics at all (the logging
// sink that USE_STATSD=false falls back to writes a line per request), logs at
// error level. Everything else keeps its default, as a team running it
// would: named in the report. -envoy-env adds to these, and a later
// setting of the same name wins (os/exec keeps the last of duplicates).
func envoySettings(p ports, redisAddr string, cfg configDir) []setting {
	return []setting{
		{"USE_STATSD", "false", "no StatsD server here"},
		{"DISABLE_STATS", "true", "its README: \"To disable statistics entirely\". With USE_STATSD=false alone, statistics go to gostats' logging sink, which writes a JSON line to stderr for every request's response-time timer (192,000 lines, 37 MB, in one workload of a trial run, about 7% of its CPU): a cost of this harness, not of a deployment. Without statistics envoy ratelimit does less per request than throttlekit-rls, which keeps its Prometheus metrics; -envoy-env DISABLE_STATS=false -envoy-env USE_PROMETHEUS=true measures it with a Prometheus sink instead"},
		{"LOG_LEVEL", "error", "no per-request logging"},
		{"REDIS_SOCKET_TYPE", "tcp", ""},
		{"REDIS_URL", redisAddr, "the one redis-server"},
		{"RUNTIME_ROOT", cfg.root, "the workload's YAML files"},
		{"RUNTIME_SUBDIRECTORY", cfg.sub, ""},
		{"RUNTIME_APPDIRECTORY", cfg.app, ""},
		{"RUNTIME_WATCH_ROOT", "false", "the root is a plain directory, not a symlink swapped on reload"},
		{"HOST", "127.0.0.1", ""},
		{"PORT", strconv.Itoa(p.http), "HTTP (/json, /healthcheck)"},
		{"GRPC_HOST", "127.0.0.1", ""},
		{"GRPC_PORT", strconv.Itoa(p.grpc), "ShouldRateLimit"},
		{"DEBUG_HOST", "127.0.0.1", ""},
		{"DEBUG_PORT", strconv.Itoa(p.debug), "/debug/pprof, /stats"},
	}
}

// envoyDefaults are the defaults of envoy ratelimit's settings that bear on
// the comparison, kept as they are, for the report.
var envoyDefaults = []setting{
	{"REDIS_TYPE", "SINGLE", ""},
	{"REDIS_POOL_SIZE", "10", "connections to Redis; a caller waits for one when all are busy"},
	{"REDIS_PIPELINE_WINDOW", "0", "write buffering; applied to REDIS_TYPE=cluster only (src/redis/driver_impl.go), so without effect here"},
	{"REDIS_TIMEOUT", "10s", ""},
	{"LOCAL_CACHE_SIZE_IN_BYTES", "0", "no local cache of keys over their limit"},
	{"NEAR_LIMIT_RATIO", "0.8", ""},
	{"EXPIRATION_JITTER_MAX_SECONDS", "300", ""},
	{"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "false", "each descriptor of a request is counted on its own"},
	{"USE_PROMETHEUS", "false", ""},
	{"TRACING_ENABLED", "false", ""},
	{"SHADOW_MODE", "false", ""},
	{"LIMIT_RESPONSE_HEADERS_ENABLED", "false", ""},
}

// newEnvoy returns envoy ratelimit as a service, built from bin.
func newEnvoy(bin string, extraEnv []string) *service {
	s := &service{name: "envoy ratelimit", bin: bin}
	s.command = func(p ports, redisAddr string, cfg configDir) ([]string, []string) {
		env := baseEnv()
		for _, st := range envoySettings(p, redisAddr, cfg) {
			env = append(env, st.name+"="+st.value)
		}
		return nil, append(env, extraEnv...)
	}
	s.settings = envoySettings(ports{}, "127.0.0.1:REDIS_PORT", configDir{"TMP/config-W/runtime", "ratelimit", "config"})
	for i, st := range s.settings {
		if strings.HasSuffix(st.name, "PORT") {
			s.settings[i].value = "a free loopback port"
		}
	}
	for _, kv := range extraEnv {
		k, v, _ := strings.Cut(kv, "=")
		s.settings = append(s.settings, setting{k, v, "-envoy-env"})
	}
	return s
}

// newThrottlekit returns throttlekit-rls as a service, built from bin, with
// its defaults and extra arguments.
func newThrottlekit(bin string, extra []string) *service {
	s := &service{name: "throttlekit-rls", bin: bin}
	args := func(p ports, redisAddr string, cfg configDir) []string {
		return append([]string{"-config", cfg.dir(),
			"-grpc", "127.0.0.1:" + strconv.Itoa(p.grpc),
			"-http", "127.0.0.1:" + strconv.Itoa(p.http),
			"-debug", "127.0.0.1:" + strconv.Itoa(p.debug),
			"-store", "redis://" + redisAddr}, extra...)
	}
	s.command = func(p ports, redisAddr string, cfg configDir) ([]string, []string) {
		return args(p, redisAddr, cfg), baseEnv()
	}
	s.settings = []setting{{"command line", strings.Join(args(ports{}, "127.0.0.1:REDIS_PORT",
		configDir{"TMP/config-W/runtime", "ratelimit", "config"}), " "), "port 0 stands for a free loopback port"}}
	return s
}

// buildEnvoy fetches envoy ratelimit's module (go mod download, which reads
// the module cache first and the Go module proxy otherwise), copies its
// go.mod, go.sum and src/ into dir (the module cache is read-only) and
// builds ./src/service_cmd there with -mod=mod. It returns the binary.
func buildEnvoy(ctx context.Context, dir, version string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	dl := exec.CommandContext(ctx, "go", "mod", "download", "-json", envoyModule+"@"+version)
	dl.Dir = dir // outside any module: nothing's go.mod is touched
	var stderr bytes.Buffer
	dl.Stderr = &stderr
	out, err := dl.Output()
	var mod struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &mod); jerr != nil || mod.Dir == "" {
		return "", fmt.Errorf("go mod download %s@%s: %v %s %s", envoyModule, version, err, mod.Error, tail(stderr.String(), 2000))
	}
	src := filepath.Join(dir, "envoy-ratelimit-src")
	for _, name := range []string{"go.mod", "go.sum", "src"} {
		if err := copyTree(filepath.Join(mod.Dir, name), filepath.Join(src, name)); err != nil {
			return "", fmt.Errorf("copying envoy ratelimit's source: %w", err)
		}
	}
	bin := filepath.Join(dir, "ratelimit")
	if err := goBuild(ctx, src, bin, "./src/service_cmd", "-mod=mod"); err != nil {
		return "", fmt.Errorf("building envoy ratelimit: %w", err)
	}
	return bin, nil
}

// buildThrottlekit builds ./cmd/throttlekit-rls in the module at src.
func buildThrottlekit(ctx context.Context, dir, src string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	abs, err := filepath.Abs(src)
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "throttlekit-rls")
	if err := goBuild(ctx, abs, bin, "./cmd/throttlekit-rls", ""); err != nil {
		return "", fmt.Errorf("building throttlekit-rls in %s: %w", abs, err)
	}
	return bin, nil
}

// goBuild runs go build -o bin pkg in dir, adding goflags to GOFLAGS.
func goBuild(ctx context.Context, dir, bin, pkg, goflags string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, pkg)
	cmd.Dir = dir
	cmd.Env = os.Environ()
	if goflags != "" {
		cmd.Env = append(cmd.Env, "GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" "+goflags))
	}
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go build %s: %v:\n%s", pkg, err, head(strings.TrimSpace(string(out)), 3000))
	}
	return nil
}

// copyTree copies a file or a directory tree, leaving everything writable.
func copyTree(from, to string) error {
	return filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(from, path)
		if err != nil {
			return err
		}
		dst := filepath.Join(to, rel)
		if d.IsDir() {
			return os.MkdirAll(dst, 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, 0o644)
	})
}

// running is one started service process with its gRPC connections.
type running struct {
	svc       *service
	cmd       *exec.Cmd
	done      chan struct{} // closed when the process has exited
	grpcAddr  string
	debugAddr string
	logPath   string
	conns     []*grpc.ClientConn
	clients   []rlsv3.RateLimitServiceClient
}

// pid is the service's process id.
func (r *running) pid() int { return r.cmd.Process.Pid }

// exited reports whether the process has exited.
func (r *running) exited() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// start runs s with the workload's configuration against redisAddr, opens
// conns gRPC connections to it and waits until it answers probe. A start
// that fails because a port was taken meanwhile is retried on new ports.
func (s *service) start(ctx context.Context, dir string, cfg configDir, redisAddr string, conns int, probe *rlsv3.RateLimitRequest) (*running, error) {
	var last error
	for attempt := range 3 {
		p, err := freePorts(3)
		if err != nil {
			return nil, err
		}
		args, env := s.command(ports{p[0], p[1], p[2]}, redisAddr, cfg)
		r := &running{svc: s, done: make(chan struct{}),
			grpcAddr:  net.JoinHostPort("127.0.0.1", strconv.Itoa(p[0])),
			debugAddr: net.JoinHostPort("127.0.0.1", strconv.Itoa(p[2])),
			logPath:   filepath.Join(dir, fmt.Sprintf("%s-%s-%d.log", strings.ReplaceAll(s.name, " ", "-"), filepath.Base(filepath.Dir(cfg.root)), attempt))}
		log, err := os.Create(r.logPath)
		if err != nil {
			return nil, err
		}
		r.cmd = exec.Command(s.bin, args...)
		r.cmd.Env = env
		r.cmd.Dir = dir
		r.cmd.Stdout, r.cmd.Stderr = log, log
		setProcAttr(r.cmd)
		err = r.cmd.Start()
		log.Close() // the child has its own copy
		if err != nil {
			return nil, fmt.Errorf("starting %s: %w", s.name, err)
		}
		go func() { _ = r.cmd.Wait(); close(r.done) }()
		if err := r.dial(conns); err != nil {
			r.stop()
			return nil, err
		}
		last = r.waitReady(ctx, probe)
		if last == nil {
			return r, nil
		}
		r.stop()
		if !strings.Contains(strings.ToLower(last.Error()), "address already in use") {
			return nil, last
		}
	}
	return nil, last
}

// dial opens the gRPC connections the callers share.
func (r *running) dial(n int) error {
	for range max(1, n) {
		c, err := grpc.NewClient(r.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return fmt.Errorf("dialing %s at %s: %w", r.svc.name, r.grpcAddr, err)
		}
		r.conns = append(r.conns, c)
		r.clients = append(r.clients, rlsv3.NewRateLimitServiceClient(c))
	}
	return nil
}

// waitReady calls ShouldRateLimit every 50 ms, on every connection, until
// each answers without error, the process exits, or readyTimeout passes.
func (r *running) waitReady(ctx context.Context, probe *rlsv3.RateLimitRequest) error {
	deadline := time.Now().Add(readyTimeout)
	ready := make([]bool, len(r.clients))
	var err error
	for n := 0; n < int(readyTimeout/(50*time.Millisecond))+1; n++ {
		if r.exited() {
			return fmt.Errorf("%s exited during startup%s", r.svc.name, logTail(r.logPath))
		}
		all := true
		for i, c := range r.clients {
			if ready[i] {
				continue
			}
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			_, err = c.ShouldRateLimit(cctx, probe)
			cancel()
			ready[i] = err == nil
			all = all && ready[i]
		}
		if all {
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s did not answer ShouldRateLimit within %v (last error: %v)%s", r.svc.name, readyTimeout, err, logTail(r.logPath))
}

// stop closes the connections and stops the process: SIGTERM, then SIGKILL
// after stopTimeout.
func (r *running) stop() {
	for _, c := range r.conns {
		_ = c.Close()
	}
	r.conns, r.clients = nil, nil
	if r.exited() {
		return
	}
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(stopTimeout):
		_ = r.cmd.Process.Kill()
		<-r.done
	}
}

// freePorts returns n distinct free loopback ports (each found by binding
// port 0 and closing; the service binds it a moment later).
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ps []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ps = append(ps, l.Addr().(*net.TCPAddr).Port)
	}
	return ps, nil
}

// procCPU returns a process's user and system CPU time from
// /proc/PID/stat.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	return parseProcStat(string(b))
}

// parseProcStat reads utime and stime (fields 14 and 15, in clock ticks)
// from the text of /proc/PID/stat. The command name (field 2) is in
// parentheses and may hold spaces, so fields are counted from the last
// closing parenthesis.
func parseProcStat(s string) (time.Duration, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, errors.New("/proc/PID/stat: no command name")
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state), so field k is f[k-3].
	if len(f) < 13 {
		return 0, errors.New("/proc/PID/stat: too few fields")
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, err
	}
	return time.Duration(ut+st) * time.Second / clockTicks, nil
}

// logTail returns the end of a log file, for error messages.
func logTail(path string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	b, _ := io.ReadAll(io.LimitReader(f, 1<<20))
	if len(b) == 0 {
		return ""
	}
	return "\n--- " + filepath.Base(path) + " ---\n" + tail(string(b), 2000)
}

// head returns the first n bytes of s.
func head(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// tail returns the last n bytes of s.
func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}
