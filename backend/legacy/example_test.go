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
// with INCR, "rl:<user>:reset_at" in Unix seconds, one-minute windows) to
// throttlekit on Redis during a rolling deploy, without restarting or
// moving a window: while old processes may still count, the new code
// counts in the legacy keys as they do, with Redis written alongside
// (mirror mode at 0 %); once they are gone, the percentage goes to 100 and
// Redis decides. It has no checked output: it needs a memcached and a
// Redis server.
func Example() {
	// The hand-written limiter's window: what its code adds to now to
	// write reset_at. A policy of another window matches nothing
	// (Stats.Unmatched, and a warning in the log).
	const legacyWindow = time.Minute

	mc := memcache.New("127.0.0.1:11211")
	mc.Timeout = 50 * time.Millisecond
	old, err := legacybackend.NewMemcached(mc, legacyWindow,
		legacybackend.Deciding(), // count in the legacy keys, as the old code does
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

	// 0 % while any old process runs: the legacy counters decide, Redis is
	// written after every decision. Raise it to 100 once the deploy is done.
	src, err := rollout.NewStaticSource(0)
	if err != nil {
		log.Fatal(err)
	}
	rb, err := rollout.New(old, store, src, rollout.WithMode(rollout.MirrorMode))
	if err != nil {
		log.Fatal(err)
	}
	th, err := throttler.New(rb)
	if err != nil {
		log.Fatal(err)
	}
	// The legacy limiter's own quota and window.
	policy, err := throttler.ParsePolicy("api", "60/min")
	if err != nil {
		log.Fatal(err)
	}

	r, err := th.Allow(context.Background(), policy, "user:42")
	if err != nil {
		log.Fatal(err)
	}
	// ResetAt is the legacy window's reset_at, as the old code reports it.
	fmt.Printf("allowed=%v remaining=%d reset=%s\n", r.Allowed, r.Remaining, r.ResetAt.Format(time.RFC3339))

	// The deploy is done: no old process counts any more.
	if err := src.Set(100); err != nil {
		log.Fatal(err)
	}
	st := old.Stats()
	fmt.Printf("decided in the legacy keys: %d, unmatched: %d\n", st.Decided, st.Unmatched)
}

// ExampleNewRedis is the way in from a hand-written Redis limiter (INCR
// of "rl:<user>", EXPIRE of a minute when the INCR returned 1): while old
// processes may still count, the new code counts in their keys as they
// do, reading each window's end as the key's absolute expiry, with the
// new store written alongside (mirror mode at 0 %); once they are gone,
// the percentage goes to 100. It needs Redis 7.0 or later, and has no
// checked output: it needs Redis servers.
func ExampleNewRedis() {
	legacy := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true})
	defer legacy.Close()
	old, err := legacybackend.NewRedis(legacy,
		legacybackend.Deciding(),
		legacybackend.WithWindow(time.Minute), // what the old code gives EXPIRE
		legacybackend.WithKeyFunc(func(_, identifier string) string { return "rl:" + identifier }))
	if err != nil {
		log.Fatal(err)
	}

	rdb := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:6380", ContextTimeoutEnabled: true})
	defer rdb.Close()
	store, err := redisbackend.New(rdb, redisbackend.WithPrefix("api:"))
	if err != nil {
		log.Fatal(err)
	}
	src, err := rollout.NewStaticSource(0)
	if err != nil {
		log.Fatal(err)
	}
	rb, err := rollout.New(old, store, src, rollout.WithMode(rollout.MirrorMode))
	if err != nil {
		log.Fatal(err)
	}
	th, err := throttler.New(rb)
	if err != nil {
		log.Fatal(err)
	}
	policy, err := throttler.ParsePolicy("api", "60/min")
	if err != nil {
		log.Fatal(err)
	}
	r, err := th.Allow(context.Background(), policy, "user:42")
	if err != nil {
		log.Fatal(err)
	}
	// ResetAt is the legacy key's PEXPIRETIME: the same for every answer
	// of the window.
	fmt.Printf("allowed=%v reset=%s\n", r.Allowed, r.ResetAt.Format(time.RFC3339Nano))
}
