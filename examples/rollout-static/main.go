// Command rollout-static moves identifiers from memcached to Redis at a
// fixed percentage, in mirror mode: the serving store decides, and the
// other one counts every allowed unit too, so a moved identifier keeps its
// window. MEMCACHED_ADDRS and REDIS_ADDR name the two stores.
package main

import (
	"cmp"
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	memcachedbackend "github.com/throttlekit/throttlekit/backend/memcached"
	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler"
)

func main() {
	mc, err := memcachedbackend.NewClient(100*time.Millisecond,
		strings.Split(cmp.Or(os.Getenv("MEMCACHED_ADDRS"), "127.0.0.1:11211"), ",")...)
	if err != nil {
		log.Fatal(err)
	}
	oldStore, err := memcachedbackend.New(mc)
	if err != nil {
		log.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: cmp.Or(os.Getenv("REDIS_ADDR"), "127.0.0.1:6379"), ContextTimeoutEnabled: true})
	defer rdb.Close()
	newStore, err := redisbackend.New(rdb)
	if err != nil {
		log.Fatal(err)
	}

	flag, err := rollout.NewStaticSource(50) // 50% of identifiers on Redis
	if err != nil {
		log.Fatal(err)
	}
	backend, err := rollout.New(oldStore, newStore, flag, rollout.WithMode(rollout.MirrorMode))
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
	for _, id := range []string{"user:1", "user:2", "user:3", "user:4"} {
		r, err := th.Allow(context.Background(), policy, id)
		if err != nil {
			log.Fatal(err)
		}
		if r.Degraded {
			log.Fatalf("a store failed, the request was failed open: %v", r.Err)
		}
		fmt.Printf("%s served by the %s store: allowed=%v remaining=%d\n", id, backend.Side(id), r.Allowed, r.Remaining)
	}
	// Raising the percentage moves identifiers only from old to new; the
	// mirror kept their counts, so none starts a fresh window.
	if err := flag.Set(100); err != nil {
		log.Fatal(err)
	}
	for _, id := range []string{"user:1", "user:2", "user:3", "user:4"} {
		r, err := th.Allow(context.Background(), policy, id)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s now on the %s store: allowed=%v remaining=%d\n", id, backend.Side(id), r.Allowed, r.Remaining)
	}
}
