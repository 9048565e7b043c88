package debugpage_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
	debugpage "github.com/throttlekit/throttlekit/observe/debug"
	"github.com/throttlekit/throttlekit/throttler"
)

func benchIDs() []string {
	ids := make([]string, 10000)
	for i := range ids {
		ids[i] = "user:" + strconv.Itoa(i)
	}
	return ids
}

// BenchmarkObserve: the observer's own cost per decision, called directly
// with the Event a throttler passes: allowed (nothing recorded); denied,
// hot (50 identifiers, each holding a counter: an increment); denied,
// churn (10,000 identifiers through the default 100 counters: nearly every
// denial takes over a counter and copies its identifier). On one
// goroutine and from many.
func BenchmarkObserve(b *testing.B) {
	all := benchIDs()
	at := testkit.T0
	for _, bc := range []struct {
		name    string
		allowed bool
		ids     []string
	}{{"allowed", true, all}, {"denied-hot", false, all[:50]}, {"denied-churn", false, all}} {
		ids := bc.ids
		for _, parallel := range []bool{false, true} {
			name := bc.name + "/serial"
			if parallel {
				name = bc.name + "/parallel"
			}
			b.Run(name, func(b *testing.B) {
				page, err := debugpage.New()
				if err != nil {
					b.Fatal(err)
				}
				obs := page.Observer()
				ctx := context.Background()
				event := func(i int) throttler.Event {
					return throttler.Event{Op: "allow", Policy: "api", Identifier: ids[i%len(ids)], Backend: "memory",
						Result: throttler.Result{Allowed: bc.allowed, Limit: 10, At: at, RetryAfter: time.Second}}
				}
				b.ReportAllocs()
				if !parallel {
					for i := 0; b.Loop(); i += 7 {
						obs.Observe(ctx, event(i))
					}
					return
				}
				b.RunParallel(func(pb *testing.PB) {
					for i := 0; pb.Next(); i += 7 {
						obs.Observe(ctx, event(i))
					}
				})
			})
		}
	}
}

// BenchmarkObserver: what the page's observer adds to a whole decision,
// allowed (10,000 identifiers under a limit they do not reach) and denied
// (10,000 identifiers over a limit of 1), from many goroutines: beside the
// bare throttler, and beside one with an observer that does nothing (the
// throttler's own cost of telling an observer).
func BenchmarkObserver(b *testing.B) {
	ids := benchIDs()
	noop := throttler.ObserverFunc(func(context.Context, throttler.Event) {})
	for _, bc := range []struct{ name, spec string }{{"allowed", "1000000000/h"}, {"denied", "1/h"}} {
		for _, with := range []string{"bare", "noop", "page"} {
			opts := []throttler.Option{throttler.WithLogger(nil)}
			switch with {
			case "noop":
				opts = append(opts, throttler.WithObserver(noop))
			case "page":
				page, err := debugpage.New()
				if err != nil {
					b.Fatal(err)
				}
				opts = append(opts, throttler.WithObserver(page.Observer()))
			}
			b.Run(bc.name+"/"+with, func(b *testing.B) {
				p := testkit.Policy(b, "api", bc.spec)
				th := testkit.Throttler(b, memorybackend.New(), opts...)
				ctx := context.Background()
				for _, id := range ids { // spend the 1/h limits first
					if _, err := th.Allow(ctx, p, id); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportAllocs()
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					for i := 0; pb.Next(); i += 7 {
						if _, err := th.Allow(ctx, p, ids[i%len(ids)]); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}
