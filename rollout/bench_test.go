package rollout

import (
	"context"
	"testing"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

// BenchmarkDecide measures one decision through the rollout layer over
// memory backends against the bare memory backend, for each mode and both
// flag sources, at 50%. The overhead of the layer in split mode is the
// difference from "bare"; mirror and shadow make a second backend call by
// design.
func BenchmarkDecide(b *testing.B) {
	flags := newFlagServer(b, 50)
	unleashSrc := newTestUnleashSource(b, flags)
	waitPercent(b, unleashSrc, 50)
	static := mustStatic(b, 50)
	policy := mustPolicy(b, "bench", "1000000000/h")
	idents := ids(1024)
	ctx := context.Background()

	run := func(b *testing.B, backend throttler.Backend) {
		req := throttler.Request{Policy: policy, Cost: 1, Now: t0}
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			req.Identifier = idents[i&1023]
			if _, err := backend.Decide(ctx, req); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.Run("bare", func(b *testing.B) { run(b, memory.New()) })
	for _, src := range []struct {
		name string
		src  FlagSource
	}{{"static", static}, {"unleash", unleashSrc}} {
		for _, mode := range []Mode{SplitMode, MirrorMode, ShadowMode} {
			b.Run(mode.String()+"-"+src.name, func(b *testing.B) {
				run(b, mustRollout(b, memory.New(), memory.New(), src.src, WithMode(mode)))
			})
		}
	}
}

// BenchmarkDecideParallel is BenchmarkDecide's split mode from every
// processor at once: the flag lookup must add no contention.
func BenchmarkDecideParallel(b *testing.B) {
	flags := newFlagServer(b, 50)
	unleashSrc := newTestUnleashSource(b, flags)
	waitPercent(b, unleashSrc, 50)
	policy := mustPolicy(b, "bench", "1000000000/h")
	idents := ids(1024)
	ctx := context.Background()
	run := func(b *testing.B, backend throttler.Backend) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			req := throttler.Request{Policy: policy, Cost: 1, Now: t0}
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
	b.Run("bare", func(b *testing.B) { run(b, memory.New()) })
	b.Run("split-unleash", func(b *testing.B) {
		run(b, mustRollout(b, memory.New(), memory.New(), unleashSrc))
	})
}

// BenchmarkSide is the routing alone: one atomic load and one murmur3 hash.
func BenchmarkSide(b *testing.B) {
	flags := newFlagServer(b, 50)
	unleashSrc := newTestUnleashSource(b, flags)
	waitPercent(b, unleashSrc, 50)
	idents := ids(1024)
	for _, src := range []struct {
		name string
		src  FlagSource
	}{{"static", mustStatic(b, 50)}, {"unleash", unleashSrc}} {
		rb := mustRollout(b, memory.New(), memory.New(), src.src)
		b.Run(src.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				_ = rb.Side(idents[i&1023])
			}
		})
	}
}
