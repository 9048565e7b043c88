package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// utime and stime are fields 14 and 15, counted after the command name,
// which may hold spaces and parentheses.
func TestParseProcStat(t *testing.T) {
	line := "4242 (throttle kit) rls) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 50 0 0 20 0 12 0 100 0 0"
	got, err := parseProcStat(line)
	if err != nil || got != 3*time.Second {
		t.Errorf("parseProcStat = %v, %v; want 3s", got, err)
	}
	if _, err := parseProcStat("4242 (x) S 1"); err == nil {
		t.Error("a short line parsed")
	}
}

// INFO: CPU summed; script calls alone when scripts ran; the harness's own
// commands never.
func TestParseInfo(t *testing.T) {
	info := strings.Join([]string{
		"# CPU", "used_cpu_sys:1.500000", "used_cpu_user:2.000000",
		"# Commandstats",
		"cmdstat_incrby:calls=10,usec=100,usec_per_call=10.00,rejected_calls=0,failed_calls=0",
		"cmdstat_expire:calls=10,usec=50,usec_per_call=5.00,rejected_calls=0,failed_calls=0",
		"cmdstat_info:calls=3,usec=900,usec_per_call=300.00,rejected_calls=0,failed_calls=0",
		"cmdstat_config|resetstat:calls=1,usec=500,usec_per_call=500.00,rejected_calls=0,failed_calls=0",
	}, "\r\n")
	cpu, before := parseInfo(info)
	if cpu != 3500*time.Millisecond || len(before) != 2 || before["incrby"] != (cmdStat{10, 100}) {
		t.Errorf("parseInfo = %v, %v", cpu, before)
	}
	if got := deciding(before); got != (cmdStat{20, 150}) {
		t.Errorf("deciding without scripts = %v; want 20 calls, 150 µs", got)
	}
	_, after := parseInfo(strings.ReplaceAll(info, "calls=10,usec=100", "calls=30,usec=300") +
		"\r\ncmdstat_evalsha:calls=4,usec=40,usec_per_call=10.00,rejected_calls=0,failed_calls=0")
	d := cmdDelta(after, before)
	if got := deciding(d); got != (cmdStat{4, 40}) {
		t.Errorf("deciding with scripts = %v; want 4 calls, 40 µs", got)
	}
	if got := cmdMix(d, 4); got != "INCRBY 5.000, EVALSHA 1.000" {
		t.Errorf("cmdMix = %q", got)
	}
}

func TestClassify(t *testing.T) {
	for _, c := range []struct {
		resp *rlsv3.RateLimitResponse
		err  error
		want string
	}{
		{&rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil, "OK"},
		{&rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT}, nil, "OVER_LIMIT"},
		{&rlsv3.RateLimitResponse{}, nil, "overall code UNKNOWN"},
		{nil, status.Error(codes.Unavailable, "down"), "gRPC Unavailable"},
		{nil, errors.New("not a status"), "gRPC Unknown"},
	} {
		if got := className(classify(c.resp, c.err)); got != c.want {
			t.Errorf("classify(%v, %v) = %q; want %q", c.resp, c.err, got, c.want)
		}
	}
}

// A sample is charged to the library nearest its leaf; runtime and
// standard-library frames are skipped; type arguments do not confuse the
// package.
func TestArea(t *testing.T) {
	for _, c := range []struct {
		frames []string
		want   string
	}{
		{[]string{"internal/runtime/syscall/linux.Syscall6", "syscall.Syscall", "net.(*conn).Write", "github.com/redis/go-redis/v9/internal/pool.(*Conn).WithWriter", "github.com/throttlekit/throttlekit/backend/redis.(*Backend).flush"}, areaRedis},
		{[]string{"runtime.mallocgc", "google.golang.org/grpc/internal/transport.(*http2Server).operateHeaders"}, areaGRPC},
		{[]string{"google.golang.org/protobuf/internal/impl.(*MessageInfo).unmarshal", "google.golang.org/grpc.(*Server).processUnaryRPC"}, areaProto},
		{[]string{"main.main"}, areaTK},
		{[]string{"runtime.scanobject", "runtime.gcDrain", "runtime.gcBgMarkWorker"}, areaGC},
		{[]string{"runtime.futex", "runtime.findRunnable", "runtime.schedule"}, areaRuntime},
		{[]string{"github.com/x/y.F[go.shape.struct { a/b.c }]"}, areaOtherLib},
	} {
		if got := area(c.frames, tkName); got != c.want {
			t.Errorf("area(%v) = %q; want %q", c.frames, got, c.want)
		}
	}
	if got := area([]string{"main.main"}, envoyName); got != areaEnvoy {
		t.Errorf("envoy's main: %q", got)
	}
	if g := grower([]string{"runtime.memmove", "runtime.copystack", "runtime.newstack", "runtime.morestack", "github.com/x/y.F", "main.main"}); g != "`github.com/x/y.F` called from `main.main`" {
		t.Errorf("grower = %q", g)
	}
	if l := libraryLeaf([]string{"runtime.mallocgc", "strconv.Itoa", "github.com/x/y.F", "main.main"}, tkName); l != "github.com/x/y.F" {
		t.Errorf("libraryLeaf = %q", l)
	}
	if l := libraryLeaf([]string{"runtime.scanobject", "runtime.gcBgMarkWorker"}, tkName); l != "("+areaGC+")" {
		t.Errorf("libraryLeaf of GC = %q", l)
	}
	if !isHandler("github.com/throttlekit/throttlekit/middleware/rls.(*Server).ShouldRateLimit") ||
		isHandler("github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3.(*rateLimitServiceClient).ShouldRateLimit") {
		t.Error("isHandler")
	}
}

// The median is taken over successful runs by decisions/s; goals compare
// the medians.
func TestReportGoals(t *testing.T) {
	w := &workload{name: "w", descriptors: 1}
	rep := &report{workloads: []*workload{w}, results: []runResult{
		{svc: envoyName, workload: "w", decRate: 100, p50: 2 * time.Millisecond, redisCPU: 10 * time.Microsecond, svcCPU: 50 * time.Microsecond},
		{svc: tkName, workload: "w", decRate: 300, p50: time.Millisecond, redisCPU: 4 * time.Microsecond, svcCPU: 40 * time.Microsecond},
		{svc: envoyName, workload: "w", decRate: 90},
		{svc: tkName, workload: "w", decRate: 1e9, err: "failed"},
		{svc: envoyName, workload: "w", decRate: 500},
	}}
	if m := rep.median(envoyName, "w"); m == nil || m.decRate != 100 {
		t.Fatalf("median %+v", m)
	}
	for _, g := range rep.goals() {
		if g.met != "yes" {
			t.Errorf("%s: %s %s", g.text, g.measured, g.met)
		}
	}
	rep.results = append(rep.results, runResult{svc: envoyName, workload: "w", decRate: 50, starved: true})
	if m := rep.median(envoyName, "w"); m.decRate != 100 {
		t.Errorf("a starved run changed the median: %v", m.decRate)
	}
	w2 := &workload{name: "w2", descriptors: 1}
	starved := &report{workloads: []*workload{w2}, results: []runResult{
		{svc: envoyName, workload: "w2", decRate: 100, svcCPU: 1, redisCPU: 1},
		{svc: tkName, workload: "w2", decRate: 300, svcCPU: 1, redisCPU: 1, starved: true},
	}}
	for _, g := range starved.goals() {
		if !strings.HasPrefix(g.met, "not judged") {
			t.Errorf("starved: %s: %s", g.text, g.met)
		}
	}
	var b bytes.Buffer
	rep.services = []*service{newEnvoy("x", nil), newThrottlekit("", nil)}
	rep.services[1].err = "it does not build"
	rep.write(&b, defaultTail)
	for _, want := range []string{"3.00×", "it does not build", handMarker} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the report lacks %q", want)
		}
	}
}

func TestPercentile(t *testing.T) {
	lat := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	if percentile(lat, 0.5) != 6 || percentile(lat, 0.99) != 10 || percentile(nil, 0.5) != 0 {
		t.Error(percentile(lat, 0.5), percentile(lat, 0.99))
	}
}
