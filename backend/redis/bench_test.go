package redisbackend_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/conformance"
	"github.com/throttlekit/throttlekit/internal/localserver"
)

// benchServer is a standalone Redis without a replica, for benchmarks.
var benchServer sharedServer[*localserver.Redis]

func benchRedis(tb testing.TB) *localserver.Redis {
	localserver.SkipIfShort(tb)
	return benchServer.get(tb, "starting redis-server", func() (*localserver.Redis, func() error, error) {
		r, err := localserver.StartRedis(localserver.RedisOptions{})
		if err != nil {
			return nil, nil, err
		}
		return r, r.Close, nil
	})
}

// BenchmarkConformance runs the suite's benchmarks (1, 16 and 64
// goroutines; one hot identifier, 10,000 identifiers, a three-limit policy,
// peeks) on a local server: with the default options (batching on), without
// batching, and through go-redis's auto-pipeliner. Compare decisions/s
// between them, not across machines.
func BenchmarkConformance(b *testing.B) {
	// The client is configured as the package docs recommend:
	// ContextTimeoutEnabled lets go-redis honour the per-call timeout on the
	// caller's goroutine. Without it the backend waits on a goroutine of its
	// own per call ("-detached"), which costs CPU a 2-core machine shows.
	for _, variant := range []struct {
		name    string
		timeout bool
		opts    []redisbackend.Option
	}{
		{"default", true, nil},
		{"default-detached", false, nil},
		{"unbatched", true, []redisbackend.Option{redisbackend.WithoutBatching()}},
	} {
		b.Run(variant.name, func(b *testing.B) {
			conformance.RunBenchmarks(b, harnessMaker(func(tb testing.TB) func() (redisbackend.Client, func() error) {
				addr := benchRedis(tb).Addr()
				return func() (redisbackend.Client, func() error) {
					c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: variant.timeout, PoolSize: 64})
					return c, c.Close
				}
			}, variant.opts...))
		})
	}
	b.Run("autopipeline", func(b *testing.B) {
		conformance.RunBenchmarks(b, harnessMaker(func(tb testing.TB) func() (redisbackend.Client, func() error) {
			addr := benchRedis(tb).Addr()
			return func() (redisbackend.Client, func() error) {
				c := goredis.NewClient(&goredis.Options{Addr: addr})
				ap, err := c.AutoPipeline()
				if err != nil {
					tb.Fatal(err)
				}
				return ap, c.Close
			}
		}))
	})
}

// BenchmarkRawScript is the yardstick for BenchmarkConformance on the same
// machine and run: one EVALSHA of a minimal script (GET, then SET with PX)
// per decision over 10,000 keys, straight through go-redis, with no
// throttler, no arguments and nothing to parse. No Lua limiter can beat
// it; the ratio of BenchmarkConformance's ManyIdentifiers to it is the cost
// of everything this package and the throttler do.
func BenchmarkRawScript(b *testing.B) {
	script := goredis.NewScript("local v = redis.call('GET', KEYS[1]) " +
		"redis.call('SET', KEYS[1], '1:2', 'PX', 60000) return {1, 1, 2}")
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = fmt.Sprintf("raw:{user:%d}", i)
	}
	for _, kind := range []string{"plain", "autopipeline"} {
		for _, goroutines := range []int{1, 16, 64} {
			b.Run(fmt.Sprintf("%s/goroutines=%d", kind, goroutines), func(b *testing.B) {
				c := newClient(b, benchRedis(b).Addr())
				var client goredis.Scripter = c
				if kind == "autopipeline" {
					client = newAutoPipeliner(b, c)
				}
				ctx := context.Background()
				var failed atomic.Int64
				var wg sync.WaitGroup
				b.ResetTimer()
				for g := range goroutines {
					n := b.N / goroutines
					if g < b.N%goroutines {
						n++
					}
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := range n {
							if err := script.Run(ctx, client, keys[(g*7919+i)%len(keys):][:1]).Err(); err != nil {
								failed.Add(1)
							}
						}
					}()
				}
				wg.Wait()
				b.StopTimer()
				if n := failed.Load(); n > 0 {
					b.Fatalf("%d of %d calls failed", n, b.N)
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
			})
		}
	}
}
