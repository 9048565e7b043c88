// Command quickstart limits an HTTP handler in process: 3 requests a minute
// per client IP, with GitHub's and the IETF rate-limit headers.
package main

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/middleware"
	"github.com/throttlekit/throttlekit/throttler"
)

func main() {
	th, err := throttler.New(memorybackend.New()) // wall clock, fail open, 100 ms per backend call
	if err != nil {
		log.Fatal(err)
	}
	policy, err := throttler.ParsePolicy("core", "3/min, 5000/h")
	if err != nil {
		log.Fatal(err) // errors.Is(err, throttler.ErrInvalidLimit)
	}

	// Direct use: a denial is not an error.
	r, err := th.Allow(context.Background(), policy, "user:42")
	if err != nil {
		log.Fatal(err) // invalid input only
	}
	fmt.Println("direct:", r.Allowed, r.Remaining, r.Binding)

	// In front of handlers: X-RateLimit-*, RateLimit, RateLimit-Policy,
	// Retry-After and a 429 problem+json.
	limiter, err := middleware.New(th, []middleware.Rule{
		{Policy: policy, Identify: middleware.ClientIP(middleware.ClientIPOptions{})},
	})
	if err != nil {
		log.Fatal(err)
	}
	hello := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "hello") })

	// A real service would call http.ListenAndServe(addr, limiter.Handler(hello)).
	srv := httptest.NewServer(limiter.Handler(hello))
	defer srv.Close()
	for i := 0; i < 4; i++ {
		resp, err := http.Get(srv.URL)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println("http:", resp.StatusCode, "remaining", resp.Header.Get("X-RateLimit-Remaining"))
	}
}
