package memorybackend_test

import (
	"context"
	"fmt"
	"time"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

func Example() {
	ctx := context.Background()
	clock := throttlertest.NewManualClock(time.Date(2030, 1, 2, 3, 4, 0, 0, time.UTC))
	th, err := throttler.New(memorybackend.New(), throttler.WithClock(clock))
	if err != nil {
		fmt.Println(err)
		return
	}
	policy, err := throttler.ParsePolicy("api", "3/min, 10/h")
	if err != nil {
		fmt.Println(err)
		return
	}
	for i := 0; i < 4; i++ {
		r, err := th.Allow(ctx, policy, "user:42")
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("allowed=%v remaining=%d binding=%s reset=%s retry=%v\n",
			r.Allowed, r.Remaining, r.Binding, r.ResetAt.Format("15:04:05"), r.RetryAfter)
		clock.Advance(10 * time.Second)
	}
	// Output:
	// allowed=true remaining=2 binding=3/min reset=03:05:00 retry=0s
	// allowed=true remaining=1 binding=3/min reset=03:05:00 retry=0s
	// allowed=true remaining=0 binding=3/min reset=03:05:00 retry=0s
	// allowed=false remaining=0 binding=3/min reset=03:05:00 retry=30s
}
