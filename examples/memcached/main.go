// Command memcached limits requests in memcached, the legacy store: windows
// are opened atomically, keys stay within memcached's 250 bytes, and the
// servers are chosen by rendezvous hashing. MEMCACHED_ADDRS lists the
// servers, comma-separated.
package main

import (
	"cmp"
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	memcachedbackend "github.com/throttlekit/throttlekit/backend/memcached"
	"github.com/throttlekit/throttlekit/throttler"
)

func main() {
	servers := strings.Split(cmp.Or(os.Getenv("MEMCACHED_ADDRS"), "127.0.0.1:11211"), ",")
	// Keep the client's timeout at most the throttler's per-call timeout:
	// a gomemcache call cannot be interrupted.
	client, err := memcachedbackend.NewClient(100*time.Millisecond, servers...)
	if err != nil {
		log.Fatal(err)
	}
	backend, err := memcachedbackend.New(client)
	if err != nil {
		log.Fatal(err)
	}
	th, err := throttler.New(backend)
	if err != nil {
		log.Fatal(err)
	}
	policy, err := throttler.ParsePolicy("api", "3/min, 5000/h")
	if err != nil {
		log.Fatal(err)
	}
	for range 4 {
		r, err := th.Allow(context.Background(), policy, "user:42")
		if err != nil {
			log.Fatal(err)
		}
		if r.Degraded {
			log.Fatalf("memcached failed, the request was failed open: %v", r.Err)
		}
		fmt.Printf("allowed=%v remaining=%d\n", r.Allowed, r.Remaining)
	}
}
