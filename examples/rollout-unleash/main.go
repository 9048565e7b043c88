// Command rollout-unleash lets an Unleash toggle decide which identifiers
// Redis serves instead of memcached: raise the toggle's gradual rollout in
// Unleash, and identifiers move without a deploy. UNLEASH_URL is the
// server's API URL, UNLEASH_TOKEN a client token, UNLEASH_FEATURE the
// toggle; MEMCACHED_ADDRS and REDIS_ADDR name the two stores.
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
	"github.com/throttlekit/throttlekit/rollout/unleashflag"
	"github.com/throttlekit/throttlekit/throttler"
)

func main() {
	// New fails fast, with a clear error, when Unleash refuses the token or
	// does not answer within 10 s; WithUsageMetrics keeps the toggle from
	// looking unused in Unleash's UI.
	flag, err := unleashflag.New(cmp.Or(os.Getenv("UNLEASH_FEATURE"), "ratelimit-redis"),
		unleashflag.WithServer(cmp.Or(os.Getenv("UNLEASH_URL"), "http://127.0.0.1:4242/api/"), "my-api"),
		unleashflag.WithToken(os.Getenv("UNLEASH_TOKEN")),
		unleashflag.WithWaitForFirstFetch(10*time.Second),
		unleashflag.WithUsageMetrics())
	if err != nil {
		log.Fatal(err)
	}
	defer flag.Close()

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
	fmt.Println("rollout:", flag.Split())
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
}
