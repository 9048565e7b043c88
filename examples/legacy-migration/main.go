// Command legacy-migration moves a deployment off a hand-written limiter
// (memcached INCR on "rl:<user>" and the window's end in
// "rl:<user>:reset_at", as GitHub's old limiter kept them) onto throttlekit
// over sharded Redis, while every client is in the middle of its window.
// The legacy store is read-only to throttlekit: each client's first
// decision reads its live counter and carries it into Redis, so no window
// restarts and no quota is granted twice. MEMCACHED_ADDRS names the legacy
// memcached, REDIS_GROUPS the Redis groups ("a=redis://h:p,b=redis://h:p").
package main

import (
	"cmp"
	"context"
	"fmt"
	"log"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	legacybackend "github.com/throttlekit/throttlekit/backend/legacy"
	memcachedbackend "github.com/throttlekit/throttlekit/backend/memcached"
	redisgroups "github.com/throttlekit/throttlekit/backend/redis/groups"
	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler"
)

const (
	clients = 44
	quota   = 10 // per minute, in the legacy code and in the policy
)

func main() {
	mc, err := memcachedbackend.NewClient(time.Second,
		strings.Split(cmp.Or(os.Getenv("MEMCACHED_ADDRS"), "127.0.0.1:11211"), ",")...)
	if err != nil {
		log.Fatal(err)
	}

	// What the hand-written limiter left: client i has spent 1 + i % 10 of
	// its 10 requests in a window that ends 40 s from now (client 9 and its
	// like have none left).
	resetAt := time.Now().Add(40 * time.Second).Unix()
	for i := range clients {
		key := "rl:user:" + strconv.Itoa(i)
		for _, item := range []*memcache.Item{
			{Key: key, Value: []byte(strconv.Itoa(1 + i%10)), Expiration: 60},
			{Key: key + ":reset_at", Value: []byte(strconv.FormatInt(resetAt, 10)), Expiration: 60},
		} {
			if err := mc.Set(item); err != nil {
				log.Fatal(err)
			}
		}
	}

	// The deploy: throttlekit over sharded Redis, the legacy counters as
	// the old side of a split rollout at 100 %.
	legacy, err := legacybackend.NewMemcached(mc, time.Minute,
		legacybackend.WithKeyFunc(func(policy, id string) string { return "rl:" + id }))
	if err != nil {
		log.Fatal(err)
	}
	groups, err := redisgroups.Parse(os.Getenv("REDIS_GROUPS"))
	if err != nil {
		log.Fatal(err)
	}
	redis, err := redisgroups.New(groups)
	if err != nil {
		log.Fatal(err)
	}
	all, err := rollout.NewStaticSource(100)
	if err != nil {
		log.Fatal(err)
	}
	rb, err := rollout.New(legacy, redis, all)
	if err != nil {
		log.Fatal(err)
	}
	defer rb.Close()
	th, err := throttler.New(rb, throttler.WithCallTimeout(time.Second))
	if err != nil {
		log.Fatal(err)
	}
	policy, err := throttler.ParsePolicy("api", "10/min")
	if err != nil {
		log.Fatal(err)
	}

	// Every client calls until it is denied: it must get exactly what the
	// legacy counter left it, and see the legacy window's end.
	restarts, doubleGrants, granted := 0, 0, 0
	for i := range clients {
		left := quota - (1 + i%10)
		allowed := 0
		for range quota + 1 {
			r, err := th.Allow(context.Background(), policy, "user:"+strconv.Itoa(i))
			if err != nil || r.Degraded {
				log.Fatalf("user:%d: %v %v", i, err, r.Err)
			}
			if !r.ResetAt.Equal(time.Unix(resetAt, 0)) {
				restarts++
			}
			if !r.Allowed {
				break
			}
			allowed++
		}
		if allowed > max(left, 0) {
			doubleGrants++
		}
		granted += allowed
	}
	st := rb.Stats()
	fmt.Printf("clients: %d, carried over from the legacy counters: %d\n", clients, st.Seeded)
	fmt.Printf("requests granted after the deploy: %d\n", granted)
	fmt.Printf("window restarts: %d, double grants: %d\n", restarts, doubleGrants)
}
