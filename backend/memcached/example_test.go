package memcachedbackend_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	memcachedbackend "github.com/throttlekit/throttlekit/backend/memcached"
	"github.com/throttlekit/throttlekit/throttler"
)

// This example needs memcached servers, so it has no checked output.
func Example() {
	// Each round trip is bounded by 100 ms: gomemcache takes no context.
	client, err := memcachedbackend.NewClient(100*time.Millisecond, "127.0.0.1:11211", "127.0.0.1:11212")
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	backend, err := memcachedbackend.New(client, memcachedbackend.WithPrefix("api"))
	if err != nil {
		log.Fatal(err)
	}
	th, err := throttler.New(backend)
	if err != nil {
		log.Fatal(err)
	}
	policy, err := throttler.ParsePolicy("authenticated", "10/s, 5000/h")
	if err != nil {
		log.Fatal(err)
	}

	r, err := th.Allow(context.Background(), policy, "user:42")
	if err != nil {
		log.Fatal(err)
	}
	if r.Degraded {
		// memcached failed: the policy's failure mode (fail open by
		// default) decided, and r.Err says why.
		log.Printf("rate limiter degraded: %v", r.Err)
	}
	fmt.Printf("allowed=%v remaining=%d reset=%s\n", r.Allowed, r.Remaining, r.ResetAt.Format(time.RFC3339))
	fmt.Printf("round trips so far: %d\n", backend.Stats().RoundTrips)
}

// Growing a pool: a third server takes about a third of the identifiers,
// and the others stay where they were.
func ExampleRendezvousSelector() {
	selector, err := memcachedbackend.NewRendezvousSelector("10.0.0.1:11211", "10.0.0.2:11211")
	if err != nil {
		log.Fatal(err)
	}
	client := memcache.NewFromSelector(selector)
	client.Timeout = 100 * time.Millisecond
	client.MaxIdleConns = memcachedbackend.DefaultMaxIdleConns
	// WithSelector tells the backend which server holds a key, so that
	// each server has a circuit breaker of its own.
	backend, err := memcachedbackend.New(client, memcachedbackend.WithSelector(selector))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := throttler.New(backend); err != nil {
		log.Fatal(err)
	}

	if err := selector.SetServers("10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211"); err != nil {
		log.Fatal(err)
	}
}
