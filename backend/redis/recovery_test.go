package redisbackend_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/breaker"
	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/internal/localserver"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
)

// The recovery tests inflict each fault recoveryLoops times on real
// servers and measure, for a backend with breakers and one without, how
// long after the store answers again its decisions are healthy. The goal
// (issue 23) is 1 s, and the figures are logged; the assertion allows
// recoveryLimit, so that a loaded machine holds.
//
// Two things keep the scheduler of a loaded machine out of the figure
// while a slow recovery still fails. The clock starts when a fresh client
// gets the store's first reply (storeReturn), not when the fault's restore
// returned: a SIGCONT or a restart is not the store answering. And the
// decisions that measure recovery run with recoveryCallTimeout, the goal
// itself, instead of the 100 ms production timeout: under -race at a load
// of 10 on two cores a healthy call now and then takes longer than 100 ms,
// which reset the run of healthy decisions again and again, whereas a
// store not yet back fails them whatever the timeout (refused, reset), or
// holds them for the whole second (a dead connection), which the figure
// then shows.
const (
	recoveryLoops = 10
	// recoveryOutage is how long each outage lasts: long enough for a
	// breaker to open (breaker.DefaultFailingFor of failures).
	recoveryOutage = 400 * time.Millisecond
	recoveryLimit  = 5 * time.Second
	// recoveryCallTimeout bounds each decision that measures recovery.
	recoveryCallTimeout = time.Second
	// healthyRun is how many healthy decisions in a row end a recovery.
	healthyRun = 10
	// warmWorkers decide at once before each fault, so that the pool holds
	// many idle connections for the fault to kill; outageWorkers decide
	// through the outage, few enough that a breaker opens with dead
	// connections still idle in the pool (the case of issue 23).
	warmWorkers   = 32
	outageWorkers = 2
)

// recoverySide is one throttler whose recovery is measured.
type recoverySide struct {
	name     string
	th       *throttler.Throttler
	breakers func() []breaker.Status
	times    []time.Duration
	opened   int // loops in which a breaker was open at the end of the outage
}

// outageFault is a fault: inflict starts it, restore ends it and returns
// once the store answers again.
type outageFault struct {
	name    string
	outage  time.Duration
	inflict func(t *testing.T)
	restore func(t *testing.T)
	// addrs are where the store answers once restored: the addresses the
	// measured clients use (every node of a Cluster).
	addrs []string
}

// storeReturn returns when the store at addrs answers again: the first
// reply to a PING from a fresh client, with none of the fault's dead
// connections, asked every millisecond, from the last of addrs to answer.
// It fails t after recoveryLimit.
func storeReturn(t *testing.T, addrs ...string) time.Time {
	t.Helper()
	deadline := time.Now().Add(recoveryLimit)
	for _, addr := range addrs {
		c := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1, PoolSize: 1,
			DialTimeout: recoveryCallTimeout, ReadTimeout: recoveryCallTimeout, WriteTimeout: recoveryCallTimeout})
		for {
			err := c.Ping(context.Background()).Err()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				_ = c.Close()
				t.Fatalf("the store at %s did not answer within %v of the fault's end: %v", addr, recoveryLimit, err)
			}
			time.Sleep(time.Millisecond)
		}
		_ = c.Close()
	}
	return time.Now()
}

// sideCounts counts one side's decisions on one loop's identifier.
type sideCounts struct {
	mu       sync.Mutex
	attempts int64 // decisions made: an upper bound on what the store counted
	healthy  int64 // decisions the store answered: a lower bound
}

func (c *sideCounts) add(r throttler.Result) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.attempts++
	if !r.Degraded {
		c.healthy++
	}
}

// runRecovery inflicts f recoveryLoops times and checks, for every side,
// that decisions are healthy again within recoveryLimit of the store
// answering, and that the store's count of the loop's identifier holds
// every decision it answered.
func runRecovery(t *testing.T, f outageFault, sides ...*recoverySide) {
	ctx := context.Background()
	p := mustPolicy(t, "recovery", "1000000/h")
	// The same limits and keys, decided with the longer timeout.
	pMeasure := mustPolicy(t, "recovery", "1000000/h", throttler.WithCallTimeout(recoveryCallTimeout))
	for loop := range recoveryLoops {
		id := fmt.Sprintf("%s-%d", f.name, loop)
		counts := make([]*sideCounts, len(sides))
		var wg sync.WaitGroup
		for i, s := range sides {
			counts[i] = new(sideCounts)
			for range warmWorkers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 5 {
						r, err := s.th.Allow(ctx, p, id)
						if err == nil {
							counts[i].add(r)
						}
					}
				}()
			}
		}
		wg.Wait()

		f.inflict(t)
		stop := make(chan struct{})
		for i, s := range sides {
			for range outageWorkers {
				wg.Add(1)
				go func() { // traffic through the outage, so that breakers open
					defer wg.Done()
					outageTraffic(ctx, s.th, p, id, counts[i], stop)
				}()
			}
		}
		time.Sleep(f.outage)
		close(stop)
		wg.Wait()
		for _, s := range sides {
			if s.breakers != nil && slices.ContainsFunc(s.breakers(), func(st breaker.Status) bool { return st.State != breaker.Closed }) {
				s.opened++
			}
		}
		f.restore(t)
		back := storeReturn(t, f.addrs...)

		errs := make([]error, len(sides))
		for i, s := range sides {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var first time.Time
				run := 0
				for time.Since(back) < recoveryLimit {
					r, err := s.th.Allow(ctx, pMeasure, id)
					if err != nil {
						errs[i] = err
						return
					}
					counts[i].add(r)
					if r.Degraded {
						run = 0
					} else if run++; run == 1 {
						first = time.Now()
					}
					if run >= healthyRun {
						s.times = append(s.times, max(first.Sub(back), 0))
						return
					}
					time.Sleep(2 * time.Millisecond)
				}
				errs[i] = fmt.Errorf("still not %d healthy decisions in a row %v after the store answered", healthyRun, recoveryLimit)
			}()
		}
		wg.Wait()
		for i, s := range sides {
			require.NoError(t, errs[i], "%s, loop %d", s.name, loop)
			r, err := s.th.Peek(ctx, p, id)
			require.NoError(t, err)
			require.False(t, r.Degraded, "%s: %v", s.name, r.Err)
			used := r.Limits()[0].Used
			require.GreaterOrEqual(t, used, counts[i].healthy, "%s, loop %d: a decision the store answered was lost", s.name, loop)
			require.LessOrEqual(t, used, counts[i].attempts, "%s, loop %d: counted more than was decided", s.name, loop)
		}
	}
	for _, s := range sides {
		t.Logf("%s, %s: recovered in min %v / median %v / max %v over %d runs (goal <= 1s); breaker open at the end of the outage in %d runs",
			f.name, s.name, durMin(s.times), median(slices.Clone(s.times)).Round(100*time.Microsecond), durMax(s.times), len(s.times), s.opened)
	}
}

// outageTraffic decides on id every 2 ms until stop is closed.
func outageTraffic(ctx context.Context, th *throttler.Throttler, p *throttler.Policy, id string, counts *sideCounts, stop chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-time.After(2 * time.Millisecond):
		}
		r, err := th.Allow(ctx, p, id)
		if err == nil {
			counts.add(r)
		}
	}
}

func durMin(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return slices.Min(ds).Round(100 * time.Microsecond)
}

func durMax(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	return slices.Max(ds).Round(100 * time.Microsecond)
}

// redisSides returns throttlers with breakers and without, batched (the
// default) and not, over clients that newClient makes, on keys of their
// own. Unbatched, decisions at once take a pooled connection each, so the
// pool holds many idle connections when the fault strikes.
func redisSides(t *testing.T, newClient func() redisbackend.Client) []*recoverySide {
	var sides []*recoverySide
	for _, batched := range []bool{true, false} {
		opts := []redisbackend.Option{redisbackend.WithPrefix(newPrefix())}
		suffix := ""
		if !batched {
			opts = append(opts, redisbackend.WithoutBatching())
			suffix = ", unbatched"
		}
		on := mustBackend(t, newClient(), append(opts, redisbackend.WithBreaker(breaker.WithLogger(nil)))...)
		opts[0] = redisbackend.WithPrefix(newPrefix())
		off := mustBackend(t, newClient(), append(opts, redisbackend.WithoutBreaker())...)
		sides = append(sides,
			&recoverySide{name: "breaker on" + suffix, th: testkit.Throttler(t, on, throttler.WithLogger(nil)), breakers: on.Breakers},
			&recoverySide{name: "breaker off" + suffix, th: testkit.Throttler(t, off, throttler.WithLogger(nil))})
	}
	return sides
}

// ctxClient returns a client as the package documentation builds one: its
// socket deadlines come from the call's context.
func ctxClient(t *testing.T, addr string) *goredis.Client {
	c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// A standalone Redis that keeps its data through restarts (appendfsync
// always), behind a proxy for the network faults: every fault, both with
// and without breakers.
func TestRecoveryStandalone(t *testing.T) {
	server := localserver.RedisT(t, localserver.RedisOptions{Args: []string{"--appendonly", "yes", "--appendfsync", "always"}})
	proxy := localserver.ProxyT(t, server.Addr())
	direct := func() redisbackend.Client { return ctxClient(t, server.Addr()) }
	proxied := func() redisbackend.Client { return ctxClient(t, proxy.Addr()) }
	noop := func(*testing.T) {}
	for _, tc := range []struct {
		fault  outageFault
		client func() redisbackend.Client
	}{
		{outageFault{"restart", recoveryOutage,
			func(t *testing.T) { require.NoError(t, server.Stop()) },
			func(t *testing.T) { require.NoError(t, server.Start()) }, []string{server.Addr()}}, direct},
		{outageFault{"kill -9", recoveryOutage,
			func(*testing.T) { server.Kill() },
			func(t *testing.T) { require.NoError(t, server.Start()) }, []string{server.Addr()}}, direct},
		{outageFault{"SIGSTOP", recoveryOutage,
			func(t *testing.T) { require.NoError(t, server.Pause()); t.Cleanup(func() { _ = server.Resume() }) },
			func(t *testing.T) { require.NoError(t, server.Resume()) }, []string{server.Addr()}}, direct},
		{outageFault{"black hole", recoveryOutage,
			func(*testing.T) { proxy.BlackHole() },
			func(*testing.T) { proxy.Heal() }, []string{proxy.Addr()}}, proxied},
		{outageFault{"reset", 0,
			func(*testing.T) { proxy.Reset() }, noop, []string{proxy.Addr()}}, proxied},
	} {
		t.Run(tc.fault.name, func(t *testing.T) {
			runRecovery(t, tc.fault, redisSides(t, tc.client)...)
		})
	}
}

// A Redis Cluster whose every node hangs (SIGSTOP, for less than the
// cluster's node timeout: no failover), or closes every client
// connection.
func TestRecoveryCluster(t *testing.T) {
	c := cluster(t)
	newCC := func() redisbackend.Client {
		return goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: c.Addrs(), ContextTimeoutEnabled: true})
	}
	clients := []redisbackend.Client{}
	t.Cleanup(func() {
		for _, cc := range clients {
			_ = cc.(*goredis.ClusterClient).Close()
		}
	})
	mk := func() redisbackend.Client { cc := newCC(); clients = append(clients, cc); return cc }
	for _, f := range []outageFault{
		{"SIGSTOP", recoveryOutage,
			func(t *testing.T) {
				for _, n := range c.Nodes() {
					require.NoError(t, n.Pause())
					t.Cleanup(func() { _ = n.Resume() })
				}
			},
			func(t *testing.T) {
				for _, n := range c.Nodes() {
					require.NoError(t, n.Resume())
				}
			}, c.Addrs()},
		{"reset", 0,
			func(t *testing.T) {
				for _, n := range c.Nodes() {
					admin := goredis.NewClient(&goredis.Options{Addr: n.Addr()})
					require.NoError(t, admin.Do(context.Background(), "CLIENT", "KILL", "TYPE", "normal").Err())
					_ = admin.Close()
				}
			},
			func(*testing.T) {}, c.Addrs()},
	} {
		t.Run(f.name, func(t *testing.T) {
			runRecovery(t, f, redisSides(t, mk)...)
		})
	}
}
