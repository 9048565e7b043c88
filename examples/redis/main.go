// Command redis limits requests in a standalone Redis, the store most
// deployments start with. REDIS_ADDR names the server.
package main

import (
	"cmp"
	"context"
	"fmt"
	"log"
	"os"

	"github.com/redis/go-redis/v9"

	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/throttler"
)

func main() {
	// ContextTimeoutEnabled lets go-redis end each command at the
	// throttler's per-call deadline (100 ms unless WithCallTimeout says).
	client := redis.NewClient(&redis.Options{
		Addr:                  cmp.Or(os.Getenv("REDIS_ADDR"), "127.0.0.1:6379"),
		ContextTimeoutEnabled: true,
	})
	defer client.Close()
	backend, err := redisbackend.New(client)
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
			log.Fatalf("redis failed, the request was failed open: %v", r.Err)
		}
		fmt.Printf("allowed=%v remaining=%d binding=%s\n", r.Allowed, r.Remaining, r.Binding)
	}
}
