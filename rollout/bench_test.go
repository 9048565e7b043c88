package rollout

import (
	"context"
	"testing"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// BenchmarkDecide measures one decision through the rollout layer over
// memory backends against the bare memory backend, for each mode and both
// static flag source, at 50% (the Unleash source is one atomic load too). The overhead of the layer in split mode is the
// difference from "bare"; mirror and shadow make a second backend call by
// design.
func BenchmarkDecide(b *testing.B) {
	static := mustStatic(b, 50)
	policy := mustPolicy(b, "bench", "1000000000/h")
	idents := ids(1024)
	ctx := context.Background()

	run := func(b *testing.B, backend driver.Backend) {
		req := driver.Request{Policy: testkit.Compile(b, policy), Cost: 1, Now: t0}
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			req.Identifier = idents[i&1023]
			if _, err := backend.Decide(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("bare", func(b *testing.B) { run(b, memorybackend.New()) })
	for _, src := range []struct {
		name string
		src  FlagSource
	}{{"static", static}} {
		for _, mode := range []Mode{SplitMode, MirrorMode, ShadowMode} {
			b.Run(mode.String()+"-"+src.name, func(b *testing.B) {
				run(b, mustRollout(b, memorybackend.New(), memorybackend.New(), src.src, WithMode(mode)))
			})
		}
	}
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
