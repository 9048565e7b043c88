// Command migrate-demo demonstrates a migration of limiter state between
// backends. Until the migration issue fills it in, it shows a short run of a
// throttler on the memory backend.
package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "migrate-demo:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx := context.Background()
	clock := throttler.NewManualClock(time.Date(2030, 1, 2, 3, 4, 0, 0, time.UTC))
	th := throttler.New(memory.New(), throttler.WithClock(clock))
	policy, err := throttler.ParsePolicy("api", "5/min, 20/h")
	if err != nil {
		return err
	}
	for i := 1; i <= 7; i++ {
		r, err := th.Allow(ctx, policy, "user:42")
		if err != nil {
			return err
		}
		fmt.Printf("request %d: allowed=%-5v remaining=%d reset=%s retry-after=%v\n",
			i, r.Allowed, r.Remaining, r.ResetAt.Format(time.TimeOnly), r.RetryAfter)
		clock.Advance(5 * time.Second)
	}
	return nil
}
