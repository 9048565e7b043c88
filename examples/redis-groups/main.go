// Command redis-groups shards identifiers over named primary/replica Redis
// groups, configured from one string: decisions go to the owning group's
// primary, peeks (th.Peek) to its replica. REDIS_GROUPS holds the layout.
package main

import (
	"cmp"
	"context"
	"fmt"
	"log"
	"os"

	redisgroups "github.com/throttlekit/throttlekit/backend/redis/groups"
	"github.com/throttlekit/throttlekit/throttler"
)

func main() {
	layout := cmp.Or(os.Getenv("REDIS_GROUPS"),
		"a=redis://127.0.0.1:6379?replica=redis://127.0.0.1:6380,b=redis://127.0.0.1:6381?replica=redis://127.0.0.1:6382")
	backend, err := redisgroups.Open(layout) // errors never show a password
	if err != nil {
		log.Fatal(err)
	}
	defer backend.Close() // the clients Open made
	th, err := throttler.New(backend)
	if err != nil {
		log.Fatal(err)
	}
	policy, err := throttler.ParsePolicy("api", "3/min")
	if err != nil {
		log.Fatal(err)
	}
	for _, id := range []string{"user:1", "user:2", "user:3"} {
		for range 4 {
			r, err := th.Allow(context.Background(), policy, id)
			if err != nil {
				log.Fatal(err)
			}
			if r.Degraded {
				log.Fatalf("group %s failed, the request was failed open: %v", backend.ShardFor(id), r.Err)
			}
			fmt.Printf("%s allowed=%v remaining=%d\n", id, r.Allowed, r.Remaining)
		}
		fmt.Printf("%s lives on group %s\n", id, backend.ShardFor(id))
	}
}
