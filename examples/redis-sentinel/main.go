// Command redis-sentinel limits requests in a Redis primary watched by
// Sentinel: go-redis follows a failover to the promoted replica.
// SENTINEL_ADDRS lists the sentinels, comma-separated; SENTINEL_MASTER
// names the primary they watch.
package main

import (
	"cmp"
	"context"
	"fmt"
	"log"
	"os"
	"strings"

	"github.com/redis/go-redis/v9"

	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/throttler"
)

func main() {
	client := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:            cmp.Or(os.Getenv("SENTINEL_MASTER"), "mymaster"),
		SentinelAddrs:         strings.Split(cmp.Or(os.Getenv("SENTINEL_ADDRS"), "127.0.0.1:26379"), ","),
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
	policy, err := throttler.ParsePolicy("api", "3/min")
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
		fmt.Printf("allowed=%v remaining=%d\n", r.Allowed, r.Remaining)
	}
}
