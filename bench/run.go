package main

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// decider is one limiter under test: it decides one request for id.
type decider func(ctx context.Context, id string) (allowed bool, err error)

// cell is one implementation on one path.
type cell struct {
	path string
	impl string
	peer bool
	// goroutines overrides the configured count (1 for the serial cells).
	goroutines int
	// oneID sends every request for the same identifier.
	oneID bool
	// inProcess marks a cell without a server: its loop is bare (see load).
	inProcess bool
	// servers are the Redis servers whose CPU and command time the cell
	// costs; empty for in-process and memcached cells. They are flushed
	// before the cell, so that no cell sees another's state and every
	// backend can run with no options at all.
	servers []string
	// setup builds the decider; it returns an error for a cell that cannot
	// run here.
	setup func() (decider, func(), error)
}

// result is one run's figures.
type result struct {
	path, impl  string
	peer        bool
	inProcess   bool
	err         string
	rate        float64
	p50, p99    time.Duration
	clientCPU   time.Duration
	serverCPU   time.Duration
	redisMicros float64
	allocs      float64
	// nodes are the same run's figures per server, aligned with the
	// cell's servers; set only when the cell has servers.
	nodes []nodeResult
}

// nodeResult is one server's share of a run: its CPU and its time in the
// commands that decide, each over all of the run's decisions, so that a
// cell's nodes add up to its serverCPU and redisMicros.
type nodeResult struct {
	serverCPU   time.Duration
	redisMicros float64
}

// nsPerDecision is the run's wall time per decision: the inverse of its
// rate, in nanoseconds.
func (r result) nsPerDecision() float64 {
	if r.rate <= 0 {
		return 0
	}
	return 1e9 / r.rate
}

// Sampling of the in-process cells: one call in sampleEvery is timed, and
// the stop flag is read once every checkEvery calls, so that the loop around
// a decision of a hundred nanoseconds costs about a nanosecond. Cells with a
// server time every call (two clock reads against a round trip of tens of
// microseconds) and read the flag every call.
const (
	sampleEvery = 64
	checkEvery  = 256
)

// runCell runs c cfg.runs times and returns the median run.
func runCell(ctx context.Context, cfg config, env *env, c cell) result {
	base := result{path: c.path, impl: c.impl, peer: c.peer, inProcess: c.inProcess}
	if err := env.flush(c.servers); err != nil {
		base.err = err.Error()
		return base
	}
	d, cleanup, err := c.setup()
	if err != nil {
		base.err = err.Error()
		return base
	}
	defer cleanup()
	goroutines := cfg.goroutines
	if c.goroutines > 0 {
		goroutines = c.goroutines
	}
	ids := make([]string, cfg.identifiers)
	for i := range ids {
		ids[i] = "user:" + strconv.Itoa(i)
	}
	if c.oneID {
		ids = ids[:1]
	}
	timing := loopTiming{sample: 1, check: 1}
	if c.inProcess {
		timing = loopTiming{sample: sampleEvery, check: checkEvery}
	}
	// Warm-up: connections, scripts loaded, caches filled.
	load(ctx, d, ids, goroutines, cfg.warmUp, timing, false)
	var runs []result
	for range cfg.runs {
		r := base
		env.resetStats(c.servers)
		before := snapshot(env, c.servers)
		run := load(ctx, d, ids, goroutines, cfg.duration, timing, true)
		after := snapshot(env, c.servers)
		n := run.calls
		if n == 0 || run.failed > n/100 {
			r.err = fmt.Sprintf("%d of %d calls failed", run.failed, n)
			if run.firstErr != nil {
				r.err += ": " + run.firstErr.Error()
			}
			return r
		}
		slices.Sort(run.lat)
		r.rate = float64(n) / run.elapsed.Seconds()
		r.p50, r.p99 = run.lat[len(run.lat)/2], run.lat[len(run.lat)*99/100]
		r.clientCPU = (after.cpu - before.cpu) / time.Duration(n)
		r.allocs = float64(after.mallocs-before.mallocs) / float64(n)
		if len(c.servers) > 0 {
			r.serverCPU = (after.serverCPU - before.serverCPU) / time.Duration(n)
			// Per decision, not per command: a peer that sends several
			// commands per decision (ulule's INCRBY and PTTL, say) spends
			// the sum of them, and a batched script call that decides many
			// is shared by them. The counters were reset before the run.
			r.redisMicros = after.redisUsec / float64(n)
			r.nodes = make([]nodeResult, len(c.servers))
			for i := range r.nodes {
				r.nodes[i] = nodeResult{
					serverCPU:   (after.nodes[i].cpu - before.nodes[i].cpu) / time.Duration(n),
					redisMicros: after.nodes[i].redisUsec / float64(n),
				}
			}
		}
		runs = append(runs, r)
	}
	return median(runs)
}

// loopTiming says how often the load loop times a call and reads its stop
// flag.
type loopTiming struct{ sample, check int }

// loadRun is what one load measured.
type loadRun struct {
	calls, failed int
	firstErr      error
	elapsed       time.Duration
	lat           []time.Duration // the sampled latencies, when kept
}

// load calls d from goroutines goroutines for about length, spreading the
// identifiers. Each goroutine counts its own calls (no shared counter), so
// the loop around a decision costs the same on every implementation; the
// whole run is timed as one, and the rate is its calls over that time. It
// keeps the sampled latencies when keep is set.
func load(ctx context.Context, d decider, ids []string, goroutines int, length time.Duration, t loopTiming, keep bool) loadRun {
	var stop atomic.Bool
	var wg sync.WaitGroup
	calls := make([]int, goroutines)
	failed := make([]int, goroutines)
	errs := make([]error, goroutines)
	lat := make([][]time.Duration, goroutines)
	capacity := max(1<<12, (1<<20)/goroutines)
	start := time.Now()
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			if keep {
				mine = make([]time.Duration, 0, capacity)
			}
			i := (g * 7919) % len(ids)
			n, bad := 0, 0
			var first error
			for ; n < 200_000_000; n++ {
				if n%t.check == 0 && stop.Load() {
					break
				}
				id := ids[i]
				if i++; i == len(ids) {
					i = 0
				}
				var err error
				if n%t.sample == 0 {
					began := time.Now()
					_, err = d(ctx, id)
					if keep {
						mine = append(mine, time.Since(began))
					}
				} else {
					_, err = d(ctx, id)
				}
				if err != nil {
					bad++
					if first == nil {
						first = err
					}
				}
			}
			calls[g], failed[g], errs[g], lat[g] = n, bad, first, mine
		}()
	}
	time.Sleep(length)
	stop.Store(true)
	wg.Wait()
	r := loadRun{elapsed: time.Since(start)}
	for g := range goroutines {
		r.calls += calls[g]
		r.failed += failed[g]
		if r.firstErr == nil {
			r.firstErr = errs[g]
		}
	}
	if keep {
		r.lat = slices.Concat(lat...)
	}
	return r
}

// timingCost is what timing one call costs the load loop: two clock reads
// and an append, measured in a bare loop of n.
func timingCost(n int) time.Duration {
	if n <= 0 {
		return 0
	}
	lat := make([]time.Duration, 0, n)
	start := time.Now()
	for range n {
		t := time.Now()
		lat = append(lat, time.Since(t))
	}
	took := time.Since(start)
	if len(lat) != n || slices.Min(lat) < 0 {
		return 0 // never: this only keeps the appends used
	}
	return took / time.Duration(n)
}

// counters is what a run is measured by, read before and after it.
type counters struct {
	cpu       time.Duration // this process, user and system
	mallocs   uint64
	serverCPU time.Duration  // the cell's Redis servers, user and system
	redisUsec float64        // the servers' time in the commands that decide, since CONFIG RESETSTAT
	nodes     []nodeCounters // serverCPU and redisUsec server by server, in the order of the cell's servers
}

// nodeCounters is one server's part of counters: its CPU time and its time
// in the commands that decide.
type nodeCounters struct {
	cpu       time.Duration
	redisUsec float64
}

// snapshot reads this process's counters and those of servers, each server
// on its own and summed.
func snapshot(env *env, servers []string) counters {
	var c counters
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		c.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	c.mallocs = ms.Mallocs
	c.nodes = make([]nodeCounters, len(servers))
	for i, addr := range servers {
		cpu, usec := redisCounters(env, addr)
		c.nodes[i] = nodeCounters{cpu: cpu, redisUsec: usec}
		c.serverCPU += cpu
		c.redisUsec += usec
	}
	return c
}

// redisCounters reads a server's CPU time (INFO cpu) and its time in the
// commands that decide (INFO commandstats). Redis counts a script's own
// calls (HGET, HSET, INCRBY inside EVALSHA) both on their own lines and in
// the script's time, so when scripts or functions ran only EVALSHA, EVAL and
// FCALL are summed; otherwise every command but INFO, PING, HELLO, CLIENT,
// CLUSTER, CONFIG, FLUSHALL, SCRIPT and COMMAND.
func redisCounters(env *env, addr string) (time.Duration, float64) {
	c := env.admin(addr)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	info, err := c.Info(ctx, "cpu", "commandstats").Result()
	if err != nil {
		return 0, 0
	}
	cpu, usec, scriptUsec, scripts := parseInfo(info)
	if scripts {
		return cpu, scriptUsec
	}
	return cpu, usec
}

// adminCommands are the commands the harness itself sends.
var adminCommands = map[string]bool{"info": true, "ping": true, "hello": true, "client": true, "cluster": true,
	"config": true, "flushall": true, "script": true, "command": true, "memory": true, "scan": true, "dbsize": true}

// parseInfo reads INFO cpu and commandstats text: the CPU time, the time in
// every command but the harness's own, the time in script and function
// calls, and whether any ran.
func parseInfo(info string) (cpu time.Duration, usec, scriptUsec float64, scripts bool) {
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
			var n int64
			var u float64
			for _, kv := range strings.Split(stats, ",") {
				k, v, _ := strings.Cut(kv, "=")
				switch k {
				case "calls":
					n, _ = strconv.ParseInt(v, 10, 64)
				case "usec":
					u, _ = strconv.ParseFloat(v, 64)
				}
			}
			usec += u
			if (strings.HasPrefix(name, "eval") || strings.HasPrefix(name, "fcall")) && n > 0 {
				scriptUsec += u
				scripts = true
			}
		}
	}
	return cpu, usec, scriptUsec, scripts
}

func seconds(v string) time.Duration {
	f, _ := strconv.ParseFloat(v, 64)
	return time.Duration(f * float64(time.Second))
}

// newRedisClient is the go-redis client every Redis cell uses: a pool of
// 64, deadlines honoured.
func newRedisClient(addr string) *redis.Client {
	return redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64, ContextTimeoutEnabled: true})
}
