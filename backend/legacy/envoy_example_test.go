package legacybackend_test

import (
	"log"

	goredis "github.com/redis/go-redis/v9"

	legacybackend "github.com/throttlekit/throttlekit/backend/legacy"
	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler"
)

// ExampleNewEnvoyRedis sets up the way in from envoy ratelimit during a
// rolling deploy: while envoy processes may still serve, throttlekit counts
// in envoy's Redis keys as they do, and writes its own store alongside (a
// mirror rollout at 0 %); once they are gone, the percentage goes to 100.
// The policies use aligned windows of envoy's units, and each request's
// identifier is envoy's key without its prefix and window start, such as
// "edge_remote_address_10.0.0.1". Nothing here talks to a server: the
// client connects on its first command.
func ExampleNewEnvoyRedis() {
	// envoy ratelimit's Redis (REDIS_URL), and throttlekit's own store.
	rdb := goredis.NewUniversalClient(&goredis.UniversalOptions{Addrs: []string{"127.0.0.1:6379"}})
	defer rdb.Close()
	store, err := redisbackend.New(rdb, redisbackend.WithPrefix("tk:"))
	if err != nil {
		log.Fatal(err)
	}

	old, err := legacybackend.NewEnvoyRedis(rdb,
		legacybackend.WithEnvoyPrefix(""), // envoy's CACHE_KEY_PREFIX
		legacybackend.Deciding())          // count in envoy's keys, as envoy does
	if err != nil {
		log.Fatal(err)
	}
	src, err := rollout.NewStaticSource(0) // 100 once no envoy process remains
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
	_, err = throttler.ParsePolicy("edge", "100/s aligned, 5000/min aligned")
	if err != nil {
		log.Fatal(err)
	}
	_ = th // th.Allow(ctx, policy, "edge_remote_address_10.0.0.1")
	// Output:
}
