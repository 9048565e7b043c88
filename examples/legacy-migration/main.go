// Command legacy-migration moves a deployment off a hand-written limiter
// (memcached INCR on "rl:<user>" and the window's end in
// "rl:<user>:reset_at", as GitHub's old limiter kept them) onto throttlekit
// over sharded Redis, while every client is in the middle of its window,
// the way docs/MIGRATION.md's Step 0 goes. During the deploy, old
// processes may still count, so the new code counts where and as they do:
// backend/legacy with Deciding decides in the legacy keys, and a mirror
// rollout at 0 % writes each window to Redis alongside. Once no old process
// remains, the rollout goes to 100 %: Redis decides, from the windows
// mirrored into it, so no window restarts and no quota is granted twice.
// MEMCACHED_ADDRS names the legacy memcached, REDIS_GROUPS the Redis groups
// ("a=redis://h:p,b=redis://h:p").
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

	// The deploy: throttlekit deciding in the legacy keys (the hand-written
	// limiter's window is a minute), Redis written alongside by a mirror
	// rollout at 0 %.
	const legacyWindow = time.Minute
	legacy, err := legacybackend.NewMemcached(mc, legacyWindow, legacybackend.Deciding(),
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
	flag, err := rollout.NewStaticSource(0)
	if err != nil {
		log.Fatal(err)
	}
	rb, err := rollout.New(legacy, redis, flag, rollout.WithMode(rollout.MirrorMode))
	if err != nil {
		log.Fatal(err)
	}
	defer rb.Close()
	th, err := throttler.New(rb, throttler.WithCallTimeout(time.Second))
	if err != nil {
		log.Fatal(err)
	}
	// The legacy limit and nothing more: old processes count no other.
	policy, err := throttler.ParsePolicy("api", "10/min")
	if err != nil {
		log.Fatal(err)
	}

	// While old processes may still run, each client calls once: the
	// legacy keys decide, and its window is written to Redis.
	allowedAt0 := make([]int, clients)
	restarts := 0
	call := func(i int) bool {
		r, err := th.Allow(context.Background(), policy, "user:"+strconv.Itoa(i))
		if err != nil || r.Degraded {
			log.Fatalf("user:%d: %v %v", i, err, r.Err)
		}
		if !r.ResetAt.Equal(time.Unix(resetAt, 0)) {
			restarts++
		}
		return r.Allowed
	}
	for i := range clients {
		if call(i) {
			allowedAt0[i]++
		}
	}
	mirrored := rb.Stats().Mirrored

	// No old process left: Redis decides. Every client calls until it is
	// denied: over both steps it must get exactly what the legacy counter
	// left it, and see the legacy window's end.
	if err := flag.Set(100); err != nil {
		log.Fatal(err)
	}
	doubleGrants, granted := 0, 0
	for i := range clients {
		left := quota - (1 + i%10)
		allowed := allowedAt0[i]
		for range quota + 1 {
			if !call(i) {
				break
			}
			allowed++
		}
		if allowed > max(left, 0) {
			doubleGrants++
		}
		granted += allowed
	}
	fmt.Printf("clients: %d, windows mirrored into Redis at 0 %%: %d\n", clients, mirrored)
	fmt.Printf("requests granted after the deploy: %d\n", granted)
	fmt.Printf("window restarts: %d, double grants: %d\n", restarts, doubleGrants)
}
