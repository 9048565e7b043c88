package redisgroups_test

import (
	"log"
	"os"

	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	redisgroups "github.com/throttlekit/throttlekit/backend/redis/groups"
	"github.com/throttlekit/throttlekit/throttler"
)

// A Redis layout usually comes from one string in the environment, such as
//
//	THROTTLEKIT_SHARDS=a=redis://10.0.0.1:6379?replica=redis://10.0.0.2:6379&dial_timeout=200ms,b=redis://10.0.0.3:6379?replica=redis://10.0.0.4:6379
//
// Decisions go to each group's primary, peeks to its replica.
func ExampleOpen() {
	backend, err := redisgroups.Open(os.Getenv("THROTTLEKIT_SHARDS"),
		redisgroups.WithBackendOptions(redisbackend.WithPrefix("myapp:")))
	if err != nil {
		// The error names the offending part, never a password, such as
		// `throttlekit: invalid option: shard "b": replica 0 has the primary's address tcp://10.0.0.3:6379`.
		log.Fatal(err)
	}
	defer backend.Close()
	th, err := throttler.New(backend)
	if err != nil {
		log.Fatal(err)
	}
	_ = th
}
