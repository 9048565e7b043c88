package main

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strings"
	"time"
)

// handMarker separates the generated part of BENCHMARKS.md from the
// hand-written part after it, which -o keeps.
const handMarker = "<!-- Generated above by bench/ (go run . -o BENCHMARKS.md); written by hand below. -->\n"

// defaultTail is the hand-written part of a new file.
const defaultTail = `
## What stands in the way

For each goal missed above: the profile, and what stands in the way.
`

// report is one run's figures, written as markdown.
type report struct {
	cfg     config
	env     *env
	results []result
	memory  []memResult
	timing  time.Duration // what timing one call costs the loop
	commit  string
	took    time.Duration
}

// find returns the result of impl on path, or nil if it did not run.
func (rep *report) find(path, impl string) *result {
	for i := range rep.results {
		r := &rep.results[i]
		if r.path == path && r.impl == impl && r.err == "" {
			return r
		}
	}
	return nil
}

// bestPeer returns the fastest peer on path, or nil.
func (rep *report) bestPeer(path string) *result {
	var best *result
	for i := range rep.results {
		r := &rep.results[i]
		if r.path == path && r.peer && r.err == "" && (best == nil || r.rate > best.rate) {
			best = r
		}
	}
	return best
}

// findMem returns the memory result of impl with limits, or nil.
func (rep *report) findMem(impl string, limits int) *memResult {
	for i := range rep.memory {
		m := &rep.memory[i]
		if m.impl == impl && m.limits == limits && m.err == "" {
			return m
		}
	}
	return nil
}

// goal is one row of the goal table.
type goal struct {
	text     string
	measured string
	met      string
}

const notRun = "not run"

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}

// goals computes every goal of issues 21 and 28 from the run's figures.
func (rep *report) goals() []goal {
	var gs []goal
	add := func(text, measured, met string) { gs = append(gs, goal{text, measured, met}) }
	rateGoal := func(text, path, impl, peerImpl string, atLeast float64) {
		tk, peer := rep.find(path, impl), rep.find(path, peerImpl)
		if tk == nil || peer == nil {
			add(text, notRun, "–")
			return
		}
		ratio := tk.rate / peer.rate
		add(text, fmt.Sprintf("%s/s against %s/s: %.2f×", thousands(tk.rate), thousands(peer.rate), ratio), yesNo(ratio >= atLeast))
	}
	rateGoal("Redis, one limit, **default options**: ≥ 2× ulule's decisions/s", pathFixed, implDefault, implUlule, 2)
	rateGoal("Redis, one limit, batched (`WithBatching(0)`): ≥ 2× ulule's", pathFixed, implBatch, implUlule, 2)
	rateGoal("GCRA, default options: ≥ 2× redis_rate's", pathGCRA, implDefault, implRedisRat, 2)

	if one, three := rep.find(pathFixed, implDefault), rep.find(pathThree, implDefault); one != nil && three != nil {
		cost := one.rate / three.rate
		m := fmt.Sprintf("%s → %s/s: %.2f× the cost", thousands(one.rate), thousands(three.rate), cost)
		if one.redisMicros > 0 && three.redisMicros > 0 {
			m += fmt.Sprintf("; Redis time %.1f → %.1f µs: %.2f×", one.redisMicros, three.redisMicros, three.redisMicros/one.redisMicros)
		}
		add("3 limits (10/s, 600/min, 5000/h) cost ≤ 1.25× one limit, default options", m, yesNo(cost <= 1.25))
	} else {
		add("3 limits (10/s, 600/min, 5000/h) cost ≤ 1.25× one limit, default options", notRun, "–")
	}

	if tk, peer := rep.find(pathHot, implDeny), rep.bestPeer(pathHot); tk != nil && peer != nil {
		ratio := tk.rate / peer.rate
		add("one identifier far over its limit, deny cache: ≥ 20× the best peer",
			fmt.Sprintf("%s/s against %s's %s/s: %.0f×", thousands(tk.rate), peer.impl, thousands(peer.rate), ratio), yesNo(ratio >= 20))
	} else {
		add("one identifier far over its limit, deny cache: ≥ 20× the best peer", notRun, "–")
	}

	timeGoal := func(text, path string) {
		tk, peer := rep.find(path, implMemory), rep.find(path, implXRate)
		if tk == nil || peer == nil {
			add(text, notRun, "–")
			return
		}
		ratio := tk.nsPerDecision() / peer.nsPerDecision()
		m := fmt.Sprintf("%.0f ns against %.0f ns per decision: %.2f× the time", tk.nsPerDecision(), peer.nsPerDecision(), ratio)
		if tk.clientCPU > 0 && peer.clientCPU > 0 {
			// On a loaded machine the wall time also counts the time the
			// loop was not scheduled; the process's CPU time does not.
			m += fmt.Sprintf(" (CPU per decision %v against %v: %.2f×)", tk.clientCPU, peer.clientCPU, float64(tk.clientCPU)/float64(peer.clientCPU))
		}
		add(text, m, yesNo(ratio <= 2))
	}
	timeGoal("in process, 1 goroutine, bare loop: ≤ 2× a map of x/time/rate limiters' time per decision", pathMemory1)
	timeGoal("in process, 64 goroutines: ≤ 2× x/time/rate's time per decision", pathMemory64)

	if one, four := rep.find(pathMemory1, implMemory), rep.find(pathMemory4, implMemory); one != nil && four != nil {
		// The harness allocates nothing per call; a few thousandths come
		// from the runtime and from the sampled latencies' slice.
		add("in process: 0 allocations per decision for policies of up to 4 limits",
			fmt.Sprintf("%.3f (1 limit), %.3f (4 limits)", one.allocs, four.allocs), yesNo(one.allocs < 0.01 && four.allocs < 0.01))
	} else {
		add("in process: 0 allocations per decision for policies of up to 4 limits", notRun, "–")
	}

	if tk, ul := rep.find(pathFixed, implDefault), rep.find(pathFixed, implUlule); tk != nil && ul != nil && tk.redisMicros > 0 && ul.redisMicros > 0 {
		add("Redis time per decision (INFO commandstats) ≤ ulule's, one limit, default (batched)",
			fmt.Sprintf("%.1f µs against %.1f µs: %.2f×", tk.redisMicros, ul.redisMicros, tk.redisMicros/ul.redisMicros), yesNo(tk.redisMicros <= ul.redisMicros))
	} else {
		add("Redis time per decision (INFO commandstats) ≤ ulule's, one limit, default (batched)", notRun, "–")
	}

	if tk, ul := rep.find(pathFixed, implDefault), rep.find(pathFixed, implUlule); tk != nil && ul != nil && tk.serverCPU > 0 && ul.serverCPU > 0 {
		ratio := float64(tk.serverCPU) / float64(ul.serverCPU)
		add("Redis CPU per decision (server process CPU over decisions) ≤ 0.5× ulule's, one limit, default",
			fmt.Sprintf("%v against %v: %.2f×", round(tk.serverCPU), round(ul.serverCPU), ratio), yesNo(ratio <= 0.5))
	} else {
		add("Redis CPU per decision (server process CPU over decisions) ≤ 0.5× ulule's, one limit, default", notRun, "–")
	}
	if def, ul := rep.find(pathSerial, implDefault), rep.find(pathSerial, implUlule); def != nil && ul != nil {
		add("one caller alone: p50 at 1 goroutine, default, no worse than ulule's",
			fmt.Sprintf("%v against %v", round(def.p50), round(ul.p50)), yesNo(def.p50 <= ul.p50))
	} else {
		add("one caller alone: p50 at 1 goroutine, default, no worse than ulule's", notRun, "–")
	}
	if def, plain := rep.find(pathSerial, implDefault), rep.find(pathSerial, implNoBatch); def != nil && plain != nil {
		add("one caller alone: p50 at 1 goroutine, default, no worse than `WithoutBatching()`",
			fmt.Sprintf("%v against %v", round(def.p50), round(plain.p50)), yesNo(def.p50 <= plain.p50))
	} else {
		add("one caller alone: p50 at 1 goroutine, default, no worse than `WithoutBatching()`", notRun, "–")
	}

	var mem []string
	for _, lim := range []int{1, 3} {
		peer := implUlule
		if lim == 3 {
			peer = implUlule3
		}
		if tk, ul := rep.findMem(implDefault, lim), rep.findMem(peer, lim); tk != nil && ul != nil {
			m := fmt.Sprintf("%d limit(s): %.0f B against ulule's %.0f B", lim, tk.usedPerID, ul.usedPerID)
			if old := rep.findMem(implLayout2, lim); old != nil {
				m += fmt.Sprintf(" (layout 2: %.0f B)", old.usedPerID)
			}
			mem = append(mem, m)
		}
	}
	if len(mem) > 0 {
		met := "reported"
		if tk, ul := rep.findMem(implDefault, 1), rep.findMem(implUlule, 1); tk != nil && ul != nil {
			met = yesNo(tk.usedPerID <= ul.usedPerID) + " (1 limit ≤ ulule's)"
		}
		add(fmt.Sprintf("Redis memory per identifier (%s identifiers, used_memory Δ), 1 and 3 limits, before and after, beside ulule's", thousands(float64(rep.cfg.memIdentifiers))),
			strings.Join(mem, "; "), met)
	} else {
		add("Redis memory per identifier, 1 and 3 limits, beside ulule's", notRun, "–")
	}

	layoutGoal := func(text, path string) {
		lay, std := rep.find(path, implDefault), rep.find(pathFixed, implDefault)
		if lay == nil || std == nil {
			add(text, notRun, "–")
			return
		}
		ratio := lay.rate / std.rate
		m := fmt.Sprintf("%s/s against %s/s standalone: %.2f×", thousands(lay.rate), thousands(std.rate), ratio)
		if lay.serverCPU > 0 && std.serverCPU > 0 {
			m += fmt.Sprintf("; server CPU per decision %v against %v", round(lay.serverCPU), round(std.serverCPU))
		}
		add(text, m, yesNo(ratio >= 1))
	}
	layoutGoal("Redis Cluster (3 primaries), default (batched per node): ≥ 1× standalone default", pathCluster)
	if tk, peer := rep.find(pathCluster, implDefault), rep.bestPeer(pathCluster); tk != nil && peer != nil {
		ratio := tk.rate / peer.rate
		m := fmt.Sprintf("%s/s against %s's %s/s: %.2f×", thousands(tk.rate), peer.impl, thousands(peer.rate), ratio)
		if tk.serverCPU > 0 && peer.serverCPU > 0 {
			m += fmt.Sprintf("; server CPU per decision over the nodes %v against %v", round(tk.serverCPU), round(peer.serverCPU))
		}
		add("Redis Cluster (3 primaries), default: ≥ 2× the best peer on the same Cluster", m, yesNo(ratio >= 2))
	} else {
		add("Redis Cluster (3 primaries), default: ≥ 2× the best peer on the same Cluster", notRun, "–")
	}
	layoutGoal("sharded over 3 groups, default: ≥ 1× standalone default", pathSharded)
	return gs
}

// write writes the report; with a tail, as BENCHMARKS.md with the marker
// and the hand-written tail after it.
func (rep *report) write(w io.Writer, tail string) {
	cfg := rep.cfg
	fmt.Fprintln(w, "# throttlekit against its peers: the latest full run")
	fmt.Fprintln(w)
	fmt.Fprintf(w, "`make bench-peers` on %s at %s (the command and the columns are explained in `README.md`). "+
		"Client and servers share the machine's cores, so server CPU and client CPU compete: read ratios within this run, "+
		"not absolute figures across runs or machines.\n\n", time.Now().Format("2006-01-02"), rep.commit)
	fmt.Fprintln(w, "## The goals of issues 21 and 28, and this run's figures")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| goal | measured | met |")
	fmt.Fprintln(w, "|---|---|---|")
	for _, g := range rep.goals() {
		fmt.Fprintf(w, "| %s | %s | %s |\n", g.text, g.measured, g.met)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "## Every cell")
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Machine: %s, %d CPUs, %s. Go %s. %s; memcached %s.\n\n",
		cpuModel(), runtime.NumCPU(), osName(), strings.TrimPrefix(runtime.Version(), "go"), rep.env.redisVersion, rep.env.memcachedVersion)
	fmt.Fprintf(w, "Settings: %d goroutines unless the path says 1, %s identifiers, limit 1000/min unless the path says otherwise, "+
		"go-redis pool of 64; %d runs of %v per cell after %v of warm-up, median run shown; Redis servers flushed before each cell. Whole run: %v.\n\n",
		cfg.goroutines, thousands(float64(cfg.identifiers)), cfg.runs, cfg.duration, cfg.warmUp, rep.took.Round(time.Second))
	fmt.Fprintf(w, "In-process cells run a bare loop timed as a whole (decisions/s and ns/decision are its calls over its wall time) "+
		"and time one call in %d for p50 and p99, which therefore include two clock reads; timing a call costs %v here, "+
		"so %.1f ns per decision of the loop's time is timing. Other cells time every call.\n\n", sampleEvery, rep.timing, float64(rep.timing)/sampleEvery)
	fmt.Fprintln(w, "| path | implementation | decisions/s | ns/decision | p50 | p99 | client CPU/decision | server CPU/decision | Redis µs/decision | allocs/decision | vs best peer |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, r := range rep.results {
		if r.err != "" {
			fmt.Fprintf(w, "| %s | %s | skipped: %s | | | | | | | | |\n", r.path, r.impl, r.err)
			continue
		}
		ns := "–"
		if r.inProcess {
			ns = fmt.Sprintf("%.0f", r.nsPerDecision())
		}
		fmt.Fprintf(w, "| %s | %s | %.0f | %s | %v | %v | %v | %s | %s | %s | %s |\n",
			r.path, r.impl, r.rate, ns, round(r.p50), round(r.p99), round(r.clientCPU), dur(r.serverCPU),
			micros(r.redisMicros), allocs(r.allocs), rep.ratio(r))
	}
	rep.writePerNode(w)
	if len(rep.memory) > 0 {
		fmt.Fprintln(w)
		fmt.Fprintln(w, "## Redis memory per identifier")
		fmt.Fprintln(w)
		fmt.Fprintf(w, "%s identifiers decided once each on the emptied standalone server. used_memory Δ is INFO memory's used_memory "+
			"after over before, per identifier (the key dictionary and expiry entries included); MEMORY USAGE is averaged over up to %d "+
			"sampled keys, times the keys per identifier.\n\n", thousands(float64(rep.cfg.memIdentifiers)), memSample)
		fmt.Fprintln(w, "| implementation | limits | keys per identifier | used_memory Δ per identifier | MEMORY USAGE per identifier |")
		fmt.Fprintln(w, "|---|---:|---:|---:|---:|")
		for _, m := range rep.memory {
			if m.err != "" {
				fmt.Fprintf(w, "| %s | %d | skipped: %s | | |\n", m.impl, m.limits, m.err)
				continue
			}
			fmt.Fprintf(w, "| %s | %d | %.2f | %.0f B | %.0f B |\n", m.impl, m.limits, m.keysPerID, m.usedPerID, m.usagePerID)
		}
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Versions: %s.\n", peerVersions())
	if tail != "" {
		fmt.Fprintln(w)
		fmt.Fprint(w, handMarker)
		fmt.Fprint(w, tail)
	}
}

// writePerNode writes the section "Per node": for each path whose cells run
// on more than one Redis server (the Cluster, the sharded groups), one table
// of each implementation's figures node by node. It writes nothing when no
// such cell ran, so that the rest of the report reads as it did before the
// section existed.
func (rep *report) writePerNode(w io.Writer) {
	var paths []string
	nodes := map[string]int{} // the most nodes a row of the path has
	for _, r := range rep.results {
		if r.err != "" || len(r.nodes) < 2 {
			continue
		}
		if _, seen := nodes[r.path]; !seen {
			paths = append(paths, r.path)
		}
		nodes[r.path] = max(nodes[r.path], len(r.nodes))
	}
	if len(paths) == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "## Per node")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "One table per path whose cells run on more than one Redis server, one row per implementation (the median run, as above). "+
		"Each node's server CPU (INFO cpu) and Redis time (INFO commandstats, counted as in \"Every cell\") are divided by all "+
		"of the cell's decisions, not by those the node decided, so a row's nodes add up to its figures in \"Every cell\"; "+
		"a node's share of the cell's server CPU shows how evenly the identifiers spread over the nodes.")
	for _, path := range paths {
		names := nodeNames(path, nodes[path])
		fmt.Fprintln(w)
		fmt.Fprintf(w, "### %s\n\n", path)
		fmt.Fprint(w, "| implementation |")
		for _, name := range names {
			fmt.Fprintf(w, " %s server CPU/decision | %s Redis µs/decision | %s share of server CPU |", name, name, name)
		}
		fmt.Fprintln(w)
		fmt.Fprint(w, "|---|")
		fmt.Fprint(w, strings.Repeat("---:|", 3*len(names)))
		fmt.Fprintln(w)
		for _, r := range rep.results {
			if r.path != path || r.err != "" || len(r.nodes) < 2 {
				continue
			}
			var total time.Duration
			for _, n := range r.nodes {
				total += max(n.serverCPU, 0)
			}
			fmt.Fprintf(w, "| %s |", r.impl)
			for i := range names {
				if i >= len(r.nodes) {
					fmt.Fprint(w, " | | |")
					continue
				}
				n := r.nodes[i]
				share := "–"
				if total > 0 && n.serverCPU >= 0 {
					share = fmt.Sprintf("%.1f %%", 100*float64(n.serverCPU)/float64(total))
				}
				fmt.Fprintf(w, " %s | %s | %s |", dur(n.serverCPU), micros(n.redisMicros), share)
			}
			fmt.Fprintln(w)
		}
	}
}

// nodeNames names the n servers of path's cells, in the order of the cells'
// servers: the Cluster's nodes are all primaries (it runs without replicas),
// and the sharded layout's groups are named as its DSN names them.
func nodeNames(path string, n int) []string {
	names := make([]string, n)
	for i := range names {
		switch path {
		case pathCluster:
			names[i] = fmt.Sprintf("primary %d", i+1)
		case pathSharded:
			names[i] = fmt.Sprintf("group g%d", i)
		default:
			names[i] = fmt.Sprintf("node %d", i+1)
		}
	}
	return names
}

// ratio is the last column: throttlekit's rate over the best peer's on the
// same path (the time over its time in process); for Cluster and sharded
// rows, over the same implementation on the standalone server.
func (rep *report) ratio(r result) string {
	if r.peer {
		return ""
	}
	if r.path == pathCluster || r.path == pathSharded {
		var parts []string
		if s := rep.find(pathFixed, r.impl); s != nil {
			parts = append(parts, fmt.Sprintf("%.2f× standalone", r.rate/s.rate))
		}
		if b := rep.bestPeer(r.path); b != nil {
			parts = append(parts, fmt.Sprintf("%.2f× best peer", r.rate/b.rate))
		}
		return strings.Join(parts, ", ")
	}
	b := rep.bestPeer(r.path)
	if b == nil {
		return ""
	}
	if r.inProcess {
		return fmt.Sprintf("%.2f× the time", r.nsPerDecision()/b.nsPerDecision())
	}
	return fmt.Sprintf("%.2f×", r.rate/b.rate)
}

// peerVersions lists the peers' module versions from the build information.
func peerVersions() string {
	want := []struct{ path, name string }{
		{"github.com/ulule/limiter/v3", "ulule/limiter"},
		{"github.com/go-redis/redis_rate/v10", "go-redis/redis_rate"},
		{"github.com/throttled/throttled/v2", "throttled"},
		{"golang.org/x/time", "golang.org/x/time"},
		{"github.com/redis/go-redis/v9", "go-redis (for everyone)"},
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	var parts []string
	for _, wnt := range want {
		for _, d := range info.Deps {
			if d.Path == wnt.path {
				parts = append(parts, wnt.name+" "+d.Version)
			}
		}
	}
	return strings.Join(parts, ", ")
}

// gitCommit returns the repository's short commit, marked when the tree has
// changes, or "an unknown commit".
func gitCommit() string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "an unknown commit"
	}
	commit := strings.TrimSpace(string(out))
	if st, err := exec.CommandContext(ctx, "git", "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(st) > 0 {
		commit += " with uncommitted changes"
	}
	return commit
}

// thousands formats v rounded, with commas between thousands.
func thousands(v float64) string {
	s := fmt.Sprintf("%.0f", v)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
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

func allocs(v float64) string {
	if v < 0.1 {
		return fmt.Sprintf("%.3f", v)
	}
	return fmt.Sprintf("%.1f", v)
}
