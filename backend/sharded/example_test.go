package shardedbackend_test

import (
	"context"
	"fmt"
	"time"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	shardedbackend "github.com/throttlekit/throttlekit/backend/sharded"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// The generic core composes any backends; here three in-process memory
// backends stand in for three Redis groups. Each identifier has one owner,
// whatever order the shards are listed in.
func Example() {
	ctx := context.Background()
	stores := map[string]*memorybackend.Backend{"a": memorybackend.New(), "b": memorybackend.New(), "c": memorybackend.New()}
	backend, err := shardedbackend.New([]shardedbackend.Shard{
		{Name: "a", Primary: stores["a"]},
		{Name: "b", Primary: stores["b"]},
		{Name: "c", Primary: stores["c"]},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	clock := throttlertest.NewManualClock(time.Date(2030, 1, 2, 3, 4, 0, 0, time.UTC))
	th, err := throttler.New(backend, throttler.WithClock(clock))
	if err != nil {
		fmt.Println(err)
		return
	}
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
	fmt.Println("owner over c, a, b:", shardedbackend.Owner([]string{"c", "a", "b"}, "user:1"))
	fmt.Println("identifiers held:", stores["a"].Len(), stores["b"].Len(), stores["c"].Len())
	// Output:
	// user:1 on shard c: allowed=true remaining=1
	// user:1 on shard c: allowed=true remaining=0
	// user:1 on shard c: allowed=false remaining=0
	// user:2 on shard a: allowed=true remaining=1
	// user:2 on shard a: allowed=true remaining=0
	// user:2 on shard a: allowed=false remaining=0
	// user:3 on shard a: allowed=true remaining=1
	// user:3 on shard a: allowed=true remaining=0
	// user:3 on shard a: allowed=false remaining=0
	// user:4 on shard a: allowed=true remaining=1
	// user:4 on shard a: allowed=true remaining=0
	// user:4 on shard a: allowed=false remaining=0
	// owner over c, a, b: c
	// identifiers held: 3 0 1
}
