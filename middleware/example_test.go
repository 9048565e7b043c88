package middleware_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/middleware"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// Example limits each client IP to 2 requests a minute and prints the
// headers of an allowed and of a denied request.
func Example() {
	clock := throttlertest.NewManualClock(time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC))
	th, err := throttler.New(memorybackend.New(), throttler.WithClock(clock))
	if err != nil {
		fmt.Println(err)
		return
	}
	policy, err := throttler.ParsePolicy("api", "2/min")
	if err != nil {
		panic(err)
	}
	lim, err := middleware.New(th, []middleware.Rule{
		{Policy: policy, Identify: middleware.ClientIP(middleware.ClientIPOptions{})},
	})
	if err != nil {
		panic(err)
	}
	api := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	}))

	// The header names as the specifications spell them; net/http
	// matches them case-insensitively.
	names := []string{
		middleware.HeaderLimit, middleware.HeaderRemaining, middleware.HeaderUsed, middleware.HeaderReset,
		middleware.HeaderResource, middleware.HeaderRateLimitPolicy, middleware.HeaderRateLimit,
		middleware.HeaderRetryAfter, middleware.HeaderDegraded,
	}
	show := func() {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.RemoteAddr = "203.0.113.9:50000"
		rec := httptest.NewRecorder()
		api.ServeHTTP(rec, req)
		fmt.Println(rec.Code)
		for _, name := range names {
			if v := rec.Header().Get(name); v != "" {
				fmt.Printf("  %s: %s\n", name, v)
			}
		}
		if rec.Code != http.StatusOK {
			fmt.Printf("  %s\n", rec.Body.String())
		}
	}

	show() // 12:00:00: opens the window, which ends at 12:01:00
	clock.Advance(20 * time.Second)
	show()
	clock.Advance(10*time.Second + 500*time.Millisecond)
	show() // 12:00:30.5: denied for 29.5 s, rounded up
	// Output:
	// 200
	//   X-RateLimit-Limit: 2
	//   X-RateLimit-Remaining: 1
	//   X-RateLimit-Used: 1
	//   X-RateLimit-Reset: 1735732860
	//   X-RateLimit-Resource: api
	//   RateLimit-Policy: "api";q=2;w=60
	//   RateLimit: "api";r=1;t=60
	// 200
	//   X-RateLimit-Limit: 2
	//   X-RateLimit-Remaining: 0
	//   X-RateLimit-Used: 2
	//   X-RateLimit-Reset: 1735732860
	//   X-RateLimit-Resource: api
	//   RateLimit-Policy: "api";q=2;w=60
	//   RateLimit: "api";r=0;t=40
	// 429
	//   X-RateLimit-Limit: 2
	//   X-RateLimit-Remaining: 0
	//   X-RateLimit-Used: 2
	//   X-RateLimit-Reset: 1735732860
	//   X-RateLimit-Resource: api
	//   RateLimit-Policy: "api";q=2;w=60
	//   RateLimit: "api";r=0;t=30
	//   Retry-After: 30
	//   {"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Quota Exceeded","status":429,"detail":"Quota \"api\" (2/min) is spent; try again in 30 s.","violated-policies":["api"]}
}

// ExampleWriteHeaders sets the rate-limit headers outside net/http
// middleware, as another framework's adapter would.
func ExampleWriteHeaders() {
	clock := throttlertest.NewManualClock(time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC))
	th, err := throttler.New(memorybackend.New(), throttler.WithClock(clock))
	if err != nil {
		panic(err)
	}
	policy, err := throttler.ParsePolicy("search", "2/s, 30/min")
	if err != nil {
		panic(err)
	}
	var r throttler.Result
	for range 3 {
		r, _ = th.Allow(context.Background(), policy, "token:42")
	}
	h := http.Header{}
	middleware.WriteHeaders(h, r, policy, middleware.HeaderOptions{})
	for _, name := range []string{middleware.HeaderRemaining, middleware.HeaderReset,
		middleware.HeaderRateLimitPolicy, middleware.HeaderRateLimit, middleware.HeaderRetryAfter} {
		fmt.Printf("%s: %s\n", name, h.Get(name))
	}
	// Output:
	// X-RateLimit-Remaining: 0
	// X-RateLimit-Reset: 1735732801
	// RateLimit-Policy: "search:2/s";q=2;w=1, "search:30/min";q=30;w=60
	// RateLimit: "search:2/s";r=0;t=1
	// Retry-After: 1
}
