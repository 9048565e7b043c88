package sharded_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/backend/sharded"
	"github.com/throttlekit/throttlekit/throttler"
)

// The generic core composes any backends; here three in-process memory
// backends stand in for three Redis groups. Each identifier has one owner,
// whatever order the shards are listed in.
func Example() {
	ctx := context.Background()
	stores := map[string]*memory.Backend{"a": memory.New(), "b": memory.New(), "c": memory.New()}
	backend, err := sharded.New([]sharded.Shard{
		{Name: "a", Primary: stores["a"]},
		{Name: "b", Primary: stores["b"]},
		{Name: "c", Primary: stores["c"]},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	clock := throttler.NewManualClock(time.Date(2030, 1, 2, 3, 4, 0, 0, time.UTC))
	th := throttler.New(backend, throttler.WithClock(clock))
	policy, err := throttler.ParsePolicy("api", "2/min")
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, id := range []string{"user:1", "user:2", "user:3", "user:4"} {
		for range 3 {
			r, err := th.Allow(ctx, policy, id)
			if err != nil {
				fmt.Println(err)
				return
			}
			fmt.Printf("%s on shard %s: allowed=%v remaining=%d\n", id, backend.ShardFor(id), r.Allowed, r.Remaining)
		}
	}
	fmt.Println("owner over c, a, b:", sharded.Owner([]string{"c", "a", "b"}, "user:1"))
	fmt.Println("identifiers held:", stores["a"].Len(), stores["b"].Len(), stores["c"].Len())
	// Output:
	// user:1 on shard a: allowed=true remaining=1
	// user:1 on shard a: allowed=true remaining=0
	// user:1 on shard a: allowed=false remaining=0
	// user:2 on shard b: allowed=true remaining=1
	// user:2 on shard b: allowed=true remaining=0
	// user:2 on shard b: allowed=false remaining=0
	// user:3 on shard a: allowed=true remaining=1
	// user:3 on shard a: allowed=true remaining=0
	// user:3 on shard a: allowed=false remaining=0
	// user:4 on shard c: allowed=true remaining=1
	// user:4 on shard c: allowed=true remaining=0
	// user:4 on shard c: allowed=false remaining=0
	// owner over c, a, b: a
	// identifiers held: 2 1 1
}

// A Redis layout usually comes from one string in the environment, such as
//
//	THROTTLEKIT_SHARDS=a=redis://10.0.0.1:6379?replica=redis://10.0.0.2:6379&dial_timeout=200ms,b=redis://10.0.0.3:6379?replica=redis://10.0.0.4:6379
//
// Decisions go to each shard's primary, peeks to its replica.
func ExampleOpenRedis() {
	backend, err := sharded.OpenRedis(os.Getenv("THROTTLEKIT_SHARDS"),
		sharded.WithRedisOptions(redis.WithPrefix("myapp:")))
	if err != nil {
		// The error names the offending part, such as
		// `sharded: bad configuration: shard "b": replica 0 has the primary's address tcp://10.0.0.3:6379`.
		log.Fatal(err)
	}
	defer backend.Close()
	th := throttler.New(backend)
	_ = th
}
