package redisbackend_test

import (
	"context"
	"fmt"
	"log"

	goredis "github.com/redis/go-redis/v9"

	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/throttler"
)

// Example limits one user's calls under GitHub-style limits, on a Redis
// server at localhost:6379. It has no checked output: it needs that server.
// ContextTimeoutEnabled lets go-redis end each call at the throttler's
// per-call timeout by itself (see Timeouts in the package documentation).
func Example() {
	rdb := goredis.NewClient(&goredis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	defer rdb.Close()
	backend, err := redisbackend.New(rdb, redisbackend.WithPrefix("myapp:"))
	if err != nil {
		log.Fatal(err)
	}
	th, err := throttler.New(backend)
	if err != nil {
		log.Fatal(err)
	}
	policy, err := throttler.ParsePolicy("api", "10/s, 5000/h")
	if err != nil {
		log.Fatal(err)
	}

	r, err := th.Allow(context.Background(), policy, "user:42")
	if err != nil {
		log.Fatal(err)
	}
	if r.Degraded {
		log.Printf("redis failed, failing open: %v", r.Err)
	}
	fmt.Println(r.Allowed, r.Remaining, r.ResetAt)
}

// ExampleWithReadClient sends peeks to the replicas of a Redis Cluster.
func ExampleWithReadClient() {
	addrs := []string{"localhost:7000", "localhost:7001", "localhost:7002"}
	primaries := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	defer primaries.Close()
	replicas := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs, ReadOnly: true, ContextTimeoutEnabled: true})
	defer replicas.Close()
	backend, err := redisbackend.New(primaries, redisbackend.WithReadClient(replicas))
	if err != nil {
		log.Fatal(err)
	}
	th, err := throttler.New(backend)
	if err != nil {
		log.Fatal(err)
	}
	policy, err := throttler.ParsePolicy("api", "5000/h")
	if err != nil {
		log.Fatal(err)
	}
	r, err := th.Peek(context.Background(), policy, "user:42")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(r.Remaining, r.ResetAt)
}

// The auto-pipeliner batches concurrent decisions into pipelines.
func ExampleNew_autoPipeline() {
	rdb := goredis.NewClient(&goredis.Options{Addr: "localhost:6379"})
	defer rdb.Close()
	ap, err := rdb.AutoPipeline()
	if err != nil {
		log.Fatal(err)
	}
	backend, err := redisbackend.New(ap)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := throttler.New(backend); err != nil {
		log.Fatal(err)
	}
}
