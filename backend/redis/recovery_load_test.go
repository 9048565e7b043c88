package redisbackend_test

import (
	"context"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/breaker"
	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/internal/localserver"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
)

// A healthy Redis on a machine loaded by other work never opens a breaker.
// This is the measurement behind breaker.DefaultFailingFor. The test loads
// the machine itself, with one busy process (yes > /dev/null) per CPU,
// and decides from 16 goroutines through three backends at once: the
// default trip rule, the count alone (5 failures in a row, the rule before
// issue 23) and none. It logs the degraded decisions and the openings of
// each and asserts that the default rule opened nothing. It runs 5 s, or
// THROTTLEKIT_LOAD_SECONDS (60 for the figures in docs/DESIGN.md).
func TestRecoveryLoadedMachineKeepsBreakersClosed(t *testing.T) {
	localserver.SkipIfShort(t)
	secs := testkit.Count(t, "THROTTLEKIT_LOAD_SECONDS", 5)
	hogs := make([]*exec.Cmd, runtime.NumCPU())
	for i := range hogs {
		hogs[i] = exec.Command("yes")
		require.NoError(t, hogs[i].Start())
	}
	t.Cleanup(func() {
		for _, h := range hogs {
			_ = h.Process.Kill()
			_ = h.Wait()
		}
	})
	server := ownRedis(t)
	type variant struct {
		name     string
		opts     []breaker.Option
		th       *throttler.Throttler
		opened   atomic.Int64
		degraded atomic.Int64
		calls    atomic.Int64
	}
	variants := []*variant{
		{name: "default rule"},
		{name: "count alone", opts: []breaker.Option{breaker.WithFailingFor(0)}},
		{name: "no breaker"},
	}
	for _, v := range variants {
		opts := []redisbackend.Option{redisbackend.WithPrefix(newPrefix())}
		if v.name == "no breaker" {
			opts = append(opts, redisbackend.WithoutBreaker())
		} else {
			opts = append(opts, redisbackend.WithBreaker(append(v.opts, breaker.WithLogger(nil),
				breaker.WithStateChange(func(_ string, _, to breaker.State) {
					if to == breaker.Open {
						v.opened.Add(1)
					}
				}))...))
		}
		b := mustBackend(t, ctxClient(t, server.Addr()), opts...)
		v.th = testkit.Throttler(t, b, throttler.WithLogger(nil))
	}
	p := mustPolicy(t, "load", "1000000000/h")
	ctx := context.Background()
	deadline := time.Now().Add(time.Duration(secs) * time.Second)
	var wg sync.WaitGroup
	for _, v := range variants {
		for w := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				id := "w" + strconv.Itoa(w)
				for time.Now().Before(deadline) {
					r, err := v.th.Allow(ctx, p, id)
					if !assert.NoError(t, err) {
						return
					}
					v.calls.Add(1)
					if r.Degraded {
						v.degraded.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	for _, v := range variants {
		t.Logf("%s: %d decisions in %ds, %d degraded, %d breaker openings", v.name, v.calls.Load(), secs, v.degraded.Load(), v.opened.Load())
	}
	require.Zero(t, variants[0].opened.Load(), "the default rule opened a breaker on a healthy store")
}
