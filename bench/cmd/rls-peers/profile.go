package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/pprof/profile"
)

// profileResult is the summary of one service's CPU profile, taken under
// the first workload's load.
type profileResult struct {
	svc   string
	err   string
	total time.Duration // CPU time sampled
	wall  time.Duration
	// areas are the shares of CPU by the code that spent it (see area).
	areas map[string]float64
	// top are the functions with the most CPU of their own (flat), the
	// runtime's and the standard library's charged to the nearest
	// function outside them.
	top []funcShare
	// notable are the shares of samples whose stack holds each of
	// notables.
	notable map[string]float64
	// growers are the functions whose calls grow goroutine stacks, with
	// the share of CPU spent growing them.
	growers []funcShare
	// cores each process used during the profile.
	svcCores, redisCores, loadCores float64
}

// funcShare is one function's share of the profile: its own (flat) and with
// what it calls (cum).
type funcShare struct {
	name      string
	flat, cum float64
}

func (p profileResult) errOr(ok string) string {
	if p.err != "" {
		return p.err
	}
	return ok
}

// captureProfile loads r with w and meanwhile fetches length of CPU profile
// from its debug listener (/debug/pprof/profile), keeping the profile in
// the run's directory.
func captureProfile(ctx context.Context, h *harness, r *running, w *workload, length time.Duration) profileResult {
	res := profileResult{svc: r.svc.name}
	if err := h.redis.flush(ctx); err != nil {
		res.err = err.Error()
		return res
	}
	l := startLoad(ctx, r.clients, w.reqs, h.cfg.callers, 0)
	defer l.stop()
	sleep(ctx, h.cfg.runWarmUp)
	before, err := h.snapshot(ctx, r)
	if err != nil {
		res.err = err.Error()
		return res
	}
	secs := max(1, int(length.Round(time.Second)/time.Second))
	url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", r.debugAddr, secs)
	hctx, cancel := context.WithTimeout(ctx, length+30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(hctx, http.MethodGet, url, nil)
	if err != nil {
		res.err = err.Error()
		return res
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		res.err = err.Error()
		return res
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil || resp.StatusCode != http.StatusOK {
		res.err = fmt.Sprintf("GET %s: %s %v %s", url, resp.Status, err, tail(string(body), 300))
		return res
	}
	if after, err := h.snapshot(ctx, r); err == nil {
		wall := after.at.Sub(before.at).Seconds()
		res.svcCores = (after.svc - before.svc).Seconds() / wall
		res.redisCores = (after.redis - before.redis).Seconds() / wall
		res.loadCores = (after.self - before.self).Seconds() / wall
	}
	_ = os.WriteFile(filepath.Join(h.dir, strings.ReplaceAll(r.svc.name, " ", "-")+".pprof"), body, 0o644)
	p, err := profile.ParseData(body)
	if err != nil {
		res.err = "parsing the profile: " + err.Error()
		return res
	}
	summarise(p, &res)
	return res
}

// summarise fills res from a CPU profile.
func summarise(p *profile.Profile, res *profileResult) {
	idx := len(p.SampleType) - 1
	for i, st := range p.SampleType {
		if st.Type == "cpu" {
			idx = i
		}
	}
	if idx < 0 {
		res.err = "the profile has no samples"
		return
	}
	res.wall = time.Duration(p.DurationNanos)
	flat, cum := map[string]int64{}, map[string]int64{}
	areas := map[string]int64{}
	notable, growers := map[string]int64{}, map[string]int64{}
	var total int64
	for _, s := range p.Sample {
		v := s.Value[idx]
		total += v
		frames := stack(s)
		flat[libraryLeaf(frames, res.svc)] += v
		seen := map[string]bool{}
		for _, f := range frames {
			if !seen[f] {
				seen[f] = true
				cum[f] += v
			}
		}
		areas[area(frames, res.svc)] += v
		for _, n := range notables {
			if n.match(frames) {
				notable[n.label] += v
			}
		}
		if g := grower(frames); g != "" {
			growers[g] += v
		}
	}
	res.total = time.Duration(total)
	if total == 0 {
		res.err = "the profile has no samples"
		return
	}
	res.areas = map[string]float64{}
	for a, v := range areas {
		res.areas[a] = float64(v) / float64(total)
	}
	for f, v := range flat {
		c := cum[f]
		if strings.HasPrefix(f, "(") {
			c = v // an area, not a function: nothing below it
		}
		res.top = append(res.top, funcShare{f, float64(v) / float64(total), float64(c) / float64(total)})
	}
	slices.SortFunc(res.top, func(a, b funcShare) int { return cmp.Compare(b.flat, a.flat) })
	res.top = res.top[:min(len(res.top), 12)]
	res.notable = map[string]float64{}
	for k, v := range notable {
		res.notable[k] = float64(v) / float64(total)
	}
	for f, v := range growers {
		res.growers = append(res.growers, funcShare{name: f, cum: float64(v) / float64(total)})
	}
	slices.SortFunc(res.growers, func(a, b funcShare) int { return cmp.Compare(b.cum, a.cum) })
	res.growers = res.growers[:min(len(res.growers), 3)]
}

// notable is a kind of stack the report gives the share of.
type notable struct {
	label, what string
	match       func(frames []string) bool
}

const notableGrowth = "`runtime.newstack`"

// notables are the kinds of stack the report gives the share of, across
// areas.
var notables = []notable{
	{"the service's `ShouldRateLimit`", "the handler: deciding, the store and its client, metrics", func(fs []string) bool { return hasFunc(fs, isHandler) }},
	{"gRPC, HTTP/2 or protobuf frames, outside the handler", "the gRPC server's own cost: reading and writing frames, decoding requests, encoding responses, stream goroutines", func(fs []string) bool {
		return !hasFunc(fs, isHandler) && hasFunc(fs, func(f string) bool {
			a := area([]string{f}, "")
			return a == areaGRPC || a == areaProto
		})
	}},
	{"`runtime.mallocgc`", "allocation, GC assists included", func(fs []string) bool { return hasFunc(fs, eq("runtime.mallocgc")) }},
	{"`runtime.gcBgMarkWorker`", "GC background marking", func(fs []string) bool { return hasFunc(fs, eq("runtime.gcBgMarkWorker")) }},
	{notableGrowth, "goroutine stack growth (copying a stack to one twice its size)", func(fs []string) bool { return hasFunc(fs, eq("runtime.newstack")) }},
	{"a system call", "`internal/runtime/syscall/linux.Syscall6` and the like: reads, writes, futexes, epoll", func(fs []string) bool {
		return len(fs) > 0 && strings.HasPrefix(fs[0], "internal/runtime/syscall") || len(fs) > 0 && strings.HasPrefix(fs[0], "syscall.")
	}},
}

func eq(name string) func(string) bool { return func(f string) bool { return f == name } }

func hasFunc(frames []string, match func(string) bool) bool {
	return slices.ContainsFunc(frames, match)
}

// isHandler reports whether a frame is a service's own ShouldRateLimit
// method (not the generated gRPC handler that calls it).
func isHandler(f string) bool {
	return strings.HasSuffix(f, ").ShouldRateLimit") && !strings.HasPrefix(f, "github.com/envoyproxy/go-control-plane") && !strings.HasPrefix(f, "google.golang.org/grpc")
}

// grower returns, for a sample of runtime.newstack, the function whose
// prologue found the stack too small (the first frame above it outside the
// runtime) and its caller, or "".
func grower(frames []string) string {
	i := slices.Index(frames, "runtime.newstack")
	if i < 0 {
		return ""
	}
	for j, f := range frames[i+1:] {
		if strings.HasPrefix(f, "runtime.") {
			continue
		}
		if k := i + 1 + j + 1; k < len(frames) {
			return "`" + f + "` called from `" + frames[k] + "`"
		}
		return "`" + f + "`"
	}
	return ""
}

// libraryLeaf returns the function nearest a sample's leaf outside the
// runtime and the standard library, or, for a sample with none, its area.
func libraryLeaf(frames []string, svc string) string {
	for _, f := range frames {
		if !isStd(funcPackage(f)) {
			return f
		}
	}
	return "(" + area(frames, svc) + ")"
}

// stack returns a sample's function names, the leaf first (inlined frames
// included, innermost first, as pprof lists them).
func stack(s *profile.Sample) []string {
	var fs []string
	for _, loc := range s.Location {
		for _, ln := range loc.Line {
			if ln.Function != nil {
				fs = append(fs, ln.Function.Name)
			}
		}
	}
	return fs
}

// Areas of code a sample's CPU is charged to.
const (
	areaGRPC     = "gRPC server and HTTP/2 transport"
	areaProto    = "protobuf and the generated API code"
	areaRedis    = "Redis client"
	areaMetrics  = "metrics and statistics"
	areaTracing  = "tracing (OpenTelemetry)"
	areaLogging  = "logging"
	areaTK       = "throttlekit (service and limiter)"
	areaEnvoy    = "envoy ratelimit (service and limiter)"
	areaGC       = "GC, background"
	areaRuntime  = "runtime: scheduler, netpoll, timers (no library frame)"
	areaStdHTTP  = "net/http (debug listener)"
	areaOtherLib = "other libraries"
)

// areaPrefixes map package path prefixes to areas, first match wins.
var areaPrefixes = []struct{ prefix, area string }{
	{"go.opentelemetry.io/", areaTracing},
	{"google.golang.org/grpc", areaGRPC},
	{"golang.org/x/net/", areaGRPC},
	{"github.com/grpc-ecosystem/", areaGRPC},
	{"google.golang.org/protobuf", areaProto},
	{"google.golang.org/genproto", areaProto},
	{"github.com/envoyproxy/go-control-plane", areaProto},
	{"github.com/envoyproxy/protoc-gen-validate", areaProto},
	{"github.com/cncf/xds", areaProto},
	{"github.com/planetscale/vtprotobuf", areaProto},
	{"github.com/redis/go-redis", areaRedis},
	{"github.com/mediocregopher/radix", areaRedis},
	{"github.com/prometheus/", areaMetrics},
	{"github.com/lyft/gostats", areaMetrics},
	{"github.com/sirupsen/logrus", areaLogging},
	{"github.com/throttlekit/throttlekit", areaTK},
	{"github.com/envoyproxy/ratelimit", areaEnvoy},
}

// area charges a sample to the library closest to its leaf: walking from
// the leaf, standard library and runtime frames are skipped (a write(2) or
// an allocation is charged to the library that made it), and the first
// frame of a library names the area. A sample with no library frame is GC
// background work, the debug HTTP server, or the runtime itself. Frames of
// package main belong to the service.
func area(frames []string, svc string) string {
	for _, f := range frames {
		pkg := funcPackage(f)
		if pkg == "main" {
			if strings.Contains(svc, "envoy") {
				return areaEnvoy
			}
			return areaTK
		}
		if isStd(pkg) {
			continue
		}
		for _, ap := range areaPrefixes {
			if strings.HasPrefix(pkg, ap.prefix) {
				return ap.area
			}
		}
		return areaOtherLib
	}
	for _, f := range frames {
		switch {
		case strings.HasPrefix(f, "runtime.gcBgMarkWorker"), strings.HasPrefix(f, "runtime.bgsweep"), strings.HasPrefix(f, "runtime.bgscavenge"):
			return areaGC
		case strings.HasPrefix(f, "net/http."):
			return areaStdHTTP
		}
	}
	return areaRuntime
}

// funcPackage returns the package path of a function name as pprof prints
// it ("google.golang.org/grpc/internal/transport.(*http2Server).operateHeaders"
// is in "google.golang.org/grpc/internal/transport").
func funcPackage(name string) string {
	if i := strings.IndexByte(name, '['); i >= 0 {
		name = name[:i] // type arguments may hold paths and dots
	}
	slash := strings.LastIndexByte(name, '/')
	dot := strings.IndexByte(name[slash+1:], '.')
	if dot < 0 {
		return name
	}
	return name[:slash+1+dot]
}

// isStd reports whether a package is in the standard library or the
// runtime: its first path element has no dot (package main aside).
func isStd(pkg string) bool {
	first, _, _ := strings.Cut(pkg, "/")
	return !strings.Contains(first, ".") && pkg != "main"
}
