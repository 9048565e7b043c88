package debugpage_test

import (
	"context"
	"strconv"
	"testing"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
	debugpage "github.com/throttlekit/throttlekit/observe/debug"
	"github.com/throttlekit/throttlekit/throttler"
)

// BenchmarkObserver: what the page's observer adds to a decision, allowed
// (10,000 identifiers under a limit they do not reach) and denied (10,000
// identifiers over a limit of 1), beside the bare throttler, from 64
// goroutines.
func BenchmarkObserver(b *testing.B) {
	ids := make([]string, 10000)
	for i := range ids {
		ids[i] = "user:" + strconv.Itoa(i)
	}
	for _, bc := range []struct{ name, spec string }{{"allowed", "1000000000/h"}, {"denied", "1/h"}} {
		for _, observed := range []bool{false, true} {
			name := bc.name + "/bare"
			opts := []throttler.Option{throttler.WithLogger(nil)}
			if observed {
				name = bc.name + "/page"
				page, err := debugpage.New()
				if err != nil {
					b.Fatal(err)
				}
				opts = append(opts, throttler.WithObserver(page.Observer()))
			}
			b.Run(name, func(b *testing.B) {
				p := testkit.Policy(b, "api", bc.spec)
				th := testkit.Throttler(b, memorybackend.New(), opts...)
				ctx := context.Background()
				for _, id := range ids { // spend the 1/h limits first
					if _, err := th.Allow(ctx, p, id); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportAllocs()
				b.SetParallelism(32)
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
}
