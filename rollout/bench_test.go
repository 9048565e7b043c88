package rollout

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	memcachedbackend "github.com/throttlekit/throttlekit/backend/memcached"
	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/internal/localserver"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// BenchmarkDecide measures one decision through the rollout layer over
// memory backends against the bare memory backend, for each mode and a
// static flag source at 50% (the Unleash source is one atomic load too),
// in the steady state: the Backend has watched the flag for longer than
// the policy's horizon, so split mode looks across for nothing. The
// overhead of the layer in split mode is the difference from "bare";
// mirror and shadow make a second backend call by design.
// "split-first-horizon" is split mode during the horizon after the process
// started, when each decision consults the seed memory.
func BenchmarkDecide(b *testing.B) {
	static := mustStatic(b, 50)
	policy := mustPolicy(b, "bench", "1000000000/h")
	idents := ids(1024)
	ctx := context.Background()

	run := func(b *testing.B, backend driver.Backend, now time.Time) {
		req := driver.Request{Policy: testkit.Compile(b, policy), Cost: 1, Now: t0}
		// The first decision starts the Backend's watch of the flag.
		if _, err := backend.Decide(ctx, req); err != nil {
			b.Fatal(err)
		}
		req.Now = now
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			req.Identifier = idents[i&1023]
			if _, err := backend.Decide(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
	}
	steady := t0.Add(2 * time.Hour) // past the hour-long policy's horizon
	b.Run("bare", func(b *testing.B) { run(b, memorybackend.New(), steady) })
	for _, src := range []struct {
		name string
		src  FlagSource
	}{{"static", static}} {
		for _, mode := range []Mode{SplitMode, MirrorMode, ShadowMode} {
			b.Run(mode.String()+"-"+src.name, func(b *testing.B) {
				run(b, mustRollout(b, memorybackend.New(), memorybackend.New(), src.src, WithMode(mode)), steady)
			})
		}
	}
	b.Run("split-first-horizon", func(b *testing.B) {
		run(b, mustRollout(b, memorybackend.New(), memorybackend.New(), static), t0)
	})
}

// BenchmarkDecideParallel is BenchmarkDecide's split mode from every
// processor at once: the flag lookup must add no contention.
func BenchmarkDecideParallel(b *testing.B) {
	policy := mustPolicy(b, "bench", "1000000000/h")
	idents := ids(1024)
	ctx := context.Background()
	run := func(b *testing.B, backend driver.Backend) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			req := driver.Request{Policy: testkit.Compile(b, policy), Cost: 1, Now: t0}
			i := 0
			for pb.Next() {
				req.Identifier = idents[i&1023]
				i++
				if _, err := backend.Decide(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("bare", func(b *testing.B) { run(b, memorybackend.New()) })
	b.Run("split-static", func(b *testing.B) {
		run(b, mustRollout(b, memorybackend.New(), memorybackend.New(), mustStatic(b, 50)))
	})
}

// BenchmarkSide is the routing alone: one atomic load and one murmur3 hash.
func BenchmarkSide(b *testing.B) {
	idents := ids(1024)
	for _, src := range []struct {
		name string
		src  FlagSource
	}{{"static", mustStatic(b, 50)}} {
		rb := mustRollout(b, memorybackend.New(), memorybackend.New(), src.src)
		b.Run(src.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				_ = rb.Side(idents[i&1023])
			}
		})
	}
}

// BenchmarkMigrationCost is what a migration costs a decision on real
// servers (memcached old, Redis new), 64 goroutines at once: the new store
// alone ("plain"), split mode once identifiers have been carried over
// ("split-steady"), split mode carrying every identifier over as it meets
// it, the old store holding a live window for each ("split-seeding"), and
// mirror mode writing every decision's states to the other store
// ("mirror"). Compare decisions/s within one run.
func BenchmarkMigrationCost(b *testing.B) {
	mc := localserver.MemcachedT(b, localserver.MemcachedOptions{})
	rd := localserver.RedisT(b, localserver.RedisOptions{})
	mcClient, err := memcachedbackend.NewClient(time.Second, mc.Addr())
	require.NoError(b, err)
	oldB, err := memcachedbackend.New(mcClient, memcachedbackend.WithPrefix("bench"))
	require.NoError(b, err)
	rdClient := goredis.NewClient(&goredis.Options{Addr: rd.Addr(), PoolSize: 64})
	b.Cleanup(func() { _ = rdClient.Close() })
	newB, err := redisbackend.New(rdClient, redisbackend.WithPrefix("bench:"))
	require.NoError(b, err)
	policy := mustPolicy(b, "bench", "1000000/min")
	compiled := testkit.Compile(b, policy)
	ctx := context.Background()
	var next atomic.Int64

	run := func(b *testing.B, backend driver.Backend, id func(i int64) string) {
		b.SetParallelism(32) // 64 goroutines on 2 cores
		b.ResetTimer()
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			req := driver.Request{Policy: compiled, Cost: 1}
			for pb.Next() {
				req.Identifier = id(next.Add(1))
				req.Now = t0.Add(time.Since(start))
				if _, err := backend.Decide(ctx, req); err != nil {
					b.Error(err)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "decisions/s")
	}
	steady := func(i int64) string { return ids(1024)[i&1023] }
	b.Run("plain", func(b *testing.B) { run(b, newB, steady) })
	b.Run("split-steady", func(b *testing.B) {
		run(b, mustRollout(b, oldB, newB, mustStatic(b, 100)), steady)
	})
	b.Run("split-seeding", func(b *testing.B) {
		// Every identifier has a live window on the old store and is met
		// for the first time on the new one.
		prefix := fmt.Sprintf("seed%d:", next.Add(1))
		for i := range b.N + 64*32 {
			_, err := oldB.Decide(ctx, driver.Request{Policy: compiled, Identifier: prefix + strconv.Itoa(i), Cost: 1, Now: t0})
			require.NoError(b, err)
		}
		first := next.Load()
		rb := mustRollout(b, oldB, newB, mustStatic(b, 100))
		run(b, rb, func(i int64) string { return prefix + strconv.FormatInt(i-first-1, 10) })
		b.ReportMetric(float64(rb.Stats().Seeded)/float64(b.N), "seeded/op")
	})
	b.Run("mirror", func(b *testing.B) {
		run(b, mustRollout(b, oldB, newB, mustStatic(b, 100), WithMode(MirrorMode)), steady)
	})
}
