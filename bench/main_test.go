package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The harness measures an in-process cell without any server: the figures
// are there and consistent (a run made calls, the percentiles are ordered),
// and the bare loop allocates nothing of its own per call.
func TestRunCellInProcess(t *testing.T) {
	cfg := config{duration: 50 * time.Millisecond, warmUp: 10 * time.Millisecond, runs: 1, goroutines: 4, identifiers: 100}
	for _, c := range []cell{
		{path: pathMemory64, impl: implXRate, peer: true, inProcess: true, setup: xrate},
		{path: pathMemory64, impl: "throttled (memstore)", peer: true, inProcess: true, setup: throttledMemory},
		{path: pathMemory1, impl: "nothing", inProcess: true, goroutines: 1, setup: func() (decider, func(), error) {
			return func(context.Context, string) (bool, error) { return true, nil }, func() {}, nil
		}},
	} {
		r := runCell(context.Background(), cfg, &env{}, c)
		if r.err != "" {
			t.Fatalf("%s: %s", c.impl, r.err)
		}
		if r.rate <= 0 || r.p50 <= 0 || r.p99 < r.p50 || r.nsPerDecision() <= 0 {
			t.Errorf("%s: rate %v, p50 %v, p99 %v", c.impl, r.rate, r.p50, r.p99)
		}
		if c.impl == "nothing" && r.allocs >= 0.01 {
			t.Errorf("the bare loop allocates %.3f per call", r.allocs)
		}
	}
}

// A failing decider makes the cell skipped with the first error, not a row
// of figures.
func TestRunCellFailing(t *testing.T) {
	cfg := config{duration: 20 * time.Millisecond, warmUp: 5 * time.Millisecond, runs: 1, goroutines: 2, identifiers: 10}
	r := runCell(context.Background(), cfg, &env{}, cell{path: pathMemory1, impl: "broken", inProcess: true,
		setup: func() (decider, func(), error) {
			return func(context.Context, string) (bool, error) { return false, context.DeadlineExceeded }, func() {}, nil
		}})
	if !strings.Contains(r.err, "calls failed") || !strings.Contains(r.err, "deadline") {
		t.Errorf("err %q", r.err)
	}
}

// INFO commandstats: scripts and functions alone when they ran (their inner
// commands are counted inside them), the harness's own commands never.
func TestParseInfo(t *testing.T) {
	info := strings.Join([]string{
		"# CPU", "used_cpu_sys:1.500000", "used_cpu_user:2.000000",
		"# Commandstats",
		"cmdstat_evalsha:calls=10,usec=100,usec_per_call=10.00,rejected_calls=0,failed_calls=0",
		"cmdstat_fcall:calls=2,usec=20,usec_per_call=10.00,rejected_calls=0,failed_calls=0",
		"cmdstat_hset:calls=10,usec=30,usec_per_call=3.00,rejected_calls=0,failed_calls=0",
		"cmdstat_config|resetstat:calls=1,usec=500,usec_per_call=500.00,rejected_calls=0,failed_calls=0",
		"cmdstat_info:calls=3,usec=900,usec_per_call=300.00,rejected_calls=0,failed_calls=0",
	}, "\r\n")
	cpu, usec, scriptUsec, scripts := parseInfo(info)
	if cpu != 3500*time.Millisecond || usec != 150 || scriptUsec != 120 || !scripts {
		t.Errorf("cpu %v, usec %v, script usec %v, scripts %v", cpu, usec, scriptUsec, scripts)
	}
	_, usec, _, scripts = parseInfo("cmdstat_incrby:calls=5,usec=40,usec_per_call=8.00\r\ncmdstat_pexpire:calls=5,usec=10")
	if usec != 50 || scripts {
		t.Errorf("plain commands: usec %v, scripts %v", usec, scripts)
	}
}

// The goal table reads the right cells and judges them; a cell that did not
// run is "not run", not a failure.
func TestGoals(t *testing.T) {
	rep := report{cfg: defaultConfig(), results: []result{
		{path: pathFixed, impl: implDefault, rate: 100_000, redisMicros: 3},
		{path: pathFixed, impl: implUlule, peer: true, rate: 40_000, redisMicros: 4},
		{path: pathThree, impl: implDefault, rate: 90_000},
		{path: pathMemory1, impl: implMemory, inProcess: true, rate: 4e6},
		{path: pathMemory1, impl: implXRate, inProcess: true, peer: true, rate: 1e7},
		{path: pathCluster, impl: implDefault, rate: 90_000},
		{path: pathCluster, impl: implUlule, peer: true, rate: 50_000},
		{path: pathSerial, impl: implDefault, p50: 40 * time.Microsecond},
		{path: pathSerial, impl: implUlule, peer: true, p50: 35 * time.Microsecond},
	}}
	got := map[string]goal{}
	for _, g := range rep.goals() {
		got[g.text] = g
	}
	want := map[string]string{
		"Redis, one limit, **default options**: ≥ 2× ulule's decisions/s":                           "yes",
		"Redis, one limit, batched (`WithBatching(0)`): ≥ 2× ulule's":                               "–",
		"3 limits (10/s, 600/min, 5000/h) cost ≤ 1.25× one limit, default options":                  "yes",
		"in process, 1 goroutine, bare loop: ≤ 2× a map of x/time/rate limiters' time per decision": "**no**",
		"Redis time per decision (INFO commandstats) ≤ ulule's, one limit, default (batched)":       "yes",
		"Redis Cluster (3 primaries), default (batched per node): ≥ 1× standalone default":          "**no**",
		"Redis Cluster (3 primaries), default: ≥ 2× the best peer on the same Cluster":              "**no**",
		"one caller alone: p50 at 1 goroutine, default, no worse than ulule's":                      "**no**",
	}
	for text, met := range want {
		g, ok := got[text]
		if !ok {
			t.Errorf("no goal %q", text)
			continue
		}
		if g.met != met {
			t.Errorf("%q: met %q, want %q (%s)", text, g.met, met, g.measured)
		}
	}
	if g := got["in process, 1 goroutine, bare loop: ≤ 2× a map of x/time/rate limiters' time per decision"]; !strings.Contains(g.measured, "2.50× the time") {
		t.Errorf("in-process ratio: %s", g.measured)
	}
}

// -o keeps what follows the hand-written marker of the file it replaces,
// and writes a placeholder after the marker of a new file.
func TestWriteFileKeepsHandWritten(t *testing.T) {
	name := filepath.Join(t.TempDir(), "BENCHMARKS.md")
	rep := &report{cfg: defaultConfig(), env: &env{}, commit: "abc"}
	if err := writeFile(name, rep); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(name)
	if !strings.Contains(string(b), handMarker+defaultTail) || !strings.Contains(string(b), "## The goals of issues 21 and 28") {
		t.Fatalf("new file:\n%s", b)
	}
	mine := "\n## What stands in the way\n\nProse by hand.\n"
	if err := os.WriteFile(name, []byte("old generated part\n"+handMarker+mine), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := writeFile(name, rep); err != nil {
		t.Fatal(err)
	}
	b, _ = os.ReadFile(name)
	if strings.Contains(string(b), "old generated part") || !strings.HasSuffix(string(b), handMarker+mine) {
		t.Fatalf("rewritten file:\n%s", b)
	}
}

func TestThousands(t *testing.T) {
	for v, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 1234567.4: "1,234,567", -45000: "-45,000"} {
		if got := thousands(v); got != want {
			t.Errorf("thousands(%v) = %q, want %q", v, got, want)
		}
	}
}

// The per-node section: one table per path on several servers, each node's
// figures over all of the cell's decisions and its share of the cell's
// server CPU; no table for a single server or a skipped cell. Apart from
// the section, the report is what it is without per-node figures.
func TestWritePerNode(t *testing.T) {
	us := time.Microsecond
	withNodes := []result{
		{path: pathFixed, impl: implDefault, rate: 100_000, serverCPU: 9 * us, redisMicros: 3,
			nodes: []nodeResult{{serverCPU: 9 * us, redisMicros: 3}}},
		{path: pathCluster, impl: implDefault, rate: 90_000, serverCPU: 12 * us, redisMicros: 6,
			nodes: []nodeResult{{3 * us, 1.5}, {4 * us, 2}, {5 * us, 2.5}}},
		{path: pathCluster, impl: implNoBatch, err: "refused"},
		{path: pathCluster, impl: implUlule, peer: true, rate: 50_000, serverCPU: 6 * us, redisMicros: 3,
			nodes: []nodeResult{{2 * us, 1}, {2 * us, 1}, {2 * us, 1}}},
		{path: pathSharded, impl: implDefault, rate: 80_000, serverCPU: 10 * us, redisMicros: 5,
			nodes: []nodeResult{{10 * us, 5}, {0, 0}, {0, 0}}},
	}
	rep := &report{cfg: defaultConfig(), env: &env{}, commit: "abc", results: withNodes}
	var b strings.Builder
	rep.write(&b, "")
	got := b.String()

	section, rest, ok := strings.Cut(got, "\n## Per node\n")
	if !ok {
		t.Fatalf("no per-node section:\n%s", got)
	}
	if !strings.Contains(section, "| "+pathCluster+" | "+implDefault+" | 90000 |") || strings.Contains(section, "###") {
		t.Errorf("the section does not follow the table of every cell:\n%s", got)
	}
	rest, _, _ = strings.Cut(rest, "\nVersions: ")
	for _, want := range []string{
		"divided by all of the cell's decisions",
		"how evenly the identifiers spread",
		"### " + pathCluster + "\n\n" +
			"| implementation | primary 1 server CPU/decision | primary 1 Redis µs/decision | primary 1 share of server CPU |" +
			" primary 2 server CPU/decision | primary 2 Redis µs/decision | primary 2 share of server CPU |" +
			" primary 3 server CPU/decision | primary 3 Redis µs/decision | primary 3 share of server CPU |\n" +
			"|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n" +
			"| " + implDefault + " | 3µs | 1.5 | 25.0 % | 4µs | 2.0 | 33.3 % | 5µs | 2.5 | 41.7 % |\n" +
			"| " + implUlule + " | 2µs | 1.0 | 33.3 % | 2µs | 1.0 | 33.3 % | 2µs | 1.0 | 33.3 % |\n",
		"### " + pathSharded + "\n\n| implementation | group g0 server CPU/decision |",
		"| " + implDefault + " | 10µs | 5.0 | 100.0 % | – | – | 0.0 % | – | – | 0.0 % |\n",
	} {
		if !strings.Contains(rest, want) {
			t.Errorf("the per-node section lacks\n%s\nin\n%s", want, rest)
		}
	}
	if strings.Contains(rest, implNoBatch) || strings.Contains(rest, pathFixed) {
		t.Errorf("a skipped cell or a single server has a per-node row:\n%s", rest)
	}

	// Without per-node figures the section is absent, and the rest is the
	// same bytes.
	without := make([]result, len(withNodes))
	for i, r := range withNodes {
		r.nodes = nil
		without[i] = r
	}
	rep.results = without
	var plain strings.Builder
	rep.write(&plain, "")
	start := strings.Index(got, "\n## Per node\n")
	end := start + 1 + strings.Index(got[start+1:], "\nVersions: ")
	if cut := got[:start] + got[end:]; cut != plain.String() {
		t.Errorf("the report around the section changed:\nwith the section removed:\n%s\nwithout per-node figures:\n%s", cut, plain.String())
	}
}
