package throttler_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

func ExampleParsePolicy() {
	p, err := throttler.ParsePolicy("search", "10/s, 30/min aligned, 5000/h gcra burst=100")
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, l := range p.Limits() {
		fmt.Printf("%-22s max=%d window=%v algorithm=%v\n", l.Name, l.Max, l.Window, l.Algorithm)
	}
	_, err = throttler.ParsePolicy("search", "10/fortnight")
	fmt.Println(errors.Is(err, throttler.ErrInvalidLimit))
	// Output:
	// 10/s                   max=10 window=1s algorithm=fixed
	// 30/min aligned         max=30 window=1m0s algorithm=aligned
	// 5000/h gcra burst=100  max=5000 window=1h0m0s algorithm=gcra
	// true
}

func ExampleThrottler_AllowN() {
	ctx := context.Background()
	clock := throttlertest.NewManualClock(time.Date(2030, 1, 2, 3, 4, 0, 0, time.UTC))
	th, _ := throttler.New(memorybackend.New(), throttler.WithClock(clock))
	p, _ := throttler.ParsePolicy("upload", "10/min")

	r, _ := th.AllowN(ctx, p, "user:42", 7)
	fmt.Println(r.Allowed, r.Remaining, r.ResetAt.Format(time.TimeOnly))
	clock.Advance(20 * time.Second)
	r, _ = th.AllowN(ctx, p, "user:42", 4) // 7 + 4 > 10: denied, nothing consumed
	fmt.Println(r.Allowed, r.Remaining, r.RetryAfter)
	r, _ = th.AllowN(ctx, p, "user:42", 3)
	fmt.Println(r.Allowed, r.Remaining, r.ResetAt.Format(time.TimeOnly))

	// A cost no window can hold is told apart from an ordinary denial.
	r, err := th.AllowN(ctx, p, "user:42", 11)
	fmt.Println(r.Allowed, r.NeverAllowed, r.RetryAfter == throttler.Never, errors.Is(err, throttler.ErrCostExceedsLimit))
	// Output:
	// true 3 03:05:00
	// false 3 40s
	// true 0 03:05:00
	// false true true true
}

func ExampleThrottler_Refund() {
	ctx := context.Background()
	clock := throttlertest.NewManualClock(time.Date(2030, 1, 2, 3, 4, 0, 0, time.UTC))
	th, _ := throttler.New(memorybackend.New(), throttler.WithClock(clock))
	p, _ := throttler.ParsePolicy("api", "5000/h")

	// Charge when the request starts...
	r, _ := th.Allow(ctx, p, "user:42")
	fmt.Println("charged, remaining", r.Remaining)
	// ...and give the unit back when the answer is 304 Not Modified.
	r, _ = th.Refund(ctx, p, "user:42", 1)
	fmt.Println("refunded, remaining", r.Remaining)
	// Output:
	// charged, remaining 4999
	// refunded, remaining 5000
}

func ExampleLimit_gcra() {
	ctx := context.Background()
	clock := throttlertest.NewManualClock(time.Date(2030, 1, 2, 3, 4, 0, 0, time.UTC))
	th, _ := throttler.New(memorybackend.New(), throttler.WithClock(clock))
	// A smooth 1 per second with bursts of up to 3.
	p, _ := throttler.NewPolicy("gcra", []throttler.Limit{{Max: 1, Window: time.Second, Algorithm: throttler.GCRA, Burst: 3}})
	for i := 0; i < 4; i++ {
		r, _ := th.Allow(ctx, p, "device:7")
		fmt.Println(r.Allowed, r.Remaining, r.RetryAfter)
	}
	clock.Advance(time.Second)
	r, _ := th.Allow(ctx, p, "device:7")
	fmt.Println(r.Allowed, r.Remaining, r.ResetAt.Sub(clock.Now()))
	// Output:
	// true 2 0s
	// true 1 0s
	// true 0 0s
	// false 0 1s
	// true 0 3s
}

func ExampleWithFailureMode() {
	ctx := context.Background()
	down := backendFunc(func(context.Context, driver.Request) (driver.Outcome, error) {
		return driver.Outcome{}, errors.New("connection refused")
	})
	// Fail open by default; logins fail closed.
	th, _ := throttler.New(down, throttler.WithLogger(nil))
	open, _ := throttler.ParsePolicy("reads", "100/min")
	closed, _ := throttler.ParsePolicy("logins", "5/min", throttler.WithFailureMode(throttler.FailClosed))

	r, _ := th.Allow(ctx, open, "user:42")
	fmt.Println("reads:", r.Allowed, r.Degraded, errors.Is(r.Err, throttler.ErrBackend))
	r, _ = th.Allow(ctx, closed, "user:42")
	fmt.Println("logins:", r.Allowed, r.Degraded, r.RetryAfter)
	// Output:
	// reads: true true true
	// logins: false true 1s
}

type backendFunc func(context.Context, driver.Request) (driver.Outcome, error)

func (f backendFunc) Decide(ctx context.Context, r driver.Request) (driver.Outcome, error) {
	return f(ctx, r)
}

func ExampleThrottler_Acquire() {
	ctx := context.Background()
	clock := throttlertest.NewManualClock(time.Date(2030, 1, 2, 3, 4, 0, 0, time.UTC))
	th, _ := throttler.New(memorybackend.New(), throttler.WithClock(clock))
	uploads, _ := throttler.NewConcurrencyLimit("uploads", 2, time.Minute)

	a, _ := th.Acquire(ctx, uploads, "user:42")
	b, _ := th.Acquire(ctx, uploads, "user:42")
	fmt.Println(a.Acquired, b.Acquired, b.InFlight)
	c, _ := th.Acquire(ctx, uploads, "user:42") // two in flight already
	fmt.Println(c.Acquired, c.InFlight, c.RetryAfter)

	clock.Advance(10 * time.Second)
	_ = a.Release(ctx) // frees a slot at once
	d, _ := th.Acquire(ctx, uploads, "user:42")
	fmt.Println(d.Acquired)

	// b is never released, as if its process had crashed: it stops
	// counting once its lease expires.
	clock.Advance(50 * time.Second)
	e, _ := th.Acquire(ctx, uploads, "user:42")
	fmt.Println(e.Acquired, e.InFlight)
	// Output:
	// true true 2
	// false 2 1m0s
	// true
	// true 2
}
