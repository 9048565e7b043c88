// Command staticonly is what TestStaticRolloutLinksNoUnleash builds the
// dependency list of: a program that uses a rollout with a static source.
package main

import (
	"context"
	"fmt"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler"
)

func main() {
	flag, err := rollout.NewStaticSource(50)
	if err != nil {
		panic(err)
	}
	b, err := rollout.New(memorybackend.New(), memorybackend.New(), flag)
	if err != nil {
		panic(err)
	}
	th, err := throttler.New(b)
	if err != nil {
		panic(err)
	}
	p, err := throttler.ParsePolicy("api", "10/s")
	if err != nil {
		panic(err)
	}
	r, err := th.Allow(context.Background(), p, "user:42")
	fmt.Println(r.Allowed, err)
}
