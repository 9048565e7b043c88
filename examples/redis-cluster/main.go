// Command redis-cluster limits requests in a Redis Cluster. Every key of one
// identifier's policy shares a hash slot, so one script decides them all.
// REDIS_CLUSTER_ADDRS lists some of the cluster's nodes, comma-separated.
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
	addrs := strings.Split(cmp.Or(os.Getenv("REDIS_CLUSTER_ADDRS"), "127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002"), ",")
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
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
	for _, id := range []string{"user:1", "user:2", "user:3"} {
		for range 4 {
			r, err := th.Allow(context.Background(), policy, id)
			if err != nil {
				log.Fatal(err)
			}
			if r.Degraded {
				log.Fatalf("redis failed, the request was failed open: %v", r.Err)
			}
			fmt.Printf("%s allowed=%v remaining=%d\n", id, r.Allowed, r.Remaining)
		}
	}
}
