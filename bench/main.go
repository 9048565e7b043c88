// Command bench compares throttlekit with the rate limiters its users would
// otherwise pick, cell by cell, against the same real servers in one run,
// and prints one markdown table.
//
// It starts its own redis-server (standalone, three more for the sharded
// layout, a 3-primary Cluster) and memcached on loopback ports with the
// project's test helpers, so nothing but the binaries is needed. Each cell
// runs its limiter from G goroutines over N identifiers for a fixed time,
// several times, and reports the median run: decisions per second, p50
// and p99 latency, client CPU and server CPU per decision, Redis time per
// call (INFO commandstats), allocations per decision, and the ratio of
// throttlekit's figure to the best peer's on the same path.
//
// It lives in a module of its own so that the peers' dependencies never
// enter throttlekit's go.mod. Run it with make bench-peers, or
//
//	cd bench && go run . [-quick] [-duration 3s] [-runs 3]
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"runtime"
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
	quick := flag.Bool("quick", false, "a short smoke run: 300 ms per run, one run")
	only := flag.String("only", "", "run only the cells whose path contains this text")
	flag.Parse()
	if *quick {
		cfg.duration, cfg.runs = 300*time.Millisecond, 1
	}
	start := time.Now()
	env, err := startEnv()
	if err != nil {
		log.Fatal(err)
	}
	defer env.close()
	var results []result
	for _, c := range cells(env) {
		if *only != "" && !strings.Contains(c.path, *only) {
			continue
		}
		r := runCell(context.Background(), cfg, env, c)
		results = append(results, r)
		fmt.Fprintf(os.Stderr, "%-44s %-30s %10.0f/s  p50 %-9v p99 %v\n", c.path, c.impl, r.rate, r.p50, r.p99)
	}
	printTable(os.Stdout, cfg, env, results, time.Since(start))
}

// config is how each cell runs.
type config struct {
	duration    time.Duration
	warmUp      time.Duration
	runs        int
	goroutines  int
	identifiers int
}

func defaultConfig() config {
	return config{duration: 3 * time.Second, warmUp: 300 * time.Millisecond, runs: 3, goroutines: 64, identifiers: 10_000}
}

// printTable writes the results as one markdown table, with the machine,
// the versions and the settings above it.
func printTable(w *os.File, cfg config, env *env, results []result, took time.Duration) {
	fmt.Fprintf(w, "Machine: %s, %d CPUs, %s. Go %s. %s; memcached %s.\n\n",
		cpuModel(), runtime.NumCPU(), osName(), strings.TrimPrefix(runtime.Version(), "go"), env.redisVersion, env.memcachedVersion)
	fmt.Fprintf(w, "Settings: %d goroutines unless the path says 1, %d identifiers, limit 1000/min unless the path says otherwise, "+
		"go-redis pool of 64; %d runs of %v per cell after %v of warm-up, median run shown. Whole run: %v.\n\n",
		cfg.goroutines, cfg.identifiers, cfg.runs, cfg.duration, cfg.warmUp, took.Round(time.Second))
	fmt.Fprintln(w, "| path | implementation | decisions/s | p50 | p99 | client CPU/decision | server CPU/decision | Redis µs/decision | allocs/decision | vs best peer |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	best := map[string]float64{}
	for _, r := range results {
		if r.peer && r.err == "" && r.rate > best[r.path] {
			best[r.path] = r.rate
		}
	}
	// Cluster and sharded layouts are compared with the same
	// implementation on a standalone server.
	standalone := map[string]float64{}
	for _, r := range results {
		if r.path == pathFixed {
			standalone[r.impl] = r.rate
		}
	}
	for _, r := range results {
		if r.err != "" {
			fmt.Fprintf(w, "| %s | %s | skipped: %s | | | | | | | |\n", r.path, r.impl, r.err)
			continue
		}
		ratio := ""
		if b := best[r.path]; !r.peer && b > 0 {
			ratio = fmt.Sprintf("%.2f×", r.rate/b)
		} else if s := standalone[r.impl]; (r.path == pathCluster || r.path == pathSharded) && s > 0 {
			ratio = fmt.Sprintf("%.2f× standalone", r.rate/s)
		}
		fmt.Fprintf(w, "| %s | %s | %.0f | %v | %v | %v | %s | %s | %.1f | %s |\n",
			r.path, r.impl, r.rate, round(r.p50), round(r.p99), round(r.clientCPU), dur(r.serverCPU), micros(r.redisMicros), r.allocs, ratio)
	}
}

func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	case d >= time.Microsecond:
		return d.Round(10 * time.Nanosecond)
	}
	return d
}

func dur(d time.Duration) string {
	if d <= 0 {
		return "–"
	}
	return round(d).String()
}

func micros(v float64) string {
	if v <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f", v)
}

// median returns the run whose rate is the median of rs.
func median(rs []result) result {
	sort.Slice(rs, func(i, j int) bool { return rs[i].rate < rs[j].rate })
	return rs[len(rs)/2]
}
