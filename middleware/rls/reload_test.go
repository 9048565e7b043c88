package rls_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/internal/localserver"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/middleware/rls"
)

// redisStore returns a Redis backend on a fresh redis-server.
func redisStore(tb testing.TB) *redisbackend.Backend {
	tb.Helper()
	localserver.SkipIfShort(tb)
	srv := localserver.RedisT(tb, localserver.RedisOptions{})
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	tb.Cleanup(func() { client.Close() })
	b, err := redisbackend.New(client)
	require.NoError(tb, err)
	return b
}

// writeConfig replaces dir's configuration file atomically, as a deploy
// tool writing a new version of it would.
func writeConfig(tb testing.TB, dir, yaml string) {
	tb.Helper()
	tmp := filepath.Join(dir, ".next")
	require.NoError(tb, os.WriteFile(tmp, []byte(yaml), 0o644))
	require.NoError(tb, os.Rename(tmp, filepath.Join(dir, "config.yaml")))
}

// reloadConfig is the i-th configuration of TestReloadUnderLoad: rule
// "steady" never changes, "raised" gains 10 a reload, "churn" comes and
// goes.
func reloadConfig(i int) string {
	s := fmt.Sprintf(`
domain: rl
descriptors:
  - key: steady
    rate_limit: {unit: minute, requests_per_unit: 40}
  - key: raised
    rate_limit: {unit: minute, requests_per_unit: %d}
`, 30+10*i)
	if i%2 == 1 {
		s += `  - key: churn
    rate_limit: {unit: minute, requests_per_unit: 5}
`
	}
	return s
}

// TestReloadUnderLoad reloads the configuration from disk 10 times while 16
// gRPC callers ask about 20 values of each rule, on real Redis, with the
// clock moving 13 s between reloads so windows roll over meanwhile. Judged
// from responses alone: every response of one counter's window names the
// same reset moment (the window's aligned end), and no window grants more
// than the largest limit its rule had while it was open.
func TestReloadUnderLoad(t *testing.T) {
	dir := t.TempDir()
	writeConfig(t, dir, reloadConfig(0))
	f := newFixture(t, redisStore(t), nil)
	reloads := testkit.Count(t, "RLS_RELOADS", 10)

	events := make(chan rls.ReloadEvent, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var watching sync.WaitGroup
	watching.Add(1)
	go func() {
		defer watching.Done()
		assert.NoError(t, f.srv.Watch(ctx, dir, 20*time.Millisecond, nil, events))
	}()
	defer watching.Wait()
	defer cancel()
	// The first load: rewrite so the watcher, once started, picks it up.
	require.Eventually(t, func() bool {
		writeConfig(t, dir, reloadConfig(0))
		select {
		case ev := <-events:
			require.NoError(t, ev.Err)
			return true
		case <-time.After(200 * time.Millisecond):
			return false
		}
	}, 10*time.Second, time.Millisecond)

	type windowKey struct {
		rule, value string
		end         int64 // Unix ms
	}
	var (
		mu       sync.Mutex
		granted  = map[windowKey]int{}
		maxLimit = map[windowKey]uint32{}
		badReset atomic.Int64
		calls    atomic.Int64
	)
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
				rule := []string{"steady", "raised", "churn"}[(g+i)%3]
				value := strconv.Itoa((g*7 + i) % 20)
				before := f.clock.Now()
				resp, err := f.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
					Domain: "rl", Descriptors: []*commonv3.RateLimitDescriptor{desc(rule, value)}})
				after := f.clock.Now()
				if !assert.NoError(t, err) {
					return
				}
				calls.Add(1)
				st := resp.Statuses[0]
				if st.CurrentLimit == nil {
					continue // churn while it is gone
				}
				// The clock moves by 13 s steps; the decision read it at
				// one of the steps between before and after (a slow call
				// may span several), and only a minute boundary is a
				// window's end: the reading that gives one is the
				// decision's.
				d := st.DurationUntilReset.AsDuration()
				end := time.Time{}
				for at := before; !at.After(after); at = at.Add(13 * time.Second) {
					if e := at.Add(d); e.UnixMilli()%60000 == 0 {
						end = e
						break
					}
				}
				if end.IsZero() {
					badReset.Add(1)
					continue
				}
				k := windowKey{rule, value, end.UnixMilli()}
				mu.Lock()
				if st.Code == rlsv3.RateLimitResponse_OK {
					granted[k]++
				}
				maxLimit[k] = max(maxLimit[k], st.CurrentLimit.RequestsPerUnit)
				mu.Unlock()
			}
		}()
	}
	for i := 1; i <= reloads; i++ {
		time.Sleep(50 * time.Millisecond) // load runs meanwhile
		f.clock.Advance(13 * time.Second)
		writeConfig(t, dir, reloadConfig(i))
		select {
		case ev := <-events:
			require.NoError(t, ev.Err, "reload %d", i)
		case <-time.After(10 * time.Second):
			t.Fatalf("reload %d not seen", i)
		}
	}
	time.Sleep(50 * time.Millisecond)
	close(stop)
	load.Wait()

	overGrants := 0
	windows := 0
	for k, n := range granted {
		windows++
		if n > int(maxLimit[k]) {
			overGrants++
			t.Errorf("%s=%s window ending %d: %d granted, limit at most %d", k.rule, k.value, k.end, n, maxLimit[k])
		}
	}
	t.Logf("%d calls, %d windows, %d reloads: %d reset times off the window's end, %d over-grants",
		calls.Load(), windows, reloads, badReset.Load(), overGrants)
	assert.Zero(t, badReset.Load(), "responses naming a reset other than their window's stored end")
	assert.Greater(t, windows, 40)
}
