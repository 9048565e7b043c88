package rls_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/throttlekit/throttlekit/internal/localserver"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/middleware/rls"
	"github.com/throttlekit/throttlekit/middleware/rls/store"
	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// migrationConfig anchors each window at its first request (throttlekit's
// fixed window), so that the reset time clients see is the one stored, and
// a window restarted by a move would show.
const migrationConfig = `
domain: mig
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 20, algorithm: fixed}
`

// TestRolloutMemcachedToGroupsUnderLoad moves the service's counters from
// memcached to two Redis groups while 16 gRPC callers ask two service
// instances (each its own throttler and rollout, as two processes are) about
// 30 values: the percentage ramps 0, 10, 25, 50, 75, 100 in mirror mode,
// then a rolling deploy replaces each instance by one on the Redis groups
// alone, the clock moving 14 s a
// step so that windows open, close and reopen during the move. Judged from
// responses: no two distinct reset times of one value overlap (a window is
// never restarted early), and no window grants more than its limit.
func TestRolloutMemcachedToGroupsUnderLoad(t *testing.T) {
	localserver.SkipIfShort(t)
	mc := localserver.MemcachedT(t, localserver.MemcachedOptions{})
	ga := localserver.RedisT(t, localserver.RedisOptions{})
	gb := localserver.RedisT(t, localserver.RedisOptions{})
	cfg := parse(t, migrationConfig)
	clock := throttlertest.NewManualClock(aligned.Add(17 * time.Second))

	groups := fmt.Sprintf("groups:a=redis://%s,b=redis://%s", ga.Addr(), gb.Addr())
	// serve starts one service instance over b and returns its client.
	serve := func(b driver.Backend) rlsv3.RateLimitServiceClient {
		th := testkit.Throttler(t, b, throttler.WithClock(clock), throttler.WithCallTimeout(testkit.CallTimeout))
		srv, err := rls.New(th, cfg, rls.WithClock(clock.Now), rls.WithFailureMode(rls.FailError))
		require.NoError(t, err)
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		gs := grpc.NewServer()
		rlsv3.RegisterRateLimitServiceServer(gs, srv)
		go func() { _ = gs.Serve(lis) }()
		t.Cleanup(gs.Stop)
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close() })
		return rlsv3.NewRateLimitServiceClient(conn)
	}
	open := func(spec string) driver.Backend {
		st, err := store.Open(spec, testkit.CallTimeout)
		require.NoError(t, err)
		t.Cleanup(func() { st.Close() })
		return st.Backend
	}
	var sources []*rollout.StaticSource
	var instances [2]atomic.Pointer[rlsv3.RateLimitServiceClient]
	for i := range instances {
		src, err := rollout.NewStaticSource(0)
		require.NoError(t, err)
		rb, err := rollout.New(open("memcached://"+mc.Addr()), open(groups), src, rollout.WithMode(rollout.MirrorMode))
		require.NoError(t, err)
		c := serve(rb)
		instances[i].Store(&c)
		sources = append(sources, src)
	}

	type seen struct {
		value string
		reset int64 // Unix ms
		ok    bool
	}
	var mu sync.Mutex
	var answers []seen
	var calls atomic.Int64
	stop := make(chan struct{})
	var load sync.WaitGroup
	for g := range 16 {
		load.Add(1)
		go func() {
			defer load.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				value := strconv.Itoa((g*11 + i) % 30)
				client := *instances[(g+i)%2].Load()
				before := clock.Now()
				resp, err := client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
					Domain: "mig", Descriptors: []*commonv3.RateLimitDescriptor{desc("client", value)}})
				after := clock.Now()
				if !assert.NoError(t, err) {
					return
				}
				calls.Add(1)
				if !before.Equal(after) {
					continue // the clock moved during the call: its now is unknown
				}
				st := resp.Statuses[0]
				reset := before.Add(st.DurationUntilReset.AsDuration()).UnixMilli()
				mu.Lock()
				answers = append(answers, seen{value, reset, st.Code == rlsv3.RateLimitResponse_OK})
				mu.Unlock()
			}
		}()
	}
	step := func(percent int) {
		time.Sleep(150 * time.Millisecond)
		clock.Advance(14 * time.Second)
		for _, src := range sources {
			require.NoError(t, src.Set(percent))
		}
	}
	for _, p := range []int{0, 10, 25, 50, 75, 100, 100} {
		step(p)
	}
	// A rolling deploy retires the old store: each instance in turn is
	// replaced by one on the Redis groups alone.
	for i := range instances {
		c := serve(open(groups))
		instances[i].Store(&c)
		step(100)
	}
	time.Sleep(60 * time.Millisecond)
	close(stop)
	load.Wait()

	resets := map[string][]int64{}
	granted := map[string]int{}
	for _, a := range answers {
		key := a.value + "@" + strconv.FormatInt(a.reset, 10)
		n, known := granted[key]
		if !known {
			resets[a.value] = append(resets[a.value], a.reset)
		}
		if a.ok {
			n++
		}
		granted[key] = n
	}
	overlaps, overGrants := 0, 0
	for value, rs := range resets {
		slices.Sort(rs)
		for i := 1; i < len(rs); i++ {
			if rs[i]-rs[i-1] < time.Minute.Milliseconds() {
				overlaps++
				t.Errorf("value %s: windows ending %d and %d overlap: a window restarted", value, rs[i-1], rs[i])
			}
		}
	}
	for key, n := range granted {
		if n > 20 {
			overGrants++
			t.Errorf("%s: %d granted of 20", key, n)
		}
	}
	t.Logf("%d calls, %d answers judged, %d windows: %d restarted windows, %d over-grants", calls.Load(), len(answers), len(granted), overlaps, overGrants)
	assert.Greater(t, len(granted), 50)
}
