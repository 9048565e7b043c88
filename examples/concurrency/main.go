// Command concurrency limits requests in flight rather than per window: at
// most one upload at a time per user, in process; the same code runs on
// Redis with redisbackend.New in place of memorybackend.New.
package main

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"time"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/middleware"
	"github.com/throttlekit/throttlekit/throttler"
)

func main() {
	ctx := context.Background()
	th, err := throttler.New(memorybackend.New())
	if err != nil {
		log.Fatal(err)
	}
	// One lease per user at a time; a lease its process never releases
	// (a crash) expires after a minute, so no slot leaks for longer.
	uploads, err := throttler.NewConcurrencyLimit("uploads", 1, time.Minute)
	if err != nil {
		log.Fatal(err) // errors.Is(err, throttler.ErrInvalidLimit)
	}

	// Direct use: a refusal is not an error.
	lease, err := th.Acquire(ctx, uploads, "user:42")
	if err != nil {
		log.Fatal(err) // invalid input, or a backend without leases (memcached): errors.ErrUnsupported
	}
	second, err := th.Acquire(ctx, uploads, "user:42")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("direct:", lease.Acquired, second.Acquired, second.InFlight)
	if err := lease.Release(ctx); err != nil {
		log.Println(err) // the store failed; the lease expires by its TTL
	}

	// In front of handlers: a lease for as long as the handler runs, 429
	// with Retry-After when the user already has one in flight.
	user := middleware.Header("X-User")
	limiter, err := middleware.New(th, nil, middleware.WithConcurrency(uploads, user))
	if err != nil {
		log.Fatal(err)
	}
	started, finish := make(chan struct{}), make(chan struct{})
	upload := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Has("slow") {
			close(started)
			<-finish
		}
		fmt.Fprintln(w, "stored")
	})
	srv := httptest.NewServer(limiter.Handler(upload))
	defer srv.Close()
	send := func(query string) {
		req, err := http.NewRequest(http.MethodPut, srv.URL+"/upload"+query, nil)
		if err != nil {
			log.Fatal(err)
		}
		req.Header.Set("X-User", "42")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println("http:", resp.StatusCode, "retry after", resp.Header.Get("Retry-After"))
	}

	done := make(chan struct{})
	go func() { send("?slow"); close(done) }()
	<-started
	send("") // the slow upload still holds the user's lease
	close(finish)
	<-done
	send("") // released when the slow upload finished
}
