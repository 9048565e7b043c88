package redisgroups

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
)

// observed is one non-degraded result as a client read it.
type observed struct {
	allowed bool
	used    []int64
	resetAt []time.Time
}

// TestStallNeverMakesUpAVerdict stops one group's primary (SIGSTOP) for
// 250 ms of every second while 64 goroutines decide over 400 identifiers
// under two policies, on every group, with the default options: batching
// on, the 100 ms call timeout. Calls queued behind a stalled round trip
// time out and leave; calls of the healthy groups go on. It stops the
// primary 8 times, or THROTTLEKIT_STALL_BURSTS. Afterwards, with
// every server answering, it reads what each store holds and checks every
// result that was not marked degraded against it: the store's reply to
// that very request, from the group that owns the identifier. Windows
// last an hour, so each identifier's window is the one the store holds at
// the end: a result with another reset time, or with a count the store
// never reached, or two allowed results with the same count, describes a
// decision the store never made.
func TestStallNeverMakesUpAVerdict(t *testing.T) {
	ts := servers(t)
	b, _ := openShared(t, ts, "")
	// The default call timeout and clock, as in production.
	th := testkit.Throttler(t, b, throttler.WithLogger(nil))
	// The final reads get all the time they need.
	reader := testkit.Throttler(t, b, throttler.WithLogger(nil), throttler.WithCallTimeout(10*time.Second))
	policies := []*throttler.Policy{
		mustPolicy(t, "api", "1000000/h"),
		mustPolicy(t, "search", "1000000/h, 5000000/d"),
	}
	ids := identifiers(400)
	const stalled = "a"
	server := ts.primaries[ts.index(t, stalled)]

	type key struct {
		policy int
		id     string
	}
	var (
		mu       sync.Mutex
		seen     = map[key][]observed{}
		degraded int
		calls    int
	)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var workers sync.WaitGroup
	for w := range 64 {
		workers.Add(1)
		go func() {
			defer workers.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 27))
			for ctx.Err() == nil {
				k := key{rng.IntN(len(policies)), ids[rng.IntN(len(ids))]}
				r, err := th.Allow(context.Background(), policies[k.policy], k.id)
				if err != nil {
					t.Errorf("Allow(%s, %s): %v", policies[k.policy].Name(), k.id, err)
					return
				}
				mu.Lock()
				calls++
				if r.Degraded {
					degraded++
				} else {
					o := observed{allowed: r.Allowed}
					for _, l := range r.Limits() {
						o.used = append(o.used, l.Used)
						o.resetAt = append(o.resetAt, l.ResetAt)
					}
					seen[k] = append(seen[k], o)
				}
				mu.Unlock()
			}
		}()
	}

	paused := false
	defer func() {
		if paused {
			_ = server.Resume()
		}
	}()
	bursts := testkit.Count(t, "THROTTLEKIT_STALL_BURSTS", 8)
	for range bursts {
		time.Sleep(750 * time.Millisecond)
		require.NoError(t, server.Pause())
		paused = true
		time.Sleep(250 * time.Millisecond)
		require.NoError(t, server.Resume())
		paused = false
	}
	time.Sleep(250 * time.Millisecond)
	stop()
	workers.Wait()

	contradictions := 0
	report := func(format string, args ...any) {
		contradictions++
		if contradictions <= 10 {
			t.Errorf(format, args...)
		}
	}
	for k, results := range seen {
		p := policies[k.policy]
		held, err := reader.Peek(context.Background(), p, k.id)
		require.NoError(t, err)
		require.Falsef(t, held.Degraded, "reading %s/%s after the stalls: %v", p.Name(), k.id, held.Err)
		limits := held.Limits()
		counts := map[int64]bool{}
		for _, o := range results {
			for i, l := range limits {
				if !o.resetAt[i].Equal(l.ResetAt) {
					report("%s/%s (group %s): a result with limit %s used %d resetting at %s, but the store's window resets at %s (used %d)",
						p.Name(), k.id, b.ShardFor(k.id), l.Name, o.used[i], o.resetAt[i].Format(time.RFC3339Nano),
						l.ResetAt.Format(time.RFC3339Nano), l.Used)
				}
				if o.used[i] > l.Used {
					report("%s/%s (group %s): a result with limit %s used %d, more than the store ever counted (%d)",
						p.Name(), k.id, b.ShardFor(k.id), l.Name, o.used[i], l.Used)
				}
			}
			if o.allowed {
				if counts[o.used[0]] {
					report("%s/%s (group %s): two allowed results with used %d", p.Name(), k.id, b.ShardFor(k.id), o.used[0])
				}
				counts[o.used[0]] = true
			}
		}
	}
	t.Logf("%d stalls of group %q: %d decisions, %d degraded, %d not degraded over %d (policy, identifier) pairs; %d contradict the store",
		bursts, stalled, calls, degraded, calls-degraded, len(seen), contradictions)
	require.Zero(t, contradictions, "results that no store decided")
	require.Positive(t, degraded, "the stalls degraded nothing: the test did not stall the group")
}
