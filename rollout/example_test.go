package rollout_test

import (
	"context"
	"fmt"
	"strconv"
	"time"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// Example moves identifiers from one memory backend to another with a
// static percentage, in mirror mode: an identifier moved in the middle of
// its window keeps its count and its reset time.
func Example() {
	ctx := context.Background()
	clock := throttlertest.NewManualClock(time.Date(2030, 1, 2, 3, 4, 0, 0, time.UTC))
	oldStore, newStore := memorybackend.New(), memorybackend.New()
	percent, err := rollout.NewStaticSource(0)
	if err != nil {
		fmt.Println(err)
		return
	}
	backend, err := rollout.New(oldStore, newStore, percent, rollout.WithMode(rollout.MirrorMode))
	if err != nil {
		fmt.Println(err)
		return
	}
	th, err := throttler.New(backend, throttler.WithClock(clock))
	if err != nil {
		fmt.Println(err)
		return
	}
	policy, err := throttler.ParsePolicy("api", "5/min")
	if err != nil {
		fmt.Println(err)
		return
	}
	allow := func() {
		r, err := th.Allow(ctx, policy, "user:42")
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("%s backend: allowed=%v remaining=%d reset=%s\n",
			backend.Side("user:42"), r.Allowed, r.Remaining, r.ResetAt.Format("15:04:05"))
		clock.Advance(10 * time.Second)
	}

	allow()
	allow()
	allow()
	// Move every identifier to the new backend, mid-window. No deploy: in
	// production the percentage comes from an Unleash toggle.
	if err := percent.Set(100); err != nil {
		fmt.Println(err)
		return
	}
	allow()
	allow()
	allow()

	// Raising the percentage moves identifiers one way only.
	sides := func(p int) map[string]rollout.Side {
		if err := percent.Set(p); err != nil {
			fmt.Println(err)
		}
		out := map[string]rollout.Side{}
		for i := 0; i < 1000; i++ {
			id := "user:" + strconv.Itoa(i)
			out[id] = backend.Side(id)
		}
		return out
	}
	at10, at50 := sides(10), sides(50)
	onNew10, onNew50, movedBack := 0, 0, 0
	for id, side := range at10 {
		if side == rollout.SideNew {
			onNew10++
			if at50[id] == rollout.SideOld {
				movedBack++
			}
		}
		if at50[id] == rollout.SideNew {
			onNew50++
		}
	}
	fmt.Printf("of 1000 identifiers on the new backend: %d at 10%%, %d at 50%%; moved back: %d\n",
		onNew10, onNew50, movedBack)
	// Output:
	// old backend: allowed=true remaining=4 reset=03:05:00
	// old backend: allowed=true remaining=3 reset=03:05:00
	// old backend: allowed=true remaining=2 reset=03:05:00
	// new backend: allowed=true remaining=1 reset=03:05:00
	// new backend: allowed=true remaining=0 reset=03:05:00
	// new backend: allowed=false remaining=0 reset=03:05:00
	// of 1000 identifiers on the new backend: 99 at 10%, 477 at 50%; moved back: 0
}
