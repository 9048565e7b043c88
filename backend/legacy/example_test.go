package legacybackend_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	goredis "github.com/redis/go-redis/v9"

	legacybackend "github.com/throttlekit/throttlekit/backend/legacy"
	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler"
)

// Example moves a hand-written memcached limiter ("rl:<user>" counted
// with INCR, "rl:<user>:reset_at" in Unix seconds, one-hour windows) to
// throttlekit on Redis without restarting a window: each identifier's
// first decision reads its live legacy counter and seeds Redis with it.
// It has no checked output: it needs a memcached and a Redis server.
func Example() {
	mc := memcache.New("127.0.0.1:11211")
	mc.Timeout = 50 * time.Millisecond
	old, err := legacybackend.NewMemcached(mc, time.Hour,
		legacybackend.WithKeyFunc(func(_, identifier string) string { return "rl:" + identifier }))
	if err != nil {
		log.Fatal(err)
	}

	rdb := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	defer rdb.Close()
	store, err := redisbackend.New(rdb, redisbackend.WithPrefix("api:"))
	if err != nil {
		log.Fatal(err)
	}

	// Every identifier is served by Redis; the legacy store is only read.
	all, err := rollout.NewStaticSource(100)
	if err != nil {
		log.Fatal(err)
	}
	rb, err := rollout.New(old, store, all)
	if err != nil {
		log.Fatal(err)
	}
	th, err := throttler.New(rb)
	if err != nil {
		log.Fatal(err)
	}
	policy, err := throttler.ParsePolicy("api", "5000/h")
	if err != nil {
		log.Fatal(err)
	}

	r, err := th.Allow(context.Background(), policy, "user:42")
	if err != nil {
		log.Fatal(err)
	}
	// ResetAt is the legacy window's reset_at while that window is open.
	fmt.Printf("allowed=%v remaining=%d reset=%s\n", r.Allowed, r.Remaining, r.ResetAt.Format(time.RFC3339))
	fmt.Printf("legacy windows carried over: %d\n", old.Stats().Found)
}
