package throttler_test

import (
	"context"
	"strconv"
	"testing"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
)

// The in-process path: a throttler over the memory backend, 10,000
// identifiers, a limit no identifier reaches (1000/min, as in the peer
// comparison) or four limits. Parallel runs use 64 goroutines whatever the
// number of CPUs.
func BenchmarkAllowMemory(b *testing.B) {
	ids := make([]string, 10000)
	for i := range ids {
		ids[i] = "user:" + strconv.Itoa(i)
	}
	for _, bc := range []struct{ name, spec string }{
		{"1limit", "1000000/min"},
		{"4limits", "100000/s, 1000000/min, 10000000/h, 100000000/day"},
	} {
		p := testkit.Policy(b, "api", bc.spec)
		b.Run(bc.name+"/serial", func(b *testing.B) {
			th := testkit.Throttler(b, memorybackend.New())
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := th.Allow(ctx, p, ids[i%len(ids)]); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(bc.name+"/parallel64", func(b *testing.B) {
			th := testkit.Throttler(b, memorybackend.New())
			ctx := context.Background()
			b.ReportAllocs()
			b.SetParallelism(max(1, 64/runtimeGOMAXPROCS()))
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					if _, err := th.Allow(ctx, p, ids[i%len(ids)]); err != nil {
						b.Error(err)
						return
					}
					i += 7
				}
			})
		})
	}
}

// BenchmarkDecideInProcess is issue 21's in-process figure: one goroutine,
// a throttler over the memory backend with default options, 10,000
// identifiers round-robin, one limit or three (GitHub-style windows none
// reaches), in a bare loop. Compare it with a map of x/time/rate limiters
// behind a mutex measured the same way (the main module may not import
// it; see bench/ for the peer harness).
func BenchmarkDecideInProcess(b *testing.B) {
	ids := make([]string, 10000)
	for i := range ids {
		ids[i] = "user:" + strconv.Itoa(i)
	}
	for _, bc := range []struct{ name, spec string }{
		{"1limit", "1000000/min"},
		{"3limits", "10000/s, 600000/min, 5000000/h"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			p := testkit.Policy(b, "api", bc.spec)
			th := testkit.Throttler(b, memorybackend.New())
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				r, err := th.Allow(ctx, p, ids[i%len(ids)])
				if err != nil || !r.Allowed {
					b.Fatal(r, err)
				}
			}
		})
	}
}

var _ = throttler.Never
