package skeleton_test

import (
	"context"
	"fmt"
	"time"

	skeleton "github.com/throttlekit/throttlekit/examples/skeleton-backend"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// A throttler over the skeleton store, on a manual clock.
func Example() {
	clock := throttlertest.NewManualClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	thr, err := throttler.New(skeleton.New(), throttler.WithClock(clock))
	if err != nil {
		panic(err)
	}
	p, err := throttler.NewPolicy("api", []throttler.Limit{throttler.PerMinute(2)})
	if err != nil {
		panic(err)
	}
	for range 3 {
		r, err := thr.Allow(context.Background(), p, "user:42")
		if err != nil {
			panic(err)
		}
		fmt.Printf("allowed=%v remaining=%d retry-after=%v\n", r.Allowed, r.Remaining, r.RetryAfter)
	}
	// Output:
	// allowed=true remaining=1 retry-after=0s
	// allowed=true remaining=0 retry-after=0s
	// allowed=false remaining=0 retry-after=1m0s
}
