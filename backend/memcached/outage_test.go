package memcachedbackend

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/breaker"
	"github.com/throttlekit/throttlekit/internal/localserver"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
)

// The outage tests put one server of three out of service under load
// (64 goroutines over 300 identifiers, the backend's default options) and
// check what its breaker promises: the other servers' identifiers see
// nothing of it, the lost server's identifiers are answered by its open
// breaker without a round trip once it is found dead, and decide normally
// again once it is back. Assertions are properties; the figures
// (latencies, how long until the breaker opened, recovery) are logged.
//
// THROTTLEKIT_MEMCACHED_OUTAGE_RUNS sets the runs per fault (3),
// THROTTLEKIT_MEMCACHED_OUTAGE_SECONDS how long each outage lasts (3) and
// THROTTLEKIT_MEMCACHED_OUTAGE_TIMEOUT_MS the client's Timeout, which is
// also the call timeout (1000: on a machine loaded by other test suites a
// healthy call can take longer than 100 ms, and a degraded decision of a
// healthy server would then say nothing about the lost one). The figures
// of the package documentation come from 10 runs of 10 s at 100 ms.
const (
	outageGoroutines  = 64
	outageIdentifiers = 300
	// outageBefore is the load before the fault, for the healthy
	// servers' latency before.
	outageBefore = time.Second
	// outageRecoveryLimit bounds the wait for the lost server's
	// identifiers to decide normally again; the goal is 1 s, logged.
	outageRecoveryLimit = 5 * time.Second
	// outageAfter is the load kept after the recovery.
	outageAfter = 500 * time.Millisecond
	// outagePace is how often each goroutine decides at most: 64 of them
	// ask for up to 3,200 decisions a second, a load the servers and a
	// process on two shared cores carry without queueing behind the CPU
	// (a closed loop at full speed saturates the process itself, and then
	// a healthy server's replies wait longer than the Timeout to be read).
	outagePace = 20 * time.Millisecond
	// outageMaxPerGoroutine bounds each goroutine's decisions.
	outageMaxPerGoroutine = 1 << 20
)

// outageDecision is one decision of the load: the server of its
// identifier, when it started and how long it took (from the start of the
// run), and how it was answered.
type outageDecision struct {
	server     int
	start, end time.Duration
	degraded   bool
	open       bool // answered by an open breaker (errors.Is breaker.ErrOpen)
	err        error
}

// outageRun is what one run measured.
type outageRun struct {
	healthyBefore, healthyDuring time.Duration // p99 of the healthy servers' identifiers
	healthyDegraded              int
	untilOpen                    time.Duration // from the fault to the breaker opening
	slowBeforeOpen               time.Duration // median cost of the lost server's decisions before it opened
	openCost, openCostP99        time.Duration // cost of the decisions the open breaker answered
	answeredOpen, probes         int
	recovery                     time.Duration // from the server's return to its first normal decision
	rate                         float64       // decisions per second
}

// outageFaultKind is a way to lose a server and to bring it back.
type outageFaultKind struct {
	name    string
	inflict func(t *testing.T, m *localserver.Memcached)
	restore func(t *testing.T, m *localserver.Memcached)
}

func TestOneServerOfThreeLost(t *testing.T) {
	localserver.SkipIfShort(t)
	runs := testkit.Count(t, "THROTTLEKIT_MEMCACHED_OUTAGE_RUNS", 3)
	outage := time.Duration(testkit.Count(t, "THROTTLEKIT_MEMCACHED_OUTAGE_SECONDS", 3)) * time.Second
	timeout := time.Duration(testkit.Count(t, "THROTTLEKIT_MEMCACHED_OUTAGE_TIMEOUT_MS", 1000)) * time.Millisecond
	for _, kind := range []outageFaultKind{
		{name: "SIGSTOP",
			inflict: func(t *testing.T, m *localserver.Memcached) {
				// SIGSTOP takes effect once a thread of the server runs to
				// take it, and its other threads may answer meanwhile
				// (measured: for up to 2 ms after the signal was sent on a
				// quiet machine; longer when its threads wait for a CPU).
				// The fault starts when the server has gone silent.
				probe := dialRaw(t, m.Addr())
				require.NoError(t, m.Pause())
				t.Cleanup(func() { _ = m.Resume() })
				awaitSilence(t, probe)
			},
			restore: func(t *testing.T, m *localserver.Memcached) { require.NoError(t, m.Resume()) }},
		{name: "kill and restart",
			inflict: func(_ *testing.T, m *localserver.Memcached) { m.Kill() },
			restore: func(t *testing.T, m *localserver.Memcached) { require.NoError(t, m.Start()) }},
	} {
		t.Run(kind.name, func(t *testing.T) {
			servers := make([]*localserver.Memcached, 3)
			addrs := make([]string, len(servers))
			for i := range servers {
				servers[i] = localserverT(t)
				addrs[i] = servers[i].Addr()
			}
			var all []outageRun
			for run := range runs {
				lost := run % len(servers)
				r := runOutage(t, kind, servers, addrs, lost, outage, timeout)
				all = append(all, r)
				t.Logf("%s run %d (server %d lost %v, %.0f decisions/s): healthy p99 %v before, %v during, %d degraded; breaker open %v after the fault (decisions before: median %v); then %d decisions answered by it, median %v, p99 %v, %d probes; recovered %v after the server's return",
					kind.name, run, lost, outage, r.rate, r.healthyBefore, r.healthyDuring, r.healthyDegraded, r.untilOpen, r.slowBeforeOpen,
					r.answeredOpen, r.openCost, r.openCostP99, r.probes, r.recovery)
			}
			pick := func(f func(outageRun) time.Duration) []time.Duration {
				ds := make([]time.Duration, len(all))
				for i, r := range all {
					ds[i] = f(r)
				}
				return ds
			}
			summary := func(name string, f func(outageRun) time.Duration) string {
				ds := pick(f)
				return fmt.Sprintf("%s min %v / median %v / max %v", name, quantile(ds, 0), quantile(ds, 0.5), quantile(ds, 1))
			}
			t.Logf("%s, %d runs: %s; %s; %s; %s; %s", kind.name, len(all),
				summary("healthy p99 before", func(r outageRun) time.Duration { return r.healthyBefore }),
				summary("healthy p99 during", func(r outageRun) time.Duration { return r.healthyDuring }),
				summary("breaker open after", func(r outageRun) time.Duration { return r.untilOpen }),
				summary("open breaker's median answer", func(r outageRun) time.Duration { return r.openCost }),
				summary("recovery", func(r outageRun) time.Duration { return r.recovery }))
		})
	}
}

// awaitSilence returns once the server of rc leaves a version request
// unanswered for 100 ms, asking again every millisecond (5 s at most).
func awaitSilence(t *testing.T, rc *rawConn) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		_, err := rc.conn.Write([]byte("version\r\n"))
		require.NoError(t, err)
		require.NoError(t, rc.conn.SetReadDeadline(time.Now().Add(100*time.Millisecond)))
		if _, err := rc.r.ReadString('\n'); err != nil {
			var ne net.Error
			require.True(t, errors.As(err, &ne) && ne.Timeout(), "%v", err)
			return
		}
	}
	t.Fatal("the server still answers 5 s after SIGSTOP")
}

// runOutage runs the load over a fresh backend, loses server lost for
// outage, brings it back and checks the properties.
func runOutage(t *testing.T, kind outageFaultKind, servers []*localserver.Memcached, addrs []string, lost int, outage, timeout time.Duration) outageRun {
	ctx := context.Background()
	client, err := NewClient(timeout, addrs...)
	require.NoError(t, err)
	lostAddr := servers[lost].Addr()

	// State changes of the lost server's breaker, timed from the run's
	// start; the others' must not change at all.
	var mu sync.Mutex
	var opened []time.Duration
	probes, elsewhere := 0, 0
	begin := time.Now() // guarded by mu until the load starts
	faulted := false
	b, err := New(client, WithPrefix(freshPrefix()), WithBreaker(breaker.WithStateChange(func(server string, from, to breaker.State) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case server != lostAddr || !faulted:
			elsewhere++
		case to == breaker.Open && from == breaker.Closed:
			opened = append(opened, time.Since(begin))
		case to == breaker.HalfOpen:
			probes++
		}
	})))
	require.NoError(t, err)
	t.Cleanup(b.CloseIdleConnections)
	th := testkit.Throttler(t, b, throttler.WithLogger(nil), throttler.WithCallTimeout(timeout))
	p := mustPolicy(t, "outage", "1000000/h, 1000000/s gcra")
	dp := testkit.Compile(t, p)

	ids := make([]string, outageIdentifiers)
	serverOf := make([]int, len(ids))
	onLost := 0
	for i := range ids {
		ids[i] = fmt.Sprintf("user:%d", i)
		addr, err := b.selector.PickServer(newKeys(b.prefix, dp, ids[i]).route)
		require.NoError(t, err)
		serverOf[i] = slices.Index(addrs, addr.String())
		require.GreaterOrEqual(t, serverOf[i], 0)
		if serverOf[i] == lost {
			onLost++
		}
	}
	require.NotZero(t, onLost)

	// Warm: every goroutine's connection dialed, every identifier's
	// window open. Not measured.
	var warm sync.WaitGroup
	for g := range outageGoroutines {
		warm.Add(1)
		go func() {
			defer warm.Done()
			for i := g; i < len(ids); i += outageGoroutines {
				_, err := th.Allow(ctx, p, ids[i])
				assert.NoError(t, err)
			}
		}()
	}
	warm.Wait()
	mu.Lock()
	begin = time.Now()
	mu.Unlock()

	// A goroutine that wakes every millisecond sees how late it wakes: a
	// stall of the process (a loaded machine), to which a healthy
	// decision that timed out is attributed in the log.
	var stalls []outageStall
	stopMonitor := make(chan struct{})
	monitorDone := make(chan struct{})
	go func() {
		defer close(monitorDone)
		for last := time.Now(); ; {
			select {
			case <-stopMonitor:
				return
			case <-time.After(time.Millisecond):
			}
			now := time.Now()
			if late := now.Sub(last) - time.Millisecond; late >= 20*time.Millisecond {
				stalls = append(stalls, outageStall{at: last.Sub(begin), late: late})
			}
			last = now
		}
	}()

	var restored atomic.Int64 // ns since begin when the server was back; 0 before
	var recovered atomic.Bool // a decision of the lost server's identifiers was normal after it
	stop := make(chan struct{})
	decisions := make([][]outageDecision, outageGoroutines)
	var wg sync.WaitGroup
	for g := range outageGoroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			mine := make([]outageDecision, 0, 4096)
			defer func() { decisions[g] = mine }()
			next := time.Now()
			for n := 0; n < outageMaxPerGoroutine; n++ {
				if wait := time.Until(next); wait > 0 {
					time.Sleep(wait)
				}
				// Behind schedule (a slow decision), start afresh rather
				// than catch up in a burst.
				if next = next.Add(outagePace); time.Until(next) < -outagePace {
					next = time.Now()
				}
				select {
				case <-stop:
					return
				default:
				}
				i := (g + n*outageGoroutines) % len(ids)
				start := time.Since(begin)
				r, err := th.Allow(ctx, p, ids[i])
				if !assert.NoError(t, err) {
					return
				}
				d := outageDecision{server: serverOf[i], start: start, end: time.Since(begin), degraded: r.Degraded,
					open: r.Degraded && errors.Is(r.Err, breaker.ErrOpen), err: r.Err}
				mine = append(mine, d)
				if d.server == lost && !d.degraded {
					if back := restored.Load(); back != 0 && int64(d.start) >= back {
						recovered.Store(true)
					}
				}
			}
		}()
	}

	time.Sleep(outageBefore)
	faultAt := time.Since(begin)
	mu.Lock()
	faulted = true
	mu.Unlock()
	kind.inflict(t, servers[lost])
	inflicted := time.Since(begin)
	time.Sleep(outage)
	restoreAt := time.Since(begin)
	kind.restore(t, servers[lost])
	backAt := time.Since(begin)
	restored.Store(int64(backAt))
	for waited := time.Duration(0); !recovered.Load() && waited < outageRecoveryLimit; waited += 10 * time.Millisecond {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(outageAfter)
	close(stop)
	wg.Wait()
	close(stopMonitor)
	<-monitorDone

	mu.Lock()
	defer mu.Unlock()
	var all []outageDecision
	for _, ds := range decisions {
		all = append(all, ds...)
	}
	require.NotEmpty(t, all)
	assert.Zero(t, elsewhere, "the breaker of a healthy server changed state")
	require.NotEmpty(t, opened, "the lost server's breaker never opened")
	firstOpen := opened[0]

	var r outageRun
	reached := 0
	var before, during, slow, answered []time.Duration
	firstNormal := time.Duration(-1)
	for _, d := range all {
		cost := d.end - d.start
		if d.server != lost {
			// The other servers' identifiers see nothing of it.
			if d.degraded {
				if r.healthyDegraded < 5 {
					t.Logf("a healthy server's identifier degraded at %v (the fault %v to %v) after %v, the process stalled for up to %v meanwhile: %v",
						d.start, inflicted, restoreAt, cost, stalledDuring(stalls, d.start, d.end), d.err)
				}
				r.healthyDegraded++
			}
			switch {
			case d.start >= outageBefore/5 && d.end < faultAt:
				before = append(before, cost)
			case d.start >= inflicted && d.end < restoreAt:
				during = append(during, cost)
			}
			continue
		}
		switch {
		case d.start >= inflicted && d.end < restoreAt:
			// The lost server's identifiers are degraded throughout, and
			// once its breaker opened they are answered by it, but for
			// the probes it lets through.
			assert.True(t, d.degraded, "a decision on the lost server was not degraded: from %v to %v, lost %v to %v", d.start, d.end, inflicted, restoreAt)
			switch {
			case d.start < firstOpen:
				slow = append(slow, cost)
			case d.open:
				answered = append(answered, cost)
			default:
				reached++ // a probe of the breaker's, or nothing else can be
			}
		case d.start >= backAt && !d.degraded && (firstNormal < 0 || d.end < firstNormal):
			firstNormal = d.end
		}
	}
	assert.Zero(t, r.healthyDegraded, "decisions of the healthy servers' identifiers degraded")
	assert.LessOrEqual(t, reached, probes+1, "decisions reached the lost server while its breaker was open, beyond its probes")
	require.NotEmpty(t, answered, "no decision answered by the open breaker")
	require.GreaterOrEqual(t, firstNormal, time.Duration(0), "the lost server's identifiers never decided normally again within %v", outageRecoveryLimit)

	r.probes = probes
	r.healthyBefore, r.healthyDuring = quantile(before, 0.99), quantile(during, 0.99)
	r.untilOpen = (firstOpen - faultAt).Round(time.Millisecond)
	r.slowBeforeOpen = quantile(slow, 0.5)
	r.answeredOpen = len(answered)
	r.openCost, r.openCostP99 = quantile(answered, 0.5), quantile(answered, 0.99)
	r.recovery = (firstNormal - backAt).Round(time.Millisecond)
	r.rate = float64(len(all)) / all[len(all)-1].end.Seconds()
	return r
}

// outageStall is a moment the process ran late: the monitor goroutine,
// due 1 ms after at, woke late after that.
type outageStall struct{ at, late time.Duration }

// stalledDuring returns the longest stall that overlaps from..to.
func stalledDuring(stalls []outageStall, from, to time.Duration) time.Duration {
	var longest time.Duration
	for _, s := range stalls {
		if s.at < to && s.at+s.late+time.Millisecond > from {
			longest = max(longest, s.late)
		}
	}
	return longest.Round(time.Millisecond)
}

// quantile returns the q-quantile of ds, rounded; ds is sorted in place.
func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	d := ds[min(int(q*float64(len(ds))), len(ds)-1)]
	if d < 10*time.Microsecond {
		return d.Round(100 * time.Nanosecond)
	}
	return d.Round(10 * time.Microsecond)
}

// TestBreakersStayClosedUnderLoad measures what the breakers cost healthy
// servers when the process is loaded: 64 goroutines decide as fast as they
// can over 300 identifiers on three servers (100 ms Timeout), with the
// breakers and without, for THROTTLEKIT_MEMCACHED_LOAD_SECONDS each. On a
// loaded machine some calls time out either way; the figures, with the
// breakers' openings, are logged. Breakers on by default rest on this:
// calls that time out because the process, not a server, is slow do not
// open them.
func TestBreakersStayClosedUnderLoad(t *testing.T) {
	addrs := sharedAddrs(t, sharedServerCount)
	secs := testkit.Count(t, "THROTTLEKIT_MEMCACHED_LOAD_SECONDS", 2)
	p := mustPolicy(t, "load", "1000000/h, 1000000/s gcra")
	for _, on := range []bool{true, false} {
		client, err := NewClient(100*time.Millisecond, addrs...)
		require.NoError(t, err)
		var openings atomic.Int64
		opts := []Option{WithPrefix(freshPrefix()), WithBreaker(breaker.WithStateChange(func(_ string, _, to breaker.State) {
			if to == breaker.Open {
				openings.Add(1)
			}
		}))}
		if !on {
			opts = []Option{WithPrefix(freshPrefix()), WithoutBreaker()}
		}
		b, err := New(client, opts...)
		require.NoError(t, err)
		t.Cleanup(b.CloseIdleConnections)
		th := testkit.Throttler(t, b, throttler.WithLogger(nil))
		var decisions, degraded, rejected atomic.Int64
		deadline := time.Now().Add(time.Duration(secs) * time.Second)
		var wg sync.WaitGroup
		for g := range outageGoroutines {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for n := 0; n < outageMaxPerGoroutine && time.Now().Before(deadline); n++ {
					r, err := th.Allow(context.Background(), p, fmt.Sprintf("user:%d", (g+n*outageGoroutines)%outageIdentifiers))
					if !assert.NoError(t, err) {
						return
					}
					decisions.Add(1)
					if r.Degraded {
						degraded.Add(1)
						if errors.Is(r.Err, breaker.ErrOpen) {
							rejected.Add(1)
						}
					}
				}
			}()
		}
		wg.Wait()
		t.Logf("breakers on=%v: %d decisions in %ds, %d degraded (%d answered by an open breaker); %d breakers opened",
			on, decisions.Load(), secs, degraded.Load(), rejected.Load(), openings.Load())
	}
}
