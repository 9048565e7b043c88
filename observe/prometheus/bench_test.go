package promobserver_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
	promobserver "github.com/throttlekit/throttlekit/observe/prometheus"
	"github.com/throttlekit/throttlekit/throttler"
)

// BenchmarkObserve measures what the collector adds to a decision: the
// bare throttler over the memory backend beside the same throttler
// observed by a registered Collector, serially and from 64 goroutines, on
// 10,000 identifiers under a limit they do not reach. Compare ns/op and
// allocs/op between the pairs.
func BenchmarkObserve(b *testing.B) {
	ids := make([]string, 10000)
	for i := range ids {
		ids[i] = "user:" + strconv.Itoa(i)
	}
	p := testkit.Policy(b, "api", "1000000/min")
	for _, bc := range []struct {
		name     string
		observed bool
	}{{"bare", false}, {"collector", true}} {
		opts := []throttler.Option{throttler.WithLogger(nil)}
		if bc.observed {
			c, err := promobserver.New()
			if err != nil {
				b.Fatal(err)
			}
			prometheus.NewRegistry().MustRegister(c)
			opts = append(opts, throttler.WithObserver(c))
		}
		b.Run(bc.name+"/serial", func(b *testing.B) {
			th := testkit.Throttler(b, memorybackend.New(), opts...)
			ctx := context.Background()
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if _, err := th.Allow(ctx, p, ids[i%len(ids)]); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(bc.name+"/parallel64", func(b *testing.B) {
			th := testkit.Throttler(b, memorybackend.New(), opts...)
			ctx := context.Background()
			b.ReportAllocs()
			b.SetParallelism(32) // 64 goroutines on 2 CPUs
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
