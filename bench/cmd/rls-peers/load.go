package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// workload is one configuration and the requests sent under it.
type workload struct {
	key         string // short name, for files
	name        string // as the report names it
	yaml        string // envoy ratelimit's configuration file, the same for both services
	descriptors int    // descriptors per request: decisions per request
	reqs        []*rlsv3.RateLimitRequest
}

// Value counts of the three-rule workload's other two keys.
const (
	routes  = 100
	tenants = 1_000
)

// workloads returns the two workloads: one rule (key client, 1000/min) with
// one descriptor per request, and three rules (client, route, tenant) with
// the three descriptors in every request. Each has a pool of values
// requests, client value i in request i; callers pick requests from the pool
// at random. The limits are high enough that no value goes over its limit
// in a run (the servers are flushed before each), so that both services
// decide the same allowed requests.
func workloads(values int) []*workload {
	one := &workload{key: "one-rule", name: "1 rule, 1 descriptor per request", descriptors: 1, yaml: `domain: bench
descriptors:
  - key: client
    rate_limit:
      unit: minute
      requests_per_unit: 1000
`}
	three := &workload{key: "three-rules", name: "3 rules, 3 descriptors per request", descriptors: 3, yaml: `domain: bench
descriptors:
  - key: client
    rate_limit:
      unit: minute
      requests_per_unit: 1000
  - key: route
    rate_limit:
      unit: minute
      requests_per_unit: 1000000
  - key: tenant
    rate_limit:
      unit: minute
      requests_per_unit: 100000
`}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range values {
		client := entry("client", "user:"+strconv.Itoa(i))
		one.reqs = append(one.reqs, &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*commonv3.RateLimitDescriptor{client}})
		three.reqs = append(three.reqs, &rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*commonv3.RateLimitDescriptor{
			entry("client", "user:"+strconv.Itoa(i)),
			entry("route", "/api/v1/r"+strconv.Itoa(rng.IntN(routes))),
			entry("tenant", "tenant-"+strconv.Itoa(rng.IntN(tenants))),
		}})
	}
	return []*workload{one, three}
}

// entry is a descriptor of one entry.
func entry(key, value string) *commonv3.RateLimitDescriptor {
	return &commonv3.RateLimitDescriptor{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: key, Value: value}}}
}

// Answer classes: the overall code of a response, or the gRPC status code
// of an error (classGRPC + code).
const (
	classOK        = 0
	classOverLimit = 1
	classUnknown   = 2 // a response with overall code UNKNOWN
	classGRPC      = 3
	numClasses     = classGRPC + 17
)

// classify returns an answer's class.
func classify(resp *rlsv3.RateLimitResponse, err error) int {
	if err != nil {
		c := int(status.Code(err))
		if c < 0 || c > 16 {
			c = int(codes.Unknown)
		}
		return classGRPC + c
	}
	switch resp.GetOverallCode() {
	case rlsv3.RateLimitResponse_OK:
		return classOK
	case rlsv3.RateLimitResponse_OVER_LIMIT:
		return classOverLimit
	}
	return classUnknown
}

// className names a class as the report shows it.
func className(c int) string {
	switch c {
	case classOK:
		return "OK"
	case classOverLimit:
		return "OVER_LIMIT"
	case classUnknown:
		return "overall code UNKNOWN"
	}
	return "gRPC " + codes.Code(c-classGRPC).String()
}

// Phases of a load. A call counts in the phase it started in; latencies are
// kept for phaseMeasure alone.
const (
	phaseWarm    = 0 // before the measurement (warm-up; before Redis is killed)
	phaseMeasure = 1 // measured (Redis down, in the Redis-down test)
	phaseAfter   = 2 // after the measurement, until the callers stop
	numPhases    = 3
	phaseStop    = -1

	// maxCallsPerCaller bounds each caller's loop whatever the clock does.
	maxCallsPerCaller = 100_000_000
	// stopGrace is how long callers have to finish their calls once told
	// to stop, before their calls are cancelled.
	stopGrace = 10 * time.Second
)

// callerStats is one caller's own counts (no shared counter).
type callerStats struct {
	calls    [numPhases]int
	classes  [numPhases][numClasses]int
	lat      []time.Duration
	firstErr error
}

// loader is a running load: callers goroutines calling ShouldRateLimit
// back to back, each on one of the connections in turn, with requests
// drawn at random from a pool.
type loader struct {
	phase  atomic.Int32
	wg     sync.WaitGroup
	cancel context.CancelFunc
	stats  []*callerStats
	starts [numPhases]time.Time
	ends   [numPhases]time.Time
}

// startLoad starts the callers in phaseWarm. perCall, when positive, is each
// call's deadline.
func startLoad(ctx context.Context, clients []rlsv3.RateLimitServiceClient, reqs []*rlsv3.RateLimitRequest, callers int, perCall time.Duration) *loader {
	ctx, cancel := context.WithCancel(ctx)
	l := &loader{cancel: cancel, stats: make([]*callerStats, callers)}
	l.starts[phaseWarm] = time.Now()
	for g := range callers {
		st := &callerStats{lat: make([]time.Duration, 0, max(1<<12, (1<<20)/callers))}
		l.stats[g] = st
		client := clients[g%len(clients)]
		rng := rand.New(rand.NewPCG(uint64(g), 0x5eed))
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for n := 0; n < maxCallsPerCaller; n++ {
				p := l.phase.Load()
				if p < 0 || ctx.Err() != nil {
					return
				}
				req := reqs[rng.IntN(len(reqs))]
				cctx, ccancel := ctx, context.CancelFunc(nil)
				if perCall > 0 {
					cctx, ccancel = context.WithTimeout(ctx, perCall)
				}
				began := time.Now()
				resp, err := client.ShouldRateLimit(cctx, req)
				took := time.Since(began)
				if ccancel != nil {
					ccancel()
				}
				c := classify(resp, err)
				st.calls[p]++
				st.classes[p][c]++
				if p == phaseMeasure {
					st.lat = append(st.lat, took)
				}
				if err != nil && st.firstErr == nil {
					st.firstErr = err
				}
			}
		}()
	}
	return l
}

// set moves the load to phase p, recording when.
func (l *loader) set(p int32) {
	now := time.Now()
	if old := l.phase.Swap(p); old >= 0 {
		l.ends[old] = now
	}
	if p >= 0 {
		l.starts[p] = now
	}
}

// stop tells the callers to stop, waits up to stopGrace for their calls,
// then cancels what is left and waits for them.
func (l *loader) stop() {
	l.set(phaseStop)
	done := make(chan struct{})
	go func() { l.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(stopGrace):
		l.cancel()
		<-done
	}
	l.cancel()
}

// summary adds up the callers' figures of phase p; call it after stop.
func (l *loader) summary(p int) (calls int, classes [numClasses]int, lat []time.Duration, firstErr error) {
	var lats [][]time.Duration
	for _, st := range l.stats {
		calls += st.calls[p]
		for c := range classes {
			classes[c] += st.classes[p][c]
		}
		lats = append(lats, st.lat)
		if firstErr == nil {
			firstErr = st.firstErr
		}
	}
	lat = slices.Concat(lats...)
	slices.Sort(lat)
	return calls, classes, lat, firstErr
}

// percentile returns the q-quantile of sorted latencies.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted)) * q)
	return sorted[min(i, len(sorted)-1)]
}

// sleep waits for d or until ctx is done.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// runResult is one measured run of one service on one workload.
type runResult struct {
	svc, workload string
	err           string
	elapsed       time.Duration
	requests      int
	reqRate       float64 // requests per second
	decRate       float64 // descriptor decisions per second
	p50, p99      time.Duration
	overLimit     float64 // share of requests answered OVER_LIMIT
	errors        int
	// CPU per descriptor decision: Redis (INFO cpu), the service process
	// (/proc/PID/stat), this process (getrusage: the load generator).
	redisCPU, svcCPU, loadCPU time.Duration
	// cores each used over the run: CPU time over wall time.
	redisCores, svcCores, loadCores float64
	// machineCores are the cores busy on the whole machine over the run,
	// other tenants' processes included.
	machineCores float64
	// othersCores are the cores the machine was busy with besides the
	// service, Redis and the load generator: other tenants.
	othersCores float64
	// attempts counts the runs made for this one (see measureQuiet);
	// starved marks a run kept although others held too much of the
	// machine in every attempt; waited is the time spent waiting for a
	// quiet machine before the attempts.
	attempts int
	starved  bool
	waited   time.Duration
	// redisCalls and redisUsec are Redis calls and command time per
	// decision (INFO commandstats): script calls (EVALSHA, EVAL, FCALL)
	// when scripts ran, otherwise every command but the harness's own;
	// redisMix names the commands with their calls per decision.
	redisCalls, redisUsec float64
	redisMix              string
}

// measure runs one measured run of r on w: Redis flushed, warm of load,
// then length of measured load, with the counters read at its start and
// end.
func measure(ctx context.Context, h *harness, r *running, w *workload, warm, length time.Duration) runResult {
	res := runResult{svc: r.svc.name, workload: w.name}
	if err := h.redis.flush(ctx); err != nil {
		res.err = err.Error()
		return res
	}
	l := startLoad(ctx, r.clients, w.reqs, h.cfg.callers, 0)
	sleep(ctx, warm)
	before, err := h.snapshot(ctx, r)
	l.set(phaseMeasure)
	sleep(ctx, length)
	l.set(phaseAfter)
	after, err2 := h.snapshot(ctx, r)
	l.stop()
	if err == nil {
		err = err2
	}
	if err != nil {
		res.err = err.Error()
		return res
	}
	calls, classes, lat, firstErr := l.summary(phaseMeasure)
	res.elapsed = l.ends[phaseMeasure].Sub(l.starts[phaseMeasure])
	res.requests = calls
	res.errors = calls - classes[classOK] - classes[classOverLimit]
	if calls == 0 || res.errors > calls/100 {
		res.err = fmt.Sprintf("%d of %d calls failed", res.errors, calls)
		if firstErr != nil {
			res.err += ": " + firstErr.Error()
		}
		if r.exited() {
			res.err += "; the service exited" + logTail(r.logPath)
		}
		return res
	}
	decisions := float64(calls * w.descriptors)
	secs := res.elapsed.Seconds()
	res.reqRate = float64(calls) / secs
	res.decRate = decisions / secs
	res.p50, res.p99 = percentile(lat, 0.5), percentile(lat, 0.99)
	res.overLimit = float64(classes[classOverLimit]) / float64(calls)
	per := func(d time.Duration) time.Duration { return time.Duration(float64(d) / decisions) }
	res.redisCPU, res.svcCPU, res.loadCPU = per(after.redis-before.redis), per(after.svc-before.svc), per(after.self-before.self)
	wall := after.at.Sub(before.at).Seconds()
	res.redisCores = (after.redis - before.redis).Seconds() / wall
	res.svcCores = (after.svc - before.svc).Seconds() / wall
	res.loadCores = (after.self - before.self).Seconds() / wall
	res.machineCores = (after.machine - before.machine).Seconds() / wall
	res.othersCores = max(0, res.machineCores-res.svcCores-res.redisCores-res.loadCores)
	d := cmdDelta(after.cmds, before.cmds)
	dec := deciding(d)
	res.redisCalls, res.redisUsec, res.redisMix = dec.calls/decisions, dec.usec/decisions, cmdMix(d, decisions)
	return res
}

// measureQuiet is measure on a machine whose other tenants leave room: it
// first waits (up to quietWait) until processes other than the harness's
// use at most maxOthers cores, and runs again (up to retries times) a run
// during which they used more, since such a run measures the neighbours
// rather than the service. The result counts its attempts; one kept after
// the last retry is marked starved.
func measureQuiet(ctx context.Context, h *harness, r *running, w *workload) runResult {
	cfg := h.cfg
	var res runResult
	var waited time.Duration
	for attempt := 0; attempt <= cfg.retries; attempt++ {
		waited += waitQuiet(ctx, cfg.maxOthers, cfg.quietWait)
		res = measure(ctx, h, r, w, cfg.runWarmUp, cfg.duration)
		res.attempts, res.waited = attempt+1, waited
		if res.err != "" || res.othersCores <= cfg.maxOthers || ctx.Err() != nil {
			return res
		}
		logf("%s, %s: other processes held %.2f cores of the machine during the run (over %.2f): %s", w.name, r.svc.name, res.othersCores, cfg.maxOthers,
			map[bool]string{true: "run again", false: "kept, marked"}[attempt < cfg.retries])
	}
	res.starved = true
	return res
}

// waitQuiet waits until the machine's CPUs are busy at most maxOthers cores
// over half a second (the services are idle meanwhile, so that is other
// processes' use), for at most limit, and returns how long it waited.
func waitQuiet(ctx context.Context, maxOthers float64, limit time.Duration) time.Duration {
	const window = 500 * time.Millisecond
	start := time.Now()
	for n := 0; n < int(limit/window)+1 && ctx.Err() == nil; n++ {
		before, t := machineBusy(), time.Now()
		sleep(ctx, window)
		busy := (machineBusy() - before).Seconds() / time.Since(t).Seconds()
		if before == 0 || busy <= maxOthers || time.Since(start) >= limit {
			break
		}
	}
	return time.Since(start)
}

// downResult is what one service answered with Redis killed.
type downResult struct {
	svc       string
	err       string
	calls     int
	length    time.Duration
	classes   [numClasses]int
	p50, p99  time.Duration
	backAfter time.Duration // from Redis answering PING again to the service's first command on it
	backErr   string
	perCall   time.Duration
}

// redisDown loads r, kills Redis (SIGKILL) once r's decisions reach it,
// records for length what r answers to calls started while Redis is down
// (each call with a deadline of perCall), waits for those calls to return,
// then restarts Redis on the same port and measures how long r takes to
// send it commands again.
func redisDown(ctx context.Context, h *harness, r *running, w *workload, length, perCall time.Duration) downResult {
	res := downResult{svc: r.svc.name, perCall: perCall}
	if err := h.redis.start(); err != nil {
		res.err = "restarting Redis: " + err.Error()
		return res
	}
	h.redis.resetStats(ctx)
	l := startLoad(ctx, r.clients, w.reqs, h.cfg.callers, perCall)
	defer l.stop()
	// Before the kill: at least a second of load, and the service's
	// commands seen on Redis (its connections are up).
	sleep(ctx, time.Second)
	if _, err := h.redis.waitCommands(ctx, 30*time.Second); err != nil {
		res.err = "before the kill: " + err.Error()
		return res
	}
	h.redis.kill()
	l.set(phaseMeasure)
	sleep(ctx, length)
	l.set(phaseAfter)
	// Redis stays down until every call started while it was down has
	// returned, so that none is answered by the restarted server.
	sleep(ctx, perCall+200*time.Millisecond)
	if err := h.redis.start(); err != nil {
		res.err = "restarting Redis: " + err.Error()
		return res
	}
	back, err := h.redis.waitCommands(ctx, 30*time.Second)
	if err != nil {
		res.backErr = err.Error()
	}
	res.backAfter = back
	l.stop()
	calls, classes, lat, _ := l.summary(phaseMeasure)
	res.calls, res.classes, res.length = calls, classes, l.ends[phaseMeasure].Sub(l.starts[phaseMeasure])
	res.p50, res.p99 = percentile(lat, 0.5), percentile(lat, 0.99)
	if r.exited() {
		res.err = "the service exited" + logTail(r.logPath)
	}
	return res
}
