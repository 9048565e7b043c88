package redisgroups

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
	shardedbackend "github.com/throttlekit/throttlekit/backend/sharded"
	"github.com/throttlekit/throttlekit/internal/localserver"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
)

// The recovery test inflicts each fault recoveryLoops times on the primary
// of one group of a real three-group layout (each group a primary and a
// replica) and measures, for layouts with breakers and without, how long
// after that primary answers again decisions on its identifiers are
// healthy. The goal (issue 23) is 1 s, and the figures are logged; the
// assertion allows recoveryLimit, so that a loaded machine holds. The
// structure follows backend/redis's TestRecoveryStandalone, and so does the
// way the scheduler is kept out of the figure: the clock starts at the
// faulted primary's first reply to a fresh client (storeReturn), and the
// decisions that measure recovery run with recoveryCallTimeout.
const (
	recoveryLoops = 10
	// recoveryOutage is how long each outage lasts: long enough for a
	// breaker to open (breaker.DefaultFailingFor of failures).
	recoveryOutage = 400 * time.Millisecond
	recoveryLimit  = 5 * time.Second
	// recoveryCallTimeout bounds each decision that measures recovery:
	// the goal itself, so that a healthy call the loaded machine delays
	// past 100 ms does not read as the store still away.
	recoveryCallTimeout = time.Second
	// healthyRun is how many healthy decisions in a row end a recovery.
	healthyRun = 10
	// warmWorkers decide at once before each fault, so that the faulted
	// primary's pool holds many idle connections for the fault to kill;
	// outageWorkers decide through the outage, few enough that a breaker
	// opens with dead connections still idle in the pool.
	warmWorkers   = 32
	outageWorkers = 2
	// othersTimeout is the call timeout of the decisions on the other
	// groups' identifiers. They must never be degraded; a loaded machine
	// can stall a healthy call past the default 100 ms now and then (15 of
	// 581,135 in the load measurement of docs/DESIGN.md), which is not the
	// fault's doing, so these calls get more time. What the fault could
	// spill over (a shared breaker, pool or batch) fails them at once or
	// for the whole outage.
	othersTimeout = time.Second
)

// recoveryNames are the groups; the first is the one faulted.
var recoveryNames = []string{"a", "b", "c"}

// recoveryServers are the servers of the layout: primaries[0] keeps its
// data through restarts (appendfsync always) and has a proxy in front for
// the network faults.
type recoveryServers struct {
	primaries, replicas []*localserver.Redis
	proxy               *localserver.Proxy
}

func startRecoveryServers(t *testing.T) *recoveryServers {
	localserver.SkipIfShort(t)
	s := &recoveryServers{}
	for i := range recoveryNames {
		var opts localserver.RedisOptions
		if i == 0 {
			opts.Args = []string{"--appendonly", "yes", "--appendfsync", "always"}
		}
		p := localserver.RedisT(t, opts)
		s.primaries = append(s.primaries, p)
		s.replicas = append(s.replicas, localserver.RedisReplicaT(t, p, localserver.RedisOptions{}))
	}
	s.proxy = localserver.ProxyT(t, s.primaries[0].Addr())
	return s
}

// layout returns the groups with the faulted group's primary at addr (its
// own address or the proxy's).
func (s *recoveryServers) layout(faultedAddr string) []Config {
	groups := make([]Config, len(recoveryNames))
	for i, name := range recoveryNames {
		addr := s.primaries[i].Addr()
		if i == 0 {
			addr = faultedAddr
		}
		groups[i] = Config{
			Name:     name,
			Primary:  &goredis.Options{Addr: addr},
			Replicas: []*goredis.Options{{Addr: s.replicas[i].Addr()}},
		}
	}
	return groups
}

// breakerLog follows the state of every breaker of one layout.
type breakerLog struct {
	mu      sync.Mutex
	state   map[string]breaker.State
	opened  map[string]int
	changes []breakerChange
}

// breakerChange is one state change, as a slow recovery's log shows it.
type breakerChange struct {
	at     time.Time
	server string
	to     breaker.State
}

func newBreakerLog() *breakerLog {
	return &breakerLog{state: map[string]breaker.State{}, opened: map[string]int{}}
}

func (l *breakerLog) change(server string, _, to breaker.State) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.state[server] = to
	l.changes = append(l.changes, breakerChange{time.Now(), server, to})
	if to == breaker.Open {
		l.opened[server]++
	}
}

// closed reports whether server's breaker is closed (or was never made).
func (l *breakerLog) closed(server string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	st, ok := l.state[server]
	return !ok || st == breaker.Closed
}

// since returns server's state changes from start on, each as its time
// relative to ref and its new state.
func (l *breakerLog) since(server string, start, ref time.Time) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, c := range l.changes {
		if c.server == server && !c.at.Before(start) {
			out = append(out, fmt.Sprintf("%v %v", c.at.Sub(ref).Round(time.Millisecond), c.to))
		}
	}
	return out
}

// openedElsewhere returns the servers other than faulted whose breaker
// opened, with how often.
func (l *breakerLog) openedElsewhere(faulted string) map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := map[string]int{}
	for server, n := range l.opened {
		if server != faulted && n > 0 {
			m[server] = n
		}
	}
	return m
}

// recoverySide is one layout, with its throttler, whose recovery is
// measured.
type recoverySide struct {
	name     string
	prefix   string
	th       *throttler.Throttler
	breakers *breakerLog // nil without breakers
	times    []time.Duration
	opened   int // loops in which the faulted primary's breaker was open at the end of the outage
}

// recoverySides returns layouts with breakers and without, batched (the
// default) and not, with the faulted group's primary at faultedAddr, on
// keys of their own. Unbatched, decisions at once take a pooled connection
// each, so the pool holds many idle connections when the fault strikes.
func recoverySides(t *testing.T, s *recoveryServers, faultedAddr string) []*recoverySide {
	var sides []*recoverySide
	for _, batched := range []bool{true, false} {
		for _, withBreaker := range []bool{true, false} {
			side := &recoverySide{name: "breaker off", prefix: newPrefix()}
			opts := []redisbackend.Option{redisbackend.WithPrefix(side.prefix), redisbackend.WithoutBreaker()}
			if withBreaker {
				side.name = "breaker on"
				side.breakers = newBreakerLog()
				opts = append(opts, redisbackend.WithBreaker(breaker.WithLogger(nil), breaker.WithStateChange(side.breakers.change)))
			}
			if !batched {
				side.name += ", unbatched"
				opts = append(opts, redisbackend.WithoutBatching())
			}
			b, err := New(s.layout(faultedAddr), WithBackendOptions(opts...))
			require.NoError(t, err)
			t.Cleanup(func() { _ = b.Close() })
			side.th = testkit.Throttler(t, b, throttler.WithLogger(nil))
			sides = append(sides, side)
		}
	}
	return sides
}

// groupFault is a fault on the faulted group's primary: inflict starts it,
// restore ends it and returns once the primary answers again.
type groupFault struct {
	name    string
	outage  time.Duration
	inflict func(t *testing.T)
	restore func(t *testing.T)
}

// decisionCounts counts decisions on one identifier.
type decisionCounts struct {
	mu       sync.Mutex
	attempts int64 // decisions made: an upper bound on what the store counted
	healthy  int64 // decisions the store answered: a lower bound
}

func (c *decisionCounts) add(r throttler.Result) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.attempts++
	if !r.Degraded {
		c.healthy++
	}
}

// ownedBy returns the first of base-0, base-1... that group owns.
func ownedBy(group, base string) string {
	for k := 0; ; k++ {
		id := fmt.Sprintf("%s-%d", base, k)
		if shardedbackend.Owner(recoveryNames, id) == group {
			return id
		}
	}
}

// othersTraffic is the traffic on identifiers owned by the groups not
// faulted: two of each, decided on in turn by run, with every decision
// counted and every degraded one kept.
type othersTraffic struct {
	ids      []string
	counts   map[string]*decisionCounts
	degraded []throttler.Result
}

func newOthersTraffic(base string) *othersTraffic {
	o := &othersTraffic{counts: map[string]*decisionCounts{}}
	for _, g := range recoveryNames[1:] {
		for k := range 2 {
			id := ownedBy(g, fmt.Sprintf("%s-%s%d", base, g, k))
			o.ids = append(o.ids, id)
			o.counts[id] = new(decisionCounts)
		}
	}
	return o
}

// run decides on o's identifiers in turn, one every 2 ms, until stop is
// closed.
func (o *othersTraffic) run(t *testing.T, th *throttler.Throttler, p *throttler.Policy, stop chan struct{}) {
	ctx := context.Background()
	for i := 0; ; i++ {
		select {
		case <-stop:
			return
		case <-time.After(2 * time.Millisecond):
		}
		id := o.ids[i%len(o.ids)]
		r, err := th.Allow(ctx, p, id)
		if err != nil {
			t.Errorf("other group's identifier %s: %v", id, err)
			return
		}
		o.counts[id].add(r)
		if r.Degraded {
			o.degraded = append(o.degraded, r)
		}
	}
}

// peekUsed returns the units id holds under p at the server at addr, read
// through a fresh client (none of the fault's dead connections) on keys
// with prefix.
func peekUsed(t *testing.T, addr, prefix string, p *throttler.Policy, id string) int64 {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer func() { _ = c.Close() }()
	b, err := redisbackend.New(c, redisbackend.WithPrefix(prefix))
	require.NoError(t, err)
	th := testkit.Throttler(t, b, throttler.WithLogger(nil), throttler.WithCallTimeout(5*time.Second))
	r, err := th.Peek(context.Background(), p, id)
	require.NoError(t, err)
	require.False(t, r.Degraded, "peek of %s at %s: %v", id, addr, r.Err)
	return r.Limits()[0].Used
}

// storeReturn returns when the server at addr answers again: the first
// reply to a PING from a fresh client, with none of the fault's dead
// connections, asked every millisecond. It fails t after recoveryLimit.
func storeReturn(t *testing.T, addr string) time.Time {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: addr, MaxRetries: -1, PoolSize: 1,
		DialTimeout: recoveryCallTimeout, ReadTimeout: recoveryCallTimeout, WriteTimeout: recoveryCallTimeout})
	defer func() { _ = c.Close() }()
	deadline := time.Now().Add(recoveryLimit)
	for {
		err := c.Ping(context.Background()).Err()
		if err == nil {
			return time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("the primary at %s did not answer within %v of the fault's end: %v", addr, recoveryLimit, err)
		}
		time.Sleep(time.Millisecond)
	}
}

// runGroupRecovery inflicts f recoveryLoops times on the faulted group's
// primary (known to the layouts' clients as faultedAddr) and checks, for
// every side: decisions on the faulted group's identifiers are healthy
// again within recoveryLimit of the primary answering, its count holds
// every decision it answered and none it was not sent; the other groups'
// identifiers, decided on all along, are never degraded and their counts
// hold every decision exactly; no other server's breaker ever opens.
func runGroupRecovery(t *testing.T, s *recoveryServers, faultedAddr string, f groupFault) {
	sides := recoverySides(t, s, faultedAddr)
	ctx := context.Background()
	p := mustPolicy(t, "recovery", "1000000/h")
	pOthers := mustPolicy(t, "recovery-others", "1000000/h", throttler.WithCallTimeout(othersTimeout))
	// p's limits and keys, decided with the longer timeout.
	pMeasure := mustPolicy(t, "recovery", "1000000/h", throttler.WithCallTimeout(recoveryCallTimeout))

	stopOthers := make(chan struct{})
	var othersWG sync.WaitGroup
	others := make([]*othersTraffic, len(sides))
	for i, side := range sides {
		others[i] = newOthersTraffic(f.name)
		othersWG.Add(1)
		go func() {
			defer othersWG.Done()
			others[i].run(t, side.th, pOthers, stopOthers)
		}()
	}
	othersStopped := false
	stopOthersTraffic := func() {
		if !othersStopped {
			othersStopped = true
			close(stopOthers)
			othersWG.Wait()
		}
	}
	defer stopOthersTraffic()

	for loop := range recoveryLoops {
		id := ownedBy(recoveryNames[0], fmt.Sprintf("%s-%d", f.name, loop))
		counts := make([]*decisionCounts, len(sides))
		var wg sync.WaitGroup
		for i, side := range sides {
			counts[i] = new(decisionCounts)
			for range warmWorkers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 5 {
						if r, err := side.th.Allow(ctx, p, id); err == nil {
							counts[i].add(r)
						}
					}
				}()
			}
		}
		wg.Wait()

		struck := time.Now()
		f.inflict(t)
		stop := make(chan struct{})
		for i, side := range sides {
			for range outageWorkers {
				wg.Add(1)
				go func() { // traffic through the outage, so that breakers open
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						case <-time.After(2 * time.Millisecond):
						}
						if r, err := side.th.Allow(ctx, p, id); err == nil {
							counts[i].add(r)
						}
					}
				}()
			}
		}
		time.Sleep(f.outage)
		close(stop)
		wg.Wait()
		for _, side := range sides {
			if side.breakers != nil && !side.breakers.closed(faultedAddr) {
				side.opened++
			}
		}
		f.restore(t)
		back := storeReturn(t, faultedAddr)

		errs := make([]error, len(sides))
		for i, side := range sides {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var first time.Time
				run := 0
				for time.Since(back) < recoveryLimit {
					r, err := side.th.Allow(ctx, pMeasure, id)
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
						side.times = append(side.times, max(first.Sub(back), 0))
						return
					}
					time.Sleep(2 * time.Millisecond)
				}
				errs[i] = fmt.Errorf("still not %d healthy decisions in a row %v after the primary answered", healthyRun, recoveryLimit)
			}()
		}
		wg.Wait()
		for i, side := range sides {
			// A slow recovery logs the faulted primary's breaker changes.
			if side.breakers != nil && (errs[i] != nil || side.times[len(side.times)-1] > recoveryLimit/10) {
				t.Logf("%s, loop %d: slow recovery; the faulted primary's breaker, from the store answering again: %v",
					side.name, loop, side.breakers.since(faultedAddr, struck, back))
			}
			require.NoError(t, errs[i], "%s, loop %d", side.name, loop)
			used := peekUsed(t, s.primaries[0].Addr(), side.prefix, p, id)
			require.GreaterOrEqual(t, used, counts[i].healthy, "%s, loop %d: a decision the primary answered was lost", side.name, loop)
			require.LessOrEqual(t, used, counts[i].attempts, "%s, loop %d: counted more than was decided", side.name, loop)
		}
	}

	stopOthersTraffic()
	for i, side := range sides {
		o := others[i]
		if len(o.degraded) > 0 {
			t.Errorf("%s: %d decisions on other groups' identifiers degraded during %s of group %s's primary, the first: %v",
				side.name, len(o.degraded), f.name, recoveryNames[0], o.degraded[0].Err)
		}
		if side.breakers != nil {
			require.Empty(t, side.breakers.openedElsewhere(faultedAddr), "%s: breakers of servers not faulted opened", side.name)
		}
		var decided int64
		for _, oid := range o.ids {
			g := slices.Index(recoveryNames, shardedbackend.Owner(recoveryNames, oid))
			c := o.counts[oid]
			decided += c.attempts
			used := peekUsed(t, s.primaries[g].Addr(), side.prefix, pOthers, oid)
			require.Equal(t, c.attempts, used, "%s: %s (group %s) counted %d of its %d decisions", side.name, oid, recoveryNames[g], used, c.attempts)
		}
		require.NotZero(t, decided, "%s: no decision on the other groups' identifiers", side.name)
		t.Logf("%s, %s: recovered in min %v / median %v / max %v over %d runs (goal <= 1s); breaker open at the end of the outage in %d runs; other groups: %d decisions, %d degraded",
			f.name, side.name, durMin(side.times), durMedian(side.times), durMax(side.times), len(side.times), side.opened, decided, len(o.degraded))
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

func durMedian(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sorted := slices.Clone(ds)
	slices.Sort(sorted)
	return sorted[len(sorted)/2].Round(100 * time.Microsecond)
}

// Group a's primary of a three-group layout (a primary and a replica
// each) is restarted, killed with SIGKILL, hung with SIGSTOP, black-holed
// and healed, or has its connections reset, 10 times each, under layouts
// with per-server breakers (WithBackendOptions(redisbackend.WithBreaker()))
// and without, batched and not. Group a keeps its data through restarts
// (appendfsync always); groups b and c are decided on throughout.
func TestRecoveryGroupPrimary(t *testing.T) {
	s := startRecoveryServers(t)
	server := s.primaries[0]
	direct, proxied := server.Addr(), s.proxy.Addr()
	noop := func(*testing.T) {}
	for _, tc := range []struct {
		fault groupFault
		addr  string
	}{
		{groupFault{"restart", recoveryOutage,
			func(t *testing.T) { require.NoError(t, server.Stop()) },
			func(t *testing.T) { require.NoError(t, server.Start()) }}, direct},
		{groupFault{"kill -9", recoveryOutage,
			func(*testing.T) { server.Kill() },
			func(t *testing.T) { require.NoError(t, server.Start()) }}, direct},
		{groupFault{"SIGSTOP", recoveryOutage,
			func(t *testing.T) { require.NoError(t, server.Pause()); t.Cleanup(func() { _ = server.Resume() }) },
			func(t *testing.T) { require.NoError(t, server.Resume()) }}, direct},
		{groupFault{"black hole", recoveryOutage,
			func(*testing.T) { s.proxy.BlackHole() },
			func(*testing.T) { s.proxy.Heal() }}, proxied},
		{groupFault{"reset", 0,
			func(*testing.T) { s.proxy.Reset() }, noop}, proxied},
	} {
		t.Run(tc.fault.name, func(t *testing.T) {
			runGroupRecovery(t, s, tc.addr, tc.fault)
		})
	}
}
