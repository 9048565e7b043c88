package redisbackend_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// BenchmarkScriptCost measures what a decision costs on the Redis thread:
// the time Redis spends in EVALSHA (INFO commandstats, usec), read before
// and after a fixed workload and divided by the decisions it carried,
// reported as "redis-µs/decision". Client time and round trips fall
// outside it, but not the machine's other load: a Redis thread taken off
// its core in the middle of a call counts the wait as script time. So it
// also reports "redis-cpu-µs/decision", the CPU time of Redis's main
// thread (INFO cpu) over the same workload, which a busy machine inflates
// far less, though it includes reading and answering each call. On a
// shared machine compare two builds by running them in turn (A, B, A, B)
// and reading ratios, never one figure alone.
//
// Each iteration runs one workload over 10,000 identifiers that a warm-up
// pass has already touched once (the steady state, where a key exists and
// its expiry is mostly left alone):
//
//	batched-*  200 calls of the policy shape's batch script, 100 decisions
//	           each, laid out as WithBatching lays them out
//	lone-*     20,000 calls of the shape's lone script (WithoutBatching, 8
//	           goroutines)
//	reference  20,000 calls of a script that does what ulule's limiter does
//	           per request (INCR, PEXPIRE on the first, PTTL): a yardstick
//	           for one decision of one fixed window
//
// and the policies: fixed, 1000 per minute in a fixed window (the default
// algorithm); three, 100 per second, 1000 per minute and 10,000 per hour;
// gcra and sliding, 1000 per minute with that algorithm.
//
// Run it with -benchtime=1x (one workload) or a few x; the metric does not
// depend on b.N.
func BenchmarkScriptCost(b *testing.B) {
	policies := []struct{ name, spec string }{
		{"fixed", "1000/min"},
		{"three", "100/s, 1000/min, 10000/h"},
		{"gcra", "1000/min gcra"},
		{"sliding", "1000/min sliding"},
	}
	for _, batched := range []bool{true, false} {
		for _, pc := range policies {
			kind := "lone"
			if batched {
				kind = "batched"
			}
			b.Run(kind+"-"+pc.name, func(b *testing.B) {
				p := testkit.Compiled(b, "cost-"+pc.name, pc.spec)
				scriptCost(b, func(ctx context.Context, _ *goredis.Client, be *redisbackend.Backend, reqs []driver.Request) error {
					if !batched {
						return decideLone(ctx, be, reqs)
					}
					for len(reqs) > 0 {
						n := min(len(reqs), costBatch)
						_, errs, err := be.DecideManyShaped(ctx, reqs[:n])
						if err != nil {
							return err
						}
						for _, err := range errs {
							if err != nil {
								return err
							}
						}
						reqs = reqs[n:]
					}
					return nil
				}, p)
			})
		}
	}
	b.Run("reference", func(b *testing.B) {
		// ulule's per-request work, written here as a script of its own:
		// count in a plain string, start its expiry with the first unit, and
		// return the count and the time left.
		script := goredis.NewScript(`local v = redis.call('INCR', KEYS[1])
if v == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return {v, redis.call('PTTL', KEYS[1])}`)
		scriptCost(b, func(ctx context.Context, c *goredis.Client, _ *redisbackend.Backend, reqs []driver.Request) error {
			return inParallel(reqs, func(req driver.Request) error {
				return script.Run(ctx, c, []string{"ref:{" + req.Identifier + "}"}, 60_000).Err()
			})
		}, testkit.Compiled(b, "cost-reference", "1000/min"))
	})
}

// emptiedServer returns a client of the benchmarks' server, emptied so that
// every sub-benchmark starts alike, and an unbatched backend over it.
func emptiedServer(b *testing.B) (*goredis.Client, *redisbackend.Backend) {
	c := newClient(b, benchRedis(b).Addr())
	if err := c.FlushAll(context.Background()).Err(); err != nil {
		b.Fatal(err)
	}
	be, err := redisbackend.New(c, redisbackend.WithoutBatching())
	if err != nil {
		b.Fatal(err)
	}
	return c, be
}

const (
	costIdentifiers = 10_000
	costBatch       = 100
	costDecisions   = 200 * costBatch
)

// scriptCost runs decide over a warm-up pass and then, b.N times, over
// the measured workload, and reports the Redis time per decision. The
// server is emptied first, so that every sub-benchmark starts alike.
func scriptCost(b *testing.B, decide func(context.Context, *goredis.Client, *redisbackend.Backend, []driver.Request) error, p *driver.Policy) {
	ctx := context.Background()
	c, be := emptiedServer(b)
	// Decisions 50 µs apart, from a whole minute on: every one is allowed
	// (an identifier gets two or three per window of the tightest limit).
	now := testkit.T0.Truncate(time.Minute)
	workload := func(n int) []driver.Request {
		reqs := make([]driver.Request, n)
		for i := range reqs {
			reqs[i] = driver.Request{Policy: p, Identifier: fmt.Sprint("user:", (i*7919)%costIdentifiers), Cost: 1, Now: now}
			now = now.Add(50 * time.Microsecond)
		}
		return reqs
	}
	if err := decide(ctx, c, be, workload(costIdentifiers)); err != nil {
		b.Fatal(err)
	}
	var usec, calls int64
	var cpu float64
	b.ResetTimer()
	for range b.N {
		reqs := workload(costDecisions)
		before, err := evalStats(ctx, c)
		if err != nil {
			b.Fatal(err)
		}
		if err := decide(ctx, c, be, reqs); err != nil {
			b.Fatal(err)
		}
		after, err := evalStats(ctx, c)
		if err != nil {
			b.Fatal(err)
		}
		usec += after.usec - before.usec
		calls += after.calls - before.calls
		cpu += after.cpu - before.cpu
	}
	b.StopTimer()
	decisions := float64(b.N * costDecisions)
	b.ReportMetric(float64(usec)/decisions, "redis-µs/decision")
	b.ReportMetric(float64(usec)/float64(calls), "redis-µs/call")
	b.ReportMetric(cpu*1e6/decisions, "redis-cpu-µs/decision")
}

// decideLone decides reqs one call of decide.lua each, from 8 goroutines.
func decideLone(ctx context.Context, be *redisbackend.Backend, reqs []driver.Request) error {
	return inParallel(reqs, func(req driver.Request) error {
		out, err := be.Decide(ctx, req)
		if err == nil && !out.Allowed {
			err = fmt.Errorf("%s denied", req.Identifier)
		}
		return err
	})
}

// inParallel runs f on every request from 8 goroutines, and returns the
// first error.
func inParallel(reqs []driver.Request, f func(driver.Request) error) error {
	const goroutines = 8
	errs := make([]error, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < len(reqs); i += goroutines {
				if err := f(reqs[i]); err != nil {
					errs[g] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// scriptStats is the commandstats line of EVALSHA and EVAL, summed, and the
// CPU time of Redis's main thread in seconds, user and system.
type scriptStats struct {
	calls, usec int64
	cpu         float64
}

func evalStats(ctx context.Context, c *goredis.Client) (scriptStats, error) {
	info, err := c.Info(ctx, "commandstats", "cpu").Result()
	if err != nil {
		return scriptStats{}, err
	}
	var s scriptStats
	for _, line := range strings.Split(info, "\n") {
		name, fields, ok := strings.Cut(strings.TrimSpace(line), ":")
		if name == "used_cpu_sys_main_thread" || name == "used_cpu_user_main_thread" {
			seconds, err := strconv.ParseFloat(fields, 64)
			if err != nil {
				return scriptStats{}, fmt.Errorf("INFO cpu: %s", line)
			}
			s.cpu += seconds
			continue
		}
		if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval") {
			continue
		}
		for _, f := range strings.Split(fields, ",") {
			k, v, _ := strings.Cut(f, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				s.calls += n
			case "usec":
				s.usec += n
			}
		}
	}
	return s, nil
}

// BenchmarkScriptBody is BenchmarkScriptCost's steadier twin for a loaded
// machine: it runs the script's body as a Lua function 10,000 times inside
// one EVAL (a lone script once per identifier; a batch script 100 times,
// 100 decisions each, its ARGV built in Lua per call), for the policy's
// shape script and, in the *-generic runs, for decide.lua and
// decide_many.lua, the generic scripts it is measured against, and reads the CPU time
// of Redis's main thread around the EVAL. The same loop around a body that
// does nothing is measured too and subtracted, and what is left is
// reported as "script-cpu-µs/decision": the work of the script alone,
// without the EVALSHA around it (parsing the call, making KEYS and ARGV,
// turning the reply into RESP, which BenchmarkScriptCost includes). A
// thread that waits for a core costs no CPU time, so the figure moves far
// less with the machine's load than script time does.
//
// Each iteration decides every identifier once, half a second after the
// previous iteration, under the policies of BenchmarkScriptCost; the first
// iteration, which creates the keys, is not counted. reference runs the
// ulule-equivalent script of BenchmarkScriptCost in the same loop.
func BenchmarkScriptBody(b *testing.B) {
	policies := []struct{ name, spec string }{
		{"fixed", "1000/min"},
		{"three", "100/s, 1000/min, 10000/h"},
		{"gcra", "1000/min gcra"},
		{"sliding", "1000/min sliding"},
	}
	const reference = `local k = 'ref:' .. KEYS[1]
local v = redis.call('INCR', k)
if v == 1 then redis.call('PEXPIRE', k, 60000) end
return {v, redis.call('PTTL', k)}`
	for _, many := range []bool{true, false} {
		for _, generic := range []bool{false, true} {
			for _, pc := range policies {
				kind := "lone-"
				if many {
					kind = "batched-"
				}
				if generic {
					pc.name += "-generic"
				}
				b.Run(kind+pc.name, func(b *testing.B) {
					p := testkit.Compiled(b, "body-"+pc.name, pc.spec)
					scriptBody(b, redisbackend.ScriptBody(many, generic, p), many, generic, p)
				})
			}
		}
	}
	b.Run("reference", func(b *testing.B) {
		scriptBody(b, reference, false, false, testkit.Compiled(b, "body-reference", "1000/min"))
	})
}

// loneLoop runs a decide.lua body once per identifier; ARGV is the real one.
const loneLoop = `local KEYS = {}
local function run()
%s
end
for i = 0, 9999 do
  KEYS[1] = 'body:{user:' .. i .. '}'
  local r = run()
  if type(r) ~= 'table' or r.err then return 'decision ' .. i .. ': ' .. tostring(r.err or r) end
end
return 'ok'`

// manyLoop runs a batch body 100 times, 100 decisions each. The real ARGV
// holds the batch's head (the grace, one policy), then now in ms and µs,
// then the form of a shape's batch script (newManyCall: 0, or 2 for a
// shape with GCRA), or -1 for decide_many.lua's layout.
const manyLoop = `local given = ARGV
local ARGV = {}
local function run()
%s
end
local head, now_ms, now_us, form = #given - 3, given[#given - 2], given[#given - 1], given[#given]
for b = 0, 99 do
  for k = 1, head do
    ARGV[k] = given[k]
  end
  local m = head + 1
  ARGV[m] = '100'
  if form ~= '-1' then
    m = m + 1
    ARGV[m] = form
  end
  for r = 0, 99 do
    local key = 'body:{user:' .. (b * 100 + r) .. '}'
    if form == '-1' then
      ARGV[m + 1], ARGV[m + 2], ARGV[m + 3], ARGV[m + 4], ARGV[m + 5] = '1', now_ms, now_us, '1', key
      m = m + 5
    elseif form == '2' then
      ARGV[m + 1], ARGV[m + 2], ARGV[m + 3] = now_ms, now_us, key
      m = m + 3
    else
      ARGV[m + 1], ARGV[m + 2] = now_ms, key
      m = m + 2
    end
  end
  local out = run()
  if type(out) ~= 'table' or #out < 200 then return 'batch ' .. b .. ': ' .. tostring(out.err or out) end
  for r = 1, #out do
    if type(out[r]) == 'table' then return 'batch ' .. b .. ': ' .. tostring(out[r].err) end
  end
end
return 'ok'`

// emptyLone and emptyMany are bodies that do nothing but answer.
const (
	emptyLone = `return {}`
	emptyMany = `local out = {} for i = 1, 200 do out[i] = 0 end return out`
)

func scriptBody(b *testing.B, body string, many, generic bool, p *driver.Policy) {
	ctx := context.Background()
	c, be := emptiedServer(b)
	loop, empty := loneLoop, emptyLone
	if many {
		loop, empty = manyLoop, emptyMany
	}
	now := testkit.T0.Truncate(time.Minute)
	args := func() []any {
		args := be.ScriptArgs(driver.Request{Policy: p, Identifier: "x", Cost: 1, Now: now})
		if many { // the batch's head: the grace, one policy; then now, and the form
			form := -1
			if !generic {
				form = 0
				if slices.ContainsFunc(p.Limits, func(l driver.Limit) bool { return l.Algorithm == driver.GCRA }) {
					form = 2
				}
			}
			args = append(append([]any{args[3], 1}, args[4:]...), args[0], args[1], form)
		}
		now = now.Add(500 * time.Millisecond)
		return args
	}
	// cpu runs script once and returns the main thread's CPU time it took.
	cpu := func(script string) float64 {
		before, err := evalStats(ctx, c)
		if err != nil {
			b.Fatal(err)
		}
		reply, err := c.Eval(ctx, script, nil, args()...).Text()
		if err != nil || reply != "ok" {
			b.Fatalf("%q, %v", reply, err)
		}
		after, err := evalStats(ctx, c)
		if err != nil {
			b.Fatal(err)
		}
		return after.cpu - before.cpu
	}
	script, idle := fmt.Sprintf(loop, body), fmt.Sprintf(loop, empty)
	cpu(script) // creates the keys
	var spent float64
	b.ResetTimer()
	for range b.N {
		spent += cpu(script) - cpu(idle)
	}
	b.StopTimer()
	b.ReportMetric(spent*1e6/float64(b.N*costIdentifiers), "script-cpu-µs/decision")
}
