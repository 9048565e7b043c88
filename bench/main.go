// Command bench compares throttlekit with the rate limiters its users would
// otherwise pick, cell by cell, against the same real servers in one run,
// and prints BENCHMARKS.md: the goals of issue 21 with their figures, one
// table of every cell, one per path on several servers with each node's
// figures, and one of Redis memory per identifier.
//
// It starts its own redis-server (standalone, three more for the sharded
// layout, a 3-primary Cluster) and memcached on loopback ports with the
// project's test helpers, so nothing but the binaries is needed. Each cell
// runs its limiter from G goroutines over N identifiers for a fixed time,
// several times, and reports the median run: decisions per second, p50
// and p99 latency, client CPU and server CPU per decision, Redis time per
// decision (INFO commandstats), allocations per decision, and the ratio of
// throttlekit's figure to the best peer's on the same path. In-process
// cells run a bare loop timed as a whole and time one call in 64 for their
// percentiles.
//
// It lives in a module of its own so that the peers' dependencies never
// enter throttlekit's go.mod. Run it with make bench-peers, or
//
//	cd bench && go run . [-quick] [-duration 3s] [-runs 3] [-o BENCHMARKS.md]
//
// BENCH_QUICK=1 in the environment is -quick.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"sort"
	"strings"
	"time"
)

func main() {
	cfg := defaultConfig()
	flag.DurationVar(&cfg.duration, "duration", cfg.duration, "how long each run of a cell lasts")
	flag.IntVar(&cfg.runs, "runs", cfg.runs, "runs per cell; the median run is reported")
	flag.IntVar(&cfg.goroutines, "goroutines", cfg.goroutines, "concurrent callers in the loaded cells")
	flag.IntVar(&cfg.identifiers, "identifiers", cfg.identifiers, "identifiers the callers spread over")
	flag.IntVar(&cfg.memIdentifiers, "mem-identifiers", cfg.memIdentifiers, "identifiers of the Redis memory cells")
	quick := flag.Bool("quick", os.Getenv("BENCH_QUICK") != "", "a short smoke run: 300 ms per run, one run, 10,000 identifiers for memory (also BENCH_QUICK=1)")
	only := flag.String("only", "", "run only the cells whose path contains this text (\"memory\" for the memory cells)")
	out := flag.String("o", "", "write the report to this file, keeping what follows its hand-written marker, instead of standard output")
	flag.Parse()
	if *quick {
		cfg.duration, cfg.runs, cfg.memIdentifiers = 300*time.Millisecond, 1, 10_000
	}
	start := time.Now()
	env, err := startEnv()
	if err != nil {
		log.Fatal(err)
	}
	defer env.close()
	rep := report{cfg: cfg, env: env, timing: timingCost(1_000_000), commit: gitCommit()}
	ctx := context.Background()
	for _, c := range cells(env) {
		if *only != "" && !strings.Contains(c.path, *only) {
			continue
		}
		r := runCell(ctx, cfg, env, c)
		rep.results = append(rep.results, r)
		fmt.Fprintf(os.Stderr, "%-42s %-46s %10.0f/s  p50 %-9v p99 %-9v %s\n", c.path, c.impl, r.rate, r.p50, r.p99, r.err)
	}
	if *only == "" || strings.Contains("memory", *only) {
		for _, m := range memCells() {
			r := runMemCell(ctx, env, cfg.memIdentifiers, m)
			rep.memory = append(rep.memory, r)
			fmt.Fprintf(os.Stderr, "memory, %d limit(s) %-38s %.2f keys/id, %.0f B/id used_memory, %.0f B/id MEMORY USAGE %s\n",
				m.limits, m.impl, r.keysPerID, r.usedPerID, r.usagePerID, r.err)
		}
	}
	rep.took = time.Since(start)
	if *out == "" {
		rep.write(os.Stdout, "")
		return
	}
	if err := writeFile(*out, &rep); err != nil {
		log.Print(err)
		env.close()
		os.Exit(1)
	}
}

// writeFile writes the report to name, keeping the hand-written part of the
// file there (what follows handMarker) or a placeholder for it.
func writeFile(name string, rep *report) error {
	tail := defaultTail
	if old, err := os.ReadFile(name); err == nil {
		if _, after, ok := strings.Cut(string(old), handMarker); ok {
			tail = after
		}
	}
	f, err := os.Create(name)
	if err != nil {
		return err
	}
	rep.write(f, tail)
	return f.Close()
}

// config is how each cell runs.
type config struct {
	duration       time.Duration
	warmUp         time.Duration
	runs           int
	goroutines     int
	identifiers    int
	memIdentifiers int
}

func defaultConfig() config {
	return config{duration: 3 * time.Second, warmUp: 300 * time.Millisecond, runs: 3, goroutines: 64,
		identifiers: 10_000, memIdentifiers: 100_000}
}

// median returns the run whose rate is the median of rs.
func median(rs []result) result {
	sort.Slice(rs, func(i, j int) bool { return rs[i].rate < rs[j].rate })
	return rs[len(rs)/2]
}
