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
	// servers are the Redis servers whose CPU and command time the cell
	// costs; empty for in-process and memcached cells.
	servers []string
	// setup builds the decider; it returns an error for a cell that cannot
	// run here.
	setup func() (decider, func(), error)
}

// result is one run's figures.
type result struct {
	path, impl  string
	peer        bool
	err         string
	rate        float64
	p50, p99    time.Duration
	clientCPU   time.Duration
	serverCPU   time.Duration
	redisMicros float64
	allocs      float64
}

// runCell runs c cfg.runs times and returns the median run.
func runCell(ctx context.Context, cfg config, env *env, c cell) result {
	base := result{path: c.path, impl: c.impl, peer: c.peer}
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
	// Warm-up: connections, scripts loaded, caches filled.
	load(ctx, d, ids, goroutines, cfg.warmUp, nil)
	var runs []result
	for range cfg.runs {
		r := base
		before := snapshot(env, c.servers)
		lat := make([][]time.Duration, goroutines)
		n, failed, elapsed := load(ctx, d, ids, goroutines, cfg.duration, lat)
		after := snapshot(env, c.servers)
		if n == 0 || failed > n/100 {
			r.err = fmt.Sprintf("%d of %d calls failed", failed, n)
			return r
		}
		all := slices.Concat(lat...)
		slices.Sort(all)
		r.rate = float64(n) / elapsed.Seconds()
		r.p50, r.p99 = all[len(all)/2], all[len(all)*99/100]
		r.clientCPU = (after.cpu - before.cpu) / time.Duration(n)
		r.allocs = float64(after.mallocs-before.mallocs) / float64(n)
		if len(c.servers) > 0 {
			r.serverCPU = (after.serverCPU - before.serverCPU) / time.Duration(n)
			// Per decision, not per command: a peer that sends several
			// commands per decision (ulule's INCRBY and PTTL, say) spends
			// the sum of them.
			r.redisMicros = (after.redisUsec - before.redisUsec) / float64(n)
		}
		runs = append(runs, r)
	}
	return median(runs)
}

// load calls d from goroutines goroutines for about d, spreading the
// identifiers, and records each call's latency in lat when lat is not nil.
// It returns the calls made, those that failed, and the time it took.
func load(ctx context.Context, d decider, ids []string, goroutines int, length time.Duration, lat [][]time.Duration) (int, int, time.Duration) {
	var calls, failed atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	start := time.Now()
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			if lat != nil {
				mine = make([]time.Duration, 0, 1<<16)
			}
			i := g * 7919
			for n := 0; !stop.Load() && n < 50_000_000; n++ {
				id := ids[i%len(ids)]
				i++
				t := time.Now()
				_, err := d(ctx, id)
				if lat != nil {
					mine = append(mine, time.Since(t))
				}
				calls.Add(1)
				if err != nil {
					failed.Add(1)
				}
			}
			if lat != nil {
				lat[g] = mine
			}
		}()
	}
	time.Sleep(length)
	stop.Store(true)
	wg.Wait()
	return int(calls.Load()), int(failed.Load()), time.Since(start)
}

// counters is what a run is measured by, read before and after it.
type counters struct {
	cpu        time.Duration // this process, user and system
	mallocs    uint64
	serverCPU  time.Duration // the cell's Redis servers, user and system
	redisUsec  float64       // the servers' time in commands (commandstats)
	redisCalls int64
}

func snapshot(env *env, servers []string) counters {
	var c counters
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		c.cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	c.mallocs = ms.Mallocs
	for _, addr := range servers {
		cpu, usec, calls := redisCounters(env, addr)
		c.serverCPU += cpu
		c.redisUsec += usec
		c.redisCalls += calls
	}
	return c
}

// redisCounters reads a server's CPU time (INFO cpu) and its time in the
// commands that decide (INFO commandstats). Redis counts a script's own
// calls (GET, SET, INCRBY inside EVALSHA) both on their own lines and in the
// script's time, so when scripts ran only EVALSHA and EVAL are summed;
// otherwise every command but INFO, PING, HELLO, CLIENT and CLUSTER.
func redisCounters(env *env, addr string) (time.Duration, float64, int64) {
	c := env.admin(addr)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	info, err := c.Info(ctx, "cpu", "commandstats").Result()
	if err != nil {
		return 0, 0, 0
	}
	var cpu time.Duration
	var usec, scriptUsec float64
	var calls, scriptCalls int64
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_cpu_sys:"); ok {
			cpu += seconds(v)
		} else if v, ok := strings.CutPrefix(line, "used_cpu_user:"); ok {
			cpu += seconds(v)
		} else if rest, ok := strings.CutPrefix(line, "cmdstat_"); ok {
			name, stats, _ := strings.Cut(rest, ":")
			if name == "info" || name == "ping" || name == "hello" || name == "client" || name == "cluster" {
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
			calls += n
			if strings.HasPrefix(name, "eval") {
				scriptUsec += u
				scriptCalls += n
			}
		}
	}
	if scriptCalls > 0 {
		return cpu, scriptUsec, scriptCalls
	}
	return cpu, usec, calls
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
