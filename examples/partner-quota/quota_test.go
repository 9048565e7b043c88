package main

import (
	"context"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/internal/localserver"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// TestEightWorkersShareTheFiveWindowQuota: 8 workers take the partner's
// quota through one real Redis for 70 minutes of a manual clock, with
// batches and Wait. No window of any limit ever holds more than its quota,
// and the first minute and the first hour are used to the last call.
func TestEightWorkersShareTheFiveWindowQuota(t *testing.T) {
	localserver.SkipIfShort(t)
	srv := localserver.RedisT(t, localserver.RedisOptions{})
	client := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	backend, err := redisbackend.New(client)
	require.NoError(t, err)
	clock := throttlertest.NewManualClock(testkit.T0)
	th, err := throttler.New(backend, throttler.WithClock(clock), throttler.WithFailureMode(throttler.FailClosed),
		throttler.WithCallTimeout(5*time.Second))
	require.NoError(t, err)
	p, err := throttler.ParsePolicy("partner", partnerQuota)
	require.NoError(t, err)

	// The clock moves a second every 200 µs of real time, while the
	// workers take batches and sleep in Wait on it.
	const simulated = 70 * time.Minute
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var sent atomic.Int64
	done := make(chan struct{})
	var stats *Stats
	var runErr error
	go func() {
		defer close(done)
		stats, runErr = run(ctx, th, p, 8, 50, func(n int64) { sent.Add(n) })
	}()
	deadline := time.Now().Add(2 * time.Minute)
	for clock.Now().Before(testkit.T0.Add(simulated)) && time.Now().Before(deadline) {
		clock.Advance(time.Second)
		time.Sleep(200 * time.Microsecond)
	}
	cancel()
	<-done
	require.NoError(t, runErr)
	require.False(t, clock.Now().Before(testkit.T0.Add(simulated)), "the simulation ran out of real time")

	// Sum the grants by window: a fixed window is known by its ResetAt,
	// the same for every result in it.
	type window struct {
		limit string
		end   time.Time
	}
	used := map[window]int64{}
	quota := map[string]int64{}
	for _, r := range stats.Grants {
		require.True(t, r.Allowed)
		for _, l := range r.Limits() {
			used[window{l.Name, l.ResetAt}] += r.Granted
			quota[l.Name] = l.Limit
		}
	}
	var windows []window
	for w := range used {
		windows = append(windows, w)
	}
	sort.Slice(windows, func(i, j int) bool { return windows[i].end.Before(windows[j].end) })
	first := map[string]int64{}
	for _, w := range windows {
		assert.LessOrEqual(t, used[w], quota[w.limit], "window %s ending T0+%v", w.limit, w.end.Sub(testkit.T0))
		if _, ok := first[w.limit]; !ok {
			first[w.limit] = used[w]
		}
	}
	assert.EqualValues(t, 300, first["300/min"], "the first minute is used to the last call")
	assert.EqualValues(t, 15750, first["15750/h"], "the first hour is used to the last call")
	assert.Equal(t, sent.Load(), stats.BatchUnits+stats.Waits)
	r, err := th.Peek(context.Background(), p, subject)
	require.NoError(t, err)
	for _, l := range r.Limits() {
		assert.LessOrEqual(t, l.Used, l.Limit, l.Name)
	}
	t.Logf("%d batches (%d calls) and %d calls after Wait in %v of clock time; first minute %d of 300, first hour %d of 15750; %d windows checked",
		stats.Batches, stats.BatchUnits, stats.Waits, simulated, first["300/min"], first["15750/h"], len(windows))
}
