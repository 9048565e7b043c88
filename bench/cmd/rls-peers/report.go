package main

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/throttlekit/throttlekit/internal/localserver"
)

// handMarker separates the generated part of RLS.md from the hand-written
// part after it, which -o keeps.
const handMarker = "<!-- Generated above by bench/cmd/rls-peers (go run ./cmd/rls-peers -o RLS.md); written by hand below. -->\n"

// defaultTail is the hand-written part of a new file.
const defaultTail = `
## Notes

What the figures mean for throttlekit-rls, and what stands in the way of each goal missed.
`

const (
	envoyName = "envoy ratelimit"
	tkName    = "throttlekit-rls"
	notRun    = "not run"
)

// report is one run's figures, written as markdown.
type report struct {
	cfg          config
	commit       string
	redisVersion string
	envoyVersion string
	services     []*service
	workloads    []*workload
	results      []runResult
	down         []downResult
	profiles     []profileResult
	took         time.Duration
}

// runs returns the measured runs of svc on workload, in order, failed ones
// included.
func (rep *report) runs(svc, workload string) []runResult {
	var rs []runResult
	for _, r := range rep.results {
		if r.svc == svc && r.workload == workload {
			rs = append(rs, r)
		}
	}
	return rs
}

// median returns the run of svc on workload whose decisions/s is the median
// of its successful runs, leaving out starved runs unless all are, or nil.
func (rep *report) median(svc, workload string) *runResult {
	var ok, fed []runResult
	for _, r := range rep.runs(svc, workload) {
		if r.err == "" {
			ok = append(ok, r)
			if !r.starved {
				fed = append(fed, r)
			}
		}
	}
	if len(fed) > 0 {
		ok = fed
	}
	if len(ok) == 0 {
		return nil
	}
	slices.SortFunc(ok, func(a, b runResult) int { return cmp.Compare(a.decRate, b.decRate) })
	return &ok[len(ok)/2]
}

// goal is one row of the goal table.
type goal struct{ workload, text, measured, met string }

func yesNo(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}

// goals compares throttlekit-rls with envoy ratelimit on each workload.
func (rep *report) goals() []goal {
	var gs []goal
	for _, w := range rep.workloads {
		tk, ev := rep.median(tkName, w.name), rep.median(envoyName, w.name)
		add := func(text string, f func(tk, ev *runResult) (string, bool)) {
			if tk == nil || ev == nil {
				gs = append(gs, goal{w.name, text, notRun, "–"})
				return
			}
			m, ok := f(tk, ev)
			gs = append(gs, goal{w.name, text, m, yesNo(ok)})
		}
		add("decisions/s ≥ 2× envoy ratelimit's", func(tk, ev *runResult) (string, bool) {
			r := tk.decRate / ev.decRate
			m := fmt.Sprintf("%s/s against %s/s: %.2f×", thousands(tk.decRate), thousands(ev.decRate), r)
			if a, b := tk.perCPUSecond(), ev.perCPUSecond(); a > 0 && b > 0 {
				m += fmt.Sprintf(" (per CPU-second of service, Redis and load generator together: %s against %s, %.2f×)", thousands(a), thousands(b), a/b)
			}
			return m, r >= 2
		})

		add("p50 no worse than envoy ratelimit's", func(tk, ev *runResult) (string, bool) {
			return fmt.Sprintf("%v against %v", round(tk.p50), round(ev.p50)), tk.p50 <= ev.p50
		})
		add("Redis CPU per decision ≤ 0.5× envoy ratelimit's", func(tk, ev *runResult) (string, bool) {
			r := ratio(tk.redisCPU, ev.redisCPU)
			return fmt.Sprintf("%v against %v: %.2f×", round(tk.redisCPU), round(ev.redisCPU), r), r <= 0.5
		})
		add("service CPU per decision ≤ envoy ratelimit's", func(tk, ev *runResult) (string, bool) {
			r := ratio(tk.svcCPU, ev.svcCPU)
			return fmt.Sprintf("%v against %v: %.2f×", round(tk.svcCPU), round(ev.svcCPU), r), r <= 1
		})
		if tk != nil && ev != nil && (tk.starved || ev.starved) {
			// Every run of a service the neighbours starved: its rate and
			// latency measure them, and its CPU per decision is skewed
			// too (fewer decisions per batch, per system call).
			for i := len(gs) - 4; i < len(gs); i++ {
				gs[i].met = "not judged: every run of " + map[bool]string{true: tkName, false: envoyName}[tk.starved] + " was starved (see \"Each run\"); rerun"
			}
		}
	}
	return gs
}

// perCPUSecond is how many decisions one CPU-second of the service, Redis
// and the load generator together made: the rate the three would reach on
// cores of their own, whatever the neighbours left them.
func (r *runResult) perCPUSecond() float64 {
	cpu := r.svcCPU + r.redisCPU + r.loadCPU
	if cpu <= 0 {
		return 0
	}
	return float64(time.Second) / float64(cpu)
}

func ratio(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// write prints the report, then the marker and the hand-written tail.
func (rep *report) write(w io.Writer, handTail string) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format, args...) }
	cfg := rep.cfg
	tk := rep.service(tkName)

	p("# throttlekit-rls against envoy ratelimit on one Redis: the latest run\n\n")
	p("`make bench-rls` on %s at %s, in %v (the command and the columns are explained below). The load generator, both services and Redis share the machine's %d cores: read ratios within this run, not absolute figures across runs or machines.\n\n",
		time.Now().Format("2006-01-02"), rep.commit, rep.took.Round(time.Second), runtime.NumCPU())
	if cfg.quick {
		p("**A BENCH_QUICK run**: one run of %v per cell. It checks the harness; its figures mean little.\n\n", cfg.duration)
	}
	if tk != nil && tk.bin == "" {
		p("**throttlekit-rls was not measured**, envoy ratelimit alone was:\n\n```\n%s\n```\n\nRerun with `make bench-rls` once `cd middleware/rls && go build ./cmd/throttlekit-rls` succeeds.\n\n", firstLines(tk.err, 12))
	}

	p("## Goals\n\n| workload | goal | measured | met |\n|---|---|---|---|\n")
	for _, g := range rep.goals() {
		p("| %s | %s | %s | %s |\n", g.workload, g.text, g.measured, g.met)
	}

	p("\n## Every cell\n\n")
	p("Machine: %s, %d CPUs, %s/%s. %s. Redis server %s. envoy ratelimit %s@%s, built with the same Go.\n\n",
		cpuModel(), runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version(), rep.redisVersion, envoyModule, rep.envoyVersion)
	p("Load: %d callers over %d gRPC connections (go-control-plane's generated client, grpc-go), each calling `ShouldRateLimit` back to back; "+
		"each request is drawn at random from %s, client values `user:0`…`user:%d`. Both services run at once against the one redis-server and are measured in turn, "+
		"envoy ratelimit first (A B A B …), %d run(s) each of %v after a warm-up of %v (Redis flushed before each run; each service warmed up for %v when it starts); the median run by decisions/s is shown.\n\n",
		cfg.callers, cfg.conns, pluralReqs(cfg.values), cfg.values-1, cfg.runs, cfg.duration, cfg.runWarmUp, cfg.warmUp)
	p("The machine is shared with other tenants, whose load comes in bursts. Before each run the harness waits (up to %v) until other processes use at most %.2f cores, "+
		"and a run during which they used more is made again (up to %d times; \"Each run\" shows every kept run's attempts and the others' cores). "+
		"Decisions/s depend on the CPU the neighbours leave; CPU per decision does not, and \"decisions per CPU-second\" (one over the service's, Redis's and the load generator's CPU per decision together) is the rate the three would reach on cores of their own.\n\n",
		cfg.quietWait, cfg.maxOthers, cfg.retries)
	p("| workload | service | decisions/s | requests/s | p50 | p99 | Redis CPU/decision | service CPU/decision | load generator CPU/decision | Redis µs/decision | Redis commands/decision | cores: service, Redis, load generator; whole machine | decisions per CPU-second | OVER_LIMIT | decisions/s vs envoy ratelimit |\n")
	p("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|\n")
	for _, w := range rep.workloads {
		ev := rep.median(envoyName, w.name)
		for _, s := range rep.services {
			m := rep.median(s.name, w.name)
			if m == nil {
				why := "not built (see above)"
				if rs := rep.runs(s.name, w.name); len(rs) > 0 {
					why = rs[0].err
				}
				p("| %s | %s | %s |  |  |  |  |  |  |  |  |  |  |  |  |\n", w.name, s.name, cellText(why))
				continue
			}
			vs := ""
			if s.name != envoyName && ev != nil {
				vs = fmt.Sprintf("%.2f×", m.decRate/ev.decRate)
			}
			name := s.name
			if m.starved {
				name += " (starved: others held the machine)"
			}
			p("| %s | %s | %s | %s | %v | %v | %v | %v | %v | %.2f | %s | %.2f, %.2f, %.2f; %.2f | %s | %.1f%% | %s |\n",
				w.name, name, thousands(m.decRate), thousands(m.reqRate), round(m.p50), round(m.p99),
				round(m.redisCPU), round(m.svcCPU), round(m.loadCPU), m.redisUsec, m.redisMix,
				m.svcCores, m.redisCores, m.loadCores, m.machineCores, thousands(m.perCPUSecond()), 100*m.overLimit, vs)
		}
	}

	p("\n### Each run, in the order run\n\nEach service's decisions/s, then in brackets the cores other processes used during the run and, when more than one, the attempts it took.\n\n")
	p("| workload | run | envoy ratelimit decisions/s | throttlekit-rls decisions/s | ratio |\n|---|---:|---:|---:|---:|\n")
	for _, w := range rep.workloads {
		evs, tks := rep.runs(envoyName, w.name), rep.runs(tkName, w.name)
		for i := range max(len(evs), len(tks)) {
			e, t, r := "–", "–", ""
			if i < len(evs) {
				e = runRate(evs[i])
			}
			if i < len(tks) {
				t = runRate(tks[i])
			}
			if i < len(evs) && i < len(tks) && evs[i].err == "" && tks[i].err == "" {
				r = fmt.Sprintf("%.2f×", tks[i].decRate/evs[i].decRate)
			}
			p("| %s | %d | %s | %s | %s |\n", w.name, i+1, e, t, r)
		}
	}

	rep.writeDown(p)
	rep.writeProfiles(p)
	rep.writeSettings(p)

	p("\n## Columns\n\n| column | how it is measured |\n|---|---|\n")
	p("| decisions/s | descriptor decisions (requests × descriptors per request) answered over the run's wall time; each caller counts its own calls |\n")
	p("| requests/s | `ShouldRateLimit` calls answered over the run's wall time |\n")
	p("| p50, p99 | each call's latency as the caller sees it (gRPC client included), every call timed |\n")
	p("| Redis CPU/decision | `used_cpu_sys` + `used_cpu_user` (`INFO cpu`) after the run less before, over the run's decisions |\n")
	p("| service CPU/decision | the service process's `utime` + `stime` (`/proc/PID/stat`, 10 ms ticks) after less before, over the decisions |\n")
	p("| load generator CPU/decision | this process's user and system CPU (`getrusage`), over the decisions: the gRPC client's cost, the same code for both services |\n")
	p("| Redis µs/decision | `INFO commandstats` `usec` after less before, over the decisions: the time Redis spent executing commands, without its network I/O; of `EVALSHA`, `EVAL` and `FCALL` alone when scripts ran (a script's own commands are in its time), otherwise of every command but the harness's (`INFO`, `FLUSHALL`, `CONFIG`, …) |\n")
	p("| Redis commands/decision | the commands of the run by calls (`INFO commandstats`), each with its calls per decision; a script's own commands are listed too |\n")
	p("| cores | each process's CPU over the run's wall time; \"whole machine\" is every CPU's busy time in `/proc/stat` (other tenants included) over the wall time, of %d |\n", runtime.NumCPU())
	p("| decisions per CPU-second | one over the sum of the three CPU-per-decision columns: what the service, Redis and the load generator make per second of CPU between them |\n")
	p("| OVER_LIMIT | share of requests answered OVER_LIMIT; the limits are set so that none should be |\n")
	p("\n%s%s", handMarker, handTail)
}

// writeDown prints the Redis-down section.
func (rep *report) writeDown(p func(string, ...any)) {
	p("\n## Redis down\n\n")
	if len(rep.down) == 0 {
		p("Not run.\n")
		return
	}
	p("With the first workload's configuration and load (%d callers), once the service's commands reach Redis, redis-server is killed with SIGKILL; "+
		"the table counts the answers to the calls started in the next %v, each call with a deadline of %v (DeadlineExceeded: the service had not answered by then); "+
		"Redis stays down until every one of those calls has returned. Then redis-server is restarted on the same port, empty; "+
		"\"back on Redis\" is the time from it answering PING to the first command from the service reaching it (`INFO commandstats`, polled every 10 ms). "+
		"Each service runs with its default behaviour.\n\n", rep.cfg.callers, rep.cfg.down, rep.cfg.callTimeout)
	p("| service | calls answered (per s) | answers | p50 | p99 | back on Redis after |\n|---|---:|---|---:|---:|---:|\n")
	for _, d := range rep.down {
		if d.err != "" && d.calls == 0 {
			p("| %s | %s |  |  |  |  |\n", d.svc, cellText(d.err))
			continue
		}
		var as []string
		for c, n := range d.classes {
			if n > 0 {
				as = append(as, fmt.Sprintf("%s %.1f%%", className(c), 100*float64(n)/float64(d.calls)))
			}
		}
		back := round(d.backAfter).String()
		if d.backErr != "" {
			back = cellText(d.backErr)
		}
		rate := 0.0
		if d.length > 0 {
			rate = float64(d.calls) / d.length.Seconds()
		}
		ans := strings.Join(as, ", ")
		if d.err != "" {
			ans += "; " + cellText(d.err)
		}
		p("| %s | %s (%s/s) | %s | %v | %v | %s |\n", d.svc, thousands(float64(d.calls)), thousands(rate), ans, round(d.p50), round(d.p99), back)
	}
}

// writeProfiles prints the CPU profile section.
func (rep *report) writeProfiles(p func(string, ...any)) {
	p("\n## CPU profiles\n\n")
	if len(rep.profiles) == 0 {
		p("Not taken.\n")
		return
	}
	p("Each service's `/debug/pprof/profile` for %v under the first workload's load, in a run of its own after the measured runs. "+
		"Each sample is charged to the library closest to its leaf: standard-library and runtime frames are skipped, so a `write(2)` or an allocation "+
		"(GC assists included) counts for the library that made it; samples with no library frame are GC background work or the runtime's scheduler, netpoll and timers.\n\n", rep.cfg.profile)
	if len(rep.workloads) > 0 {
		w := rep.workloads[0]
		for _, s := range rep.services {
			if m := rep.median(s.name, w.name); m != nil {
				most := "the service"
				switch {
				case m.redisCores > m.svcCores && m.redisCores > m.loadCores:
					most = "Redis"
				case m.loadCores > m.svcCores:
					most = "the load generator"
				}
				p("In its median run of the first workload, %s used %.2f cores, Redis %.2f, the load generator %.2f, with the whole machine busy %.2f of %d (other tenants included): %s used the most CPU.\n\n",
					s.name, m.svcCores, m.redisCores, m.loadCores, m.machineCores, runtime.NumCPU(), most)
			}
		}
	}
	var ok []profileResult
	for _, pr := range rep.profiles {
		if pr.err != "" {
			p("%s: %s\n\n", pr.svc, cellText(pr.err))
			continue
		}
		ok = append(ok, pr)
		p("%s: %v of CPU sampled over %v; cores used meanwhile: service %.2f, Redis %.2f, load generator %.2f.\n\n",
			pr.svc, pr.total.Round(10*time.Millisecond), pr.wall.Round(10*time.Millisecond), pr.svcCores, pr.redisCores, pr.loadCores)
	}
	if len(ok) == 0 {
		return
	}
	areas := map[string]float64{}
	for _, pr := range ok {
		for a, v := range pr.areas {
			areas[a] = max(areas[a], v)
		}
	}
	names := make([]string, 0, len(areas))
	for a := range areas {
		names = append(names, a)
	}
	slices.SortFunc(names, func(a, b string) int { return cmp.Compare(areas[b], areas[a]) })
	p("| area |")
	for _, pr := range ok {
		p(" %s |", pr.svc)
	}
	p("\n|---|")
	for range ok {
		p("---:|")
	}
	p("\n")
	for _, a := range names {
		p("| %s |", a)
		for _, pr := range ok {
			p(" %.1f%% |", 100*pr.areas[a])
		}
		p("\n")
	}
	p("| **gRPC serving: gRPC, HTTP/2 and protobuf** |")
	for _, pr := range ok {
		p(" **%.1f%%** |", 100*(pr.areas[areaGRPC]+pr.areas[areaProto]))
	}
	p("\n")
	p("\nAcross areas, share of each profile's CPU in samples whose stack holds:\n\n| stack holds | what it is |")
	for _, pr := range ok {
		p(" %s |", pr.svc)
	}
	p("\n|---|---|")
	for range ok {
		p("---:|")
	}
	p("\n")
	for _, n := range notables {
		p("| %s | %s |", n.label, n.what)
		for _, pr := range ok {
			p(" %.1f%% |", 100*pr.notable[n.label])
		}
		p("\n")
	}
	for _, pr := range ok {
		if len(pr.growers) > 0 {
			p("\n%s: stack growth (`runtime.newstack`, %.1f%% of its CPU) happens in ", pr.svc, 100*pr.notable[notableGrowth])
			for i, g := range pr.growers {
				if i > 0 {
					p(", ")
				}
				p("%s (%.1f%%)", g.name, 100*g.cum)
			}
			p(".\n")
		}
	}
	for _, pr := range ok {
		p("\nTop of %s by CPU of their own, the runtime's and the standard library's (allocation, system calls, map and string work) charged to the nearest function outside them, with what they call (cum):\n\n| function | own, runtime included | cum |\n|---|---:|---:|\n", pr.svc)
		for _, f := range pr.top {
			p("| `%s` | %.1f%% | %.1f%% |\n", f.name, 100*f.flat, 100*f.cum)
		}
	}
}

// writeSettings prints how each service ran and the workloads' files.
func (rep *report) writeSettings(p func(string, ...any)) {
	p("\n## Settings\n\n")
	for _, s := range rep.services {
		p("### %s\n\n", s.name)
		if s.name == envoyName {
			p("Built by the harness: `go mod download -json %s@%s`, its `go.mod`, `go.sum` and `src/` copied to a temporary directory, `GOFLAGS=-mod=mod go build -o TMP/ratelimit ./src/service_cmd` there. "+
				"Environment (nothing else of the harness's is passed but `PATH`, `HOME`, `TMPDIR` and the Go runtime's `GOMAXPROCS`, `GOGC`, `GOMEMLIMIT`, `GODEBUG` when set, the same for both services):\n\n", envoyModule, rep.envoyVersion)
			p("| setting | value | why |\n|---|---|---|\n")
			for _, st := range s.settings {
				p("| `%s` | `%s` | %s |\n", st.name, st.value, st.why)
			}
			p("\nDefaults kept, as a team would run it:\n\n| setting | default | note |\n|---|---|---|\n")
			for _, st := range envoyDefaults {
				p("| `%s` | `%s` | %s |\n", st.name, st.value, st.why)
			}
			p("\n")
			continue
		}
		if s.bin == "" {
			p("Not run: it did not build (see above).\n\n")
		} else {
			p("Built by the harness from `middleware/rls` (`go build -o TMP/throttlekit-rls ./cmd/throttlekit-rls`) unless `-throttlekit-bin` names one. Its defaults otherwise.\n\n")
		}
		for _, st := range s.settings {
			p("`throttlekit-rls %s` (%s)\n\n", st.value, st.why)
		}
	}
	p("### Workloads\n\nThe same file for both services, `bench.yaml` in the directory each reads.\n\n")
	for _, w := range rep.workloads {
		p("%s: %s.\n\n```yaml\n%s```\n\n", w.name, pluralReqs(len(w.reqs))+describe(w), w.yaml)
	}
}

// describe says what a workload's requests carry.
func describe(w *workload) string {
	if w.descriptors == 1 {
		return ", each with one descriptor `[{client, user:N}]`"
	}
	return fmt.Sprintf(", each with three descriptors `[{client, user:N}]`, `[{route, /api/v1/rK}]` (K of %d, at random) and `[{tenant, tenant-T}]` (T of %s)", routes, thousands(tenants))
}

func pluralReqs(n int) string { return "a pool of " + thousands(float64(n)) + " requests" }

// service returns the service of that name, or nil.
func (rep *report) service(name string) *service {
	for _, s := range rep.services {
		if s.name == name {
			return s
		}
	}
	return nil
}

// runRate is a run's decisions/s with the others' cores and its attempts,
// or its error.
func runRate(r runResult) string {
	if r.err != "" {
		return "failed: " + cellText(oneLine(r.err, 120))
	}
	s := fmt.Sprintf("%s (others %.2f", thousands(r.decRate), r.othersCores)
	if r.attempts > 1 {
		s += fmt.Sprintf(", %d attempts", r.attempts)
	}
	if r.starved {
		s += ", starved"
	}
	return s + ")"
}

// line is a run's figures on one line, for progress output.
func (r runResult) line() string {
	if r.err != "" {
		return "failed: " + oneLine(r.err, 300)
	}
	return fmt.Sprintf("%s decisions/s, %s requests/s, p50 %v, p99 %v, CPU/decision Redis %v, service %v, load %v; cores %.2f/%.2f/%.2f, others %.2f",
		thousands(r.decRate), thousands(r.reqRate), round(r.p50), round(r.p99), round(r.redisCPU), round(r.svcCPU), round(r.loadCPU), r.svcCores, r.redisCores, r.loadCores, r.othersCores)
}

// line is the Redis-down result on one line.
func (d downResult) line() string {
	var as []string
	for c, n := range d.classes {
		if n > 0 {
			as = append(as, fmt.Sprintf("%s %d", className(c), n))
		}
	}
	s := fmt.Sprintf("%d calls in %v: %s; p50 %v, p99 %v; back on Redis after %v", d.calls, d.length.Round(time.Millisecond), strings.Join(as, ", "), round(d.p50), round(d.p99), round(d.backAfter))
	if d.backErr != "" {
		s += " (" + d.backErr + ")"
	}
	if d.err != "" {
		s += "; " + oneLine(d.err, 300)
	}
	return s
}

// writeFile writes the report to name, keeping the hand-written part of the
// file there (what follows handMarker) or a placeholder for it.
func writeFile(name string, rep *report) error {
	handTail := defaultTail
	if old, err := os.ReadFile(name); err == nil {
		if _, after, ok := strings.Cut(string(old), handMarker); ok {
			handTail = after
		}
	}
	f, err := os.Create(name)
	if err != nil {
		return err
	}
	rep.write(f, handTail)
	return f.Close()
}

// adminCommands are the commands the harness itself sends.
var adminCommands = map[string]bool{"info": true, "ping": true, "hello": true, "client": true, "cluster": true,
	"config": true, "flushall": true, "command": true, "select": true}

// cmdStat is one command's line of INFO commandstats.
type cmdStat struct{ calls, usec float64 }

// parseInfo reads INFO cpu and commandstats text: the CPU time, and each
// command's calls and time but the harness's own.
func parseInfo(info string) (cpu time.Duration, cmds map[string]cmdStat) {
	cmds = map[string]cmdStat{}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_cpu_sys:"); ok {
			cpu += seconds(v)
		} else if v, ok := strings.CutPrefix(line, "used_cpu_user:"); ok {
			cpu += seconds(v)
		} else if rest, ok := strings.CutPrefix(line, "cmdstat_"); ok {
			name, stats, _ := strings.Cut(rest, ":")
			if base, _, _ := strings.Cut(name, "|"); adminCommands[base] {
				continue
			}
			var st cmdStat
			for _, kv := range strings.Split(stats, ",") {
				k, v, _ := strings.Cut(kv, "=")
				switch k {
				case "calls":
					st.calls, _ = strconv.ParseFloat(v, 64)
				case "usec":
					st.usec, _ = strconv.ParseFloat(v, 64)
				}
			}
			cmds[name] = st
		}
	}
	return cpu, cmds
}

// cmdDelta returns each command's calls and time in after less before,
// leaving out commands that did not run.
func cmdDelta(after, before map[string]cmdStat) map[string]cmdStat {
	d := map[string]cmdStat{}
	for name, a := range after {
		b := before[name]
		if a.calls > b.calls {
			d[name] = cmdStat{a.calls - b.calls, a.usec - b.usec}
		}
	}
	return d
}

// isScript reports whether a command runs a script or a function.
func isScript(name string) bool {
	return strings.HasPrefix(name, "eval") || strings.HasPrefix(name, "fcall")
}

// deciding sums the commands that decide: the script and function calls
// when any ran (Redis also lists a script's own commands on their own
// lines, and their time is in the script's), otherwise every command.
func deciding(d map[string]cmdStat) cmdStat {
	var all, scripts cmdStat
	for name, st := range d {
		all.calls, all.usec = all.calls+st.calls, all.usec+st.usec
		if isScript(name) {
			scripts.calls, scripts.usec = scripts.calls+st.calls, scripts.usec+st.usec
		}
	}
	if scripts.calls > 0 {
		return scripts
	}
	return all
}

// cmdMix names the commands of d by calls, with their calls per decision.
func cmdMix(d map[string]cmdStat, decisions float64) string {
	names := make([]string, 0, len(d))
	for name := range d {
		names = append(names, name)
	}
	slices.SortFunc(names, func(a, b string) int { return cmp.Or(cmp.Compare(d[b].calls, d[a].calls), strings.Compare(a, b)) })
	var parts []string
	for _, name := range names[:min(len(names), 4)] {
		parts = append(parts, fmt.Sprintf("%s %.3f", strings.ToUpper(name), d[name].calls/decisions))
	}
	return strings.Join(parts, ", ")
}

func seconds(v string) time.Duration {
	f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
	return time.Duration(f * float64(time.Second))
}

// redisVersion is the first line of redis-server --version.
func redisVersion() string {
	path, err := localserver.LookPath(localserver.RedisServerBinary)
	if err != nil {
		return "(not found)"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return "(unknown version)"
	}
	line, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimPrefix(strings.TrimSpace(line), "Redis server ")
}

// cpuModel returns the CPU model from /proc/cpuinfo, or the architecture.
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "model name"); ok {
			return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
		}
	}
	return runtime.GOARCH
}

// gitCommit returns the short commit of the checkout, marked when it has
// uncommitted changes.
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
	s := strconv.FormatFloat(v, 'f', 0, 64)
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

// round shortens a duration for a table.
func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	case d >= time.Microsecond:
		return d.Round(10 * time.Nanosecond)
	}
	return d
}

// oneLine keeps the first line of s, at most n bytes.
func oneLine(s string, n int) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}

// firstLines keeps the first n lines of s.
func firstLines(s string, n int) string {
	ls := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(ls[:min(n, len(ls))], "\n")
}

// cellText makes s fit in a table cell.
func cellText(s string) string {
	return strings.ReplaceAll(strings.ReplaceAll(oneLine(s, 300), "|", "\\|"), "`", "'")
}
