package memcachedbackend

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/throttlekit/throttlekit/internal/localserver"
	"github.com/throttlekit/throttlekit/throttler"
)

// rawConn speaks memcached's text protocol directly, to flood a server
// with pipelined writes far faster than one round trip per item.
type rawConn struct {
	conn net.Conn
	r    *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return &rawConn{conn: c, r: bufio.NewReader(c)}
}

// flood stores n items of random sizes (in the range of the backend's own
// items, so they compete for the same slab classes) without waiting for
// replies, then syncs on a version request.
func (rc *rawConn) flood(rnd *rand.Rand, first, n int) error {
	var buf bytes.Buffer
	value := bytes.Repeat([]byte("v"), 256)
	for i := range n {
		size := 1 + rnd.IntN(200)
		fmt.Fprintf(&buf, "set flood:%d 0 0 %d noreply\r\n", first+i, size)
		buf.Write(value[:size])
		buf.WriteString("\r\n")
	}
	buf.WriteString("version\r\n")
	if err := rc.conn.SetDeadline(time.Now().Add(20 * time.Second)); err != nil {
		return err
	}
	if _, err := rc.conn.Write(buf.Bytes()); err != nil {
		return err
	}
	for {
		line, err := rc.r.ReadString('\n')
		if err != nil {
			return err
		}
		if strings.HasPrefix(line, "VERSION") {
			return nil
		}
	}
}

// stat returns one of the server's general statistics.
func (rc *rawConn) stat(name string) (int64, error) {
	if err := rc.conn.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return 0, err
	}
	if _, err := rc.conn.Write([]byte("stats\r\n")); err != nil {
		return 0, err
	}
	value := int64(-1)
	for {
		line, err := rc.r.ReadString('\n')
		if err != nil {
			return 0, err
		}
		line = strings.TrimSpace(line)
		if line == "END" {
			return value, nil
		}
		if v, ok := strings.CutPrefix(line, "STAT "+name+" "); ok {
			value, _ = strconv.ParseInt(v, 10, 64)
		}
	}
}

// evictionChecker follows one identifier's serial results under one fixed
// window limit and reports what an eviction may and may not do to them.
type evictionChecker struct {
	aligned  bool
	window   time.Duration
	max      int64
	prev     *throttler.Result
	restarts int
}

// check returns a violation, or "".
func (c *evictionChecker) check(now time.Time, r throttler.Result) string {
	defer func() { c.prev = &r }()
	if !r.ResetAt.After(now) {
		return fmt.Sprintf("ResetAt %v not after now %v", r.ResetAt, now)
	}
	if r.Used < 0 || r.Used > c.max {
		return fmt.Sprintf("Used %d outside [0, %d]", r.Used, c.max)
	}
	fresh := now.Add(c.window)
	if c.aligned {
		fresh = now.Truncate(c.window).Add(c.window)
	}
	freshWindow := r.Allowed && r.Used == 1 && r.ResetAt.Equal(fresh)
	p := c.prev
	if p == nil {
		if !freshWindow {
			return fmt.Sprintf("first request: Used %d ResetAt %v, want a fresh window", r.Used, r.ResetAt)
		}
		return ""
	}
	switch {
	case r.ResetAt.Equal(p.ResetAt) && r.Allowed && r.Used == p.Used+1:
		// The same window, counting on.
	case r.ResetAt.Equal(p.ResetAt) && !r.Allowed && r.Used == c.max && p.Used == c.max:
		// The same window, full.
	case freshWindow && !r.ResetAt.Before(p.ResetAt):
		// A fresh window: legitimate when the old one closed, else an
		// eviction restarted it. Its end never moves backwards, and the
		// count starts over with it: never an old Used with a new end.
		if p.ResetAt.After(now) {
			c.restarts++
		}
	default:
		return fmt.Sprintf("after {Allowed %v Used %d ResetAt %v}: {Allowed %v Used %d ResetAt %v}: neither the same window counting on nor a fresh one",
			p.Allowed, p.Used, p.ResetAt, r.Allowed, r.Used, r.ResetAt)
	}
	return ""
}

// TestEvictionRestartsWindowsNeverCorruptsThem runs decisions against a
// memcached with the smallest memory it accepts while a flood of other
// items evicts whatever the LRU picks, the backend's items included. The
// server runs without the segmented LRU maintainer (the plain LRU of older
// deployments), under which frequently used items get evicted too. Every
// result must be either the same window counting on or a fresh window;
// evictions must actually have restarted some.
func TestEvictionRestartsWindowsNeverCorruptsThem(t *testing.T) {
	srv := localserver.MemcachedT(t, localserver.MemcachedOptions{
		MemoryMB: 2,
		Args:     []string{"-o", "no_lru_maintainer"},
	})
	b, _ := newTestBackend(t, []string{srv.Addr()})
	policies := []*throttler.Policy{
		mustPolicy(t, "anchored", "30/h"),
		mustPolicy(t, "aligned", "30/h aligned"),
		mustPolicy(t, "gcra", "30/h gcra"),
	}
	const (
		workers        = 4
		idsPerWorker   = 30
		maxRounds      = 40
		maxFloodBursts = 400
		floodBurst     = 4000
		budget         = 15 * time.Second
	)
	deadline := time.Now().Add(budget)
	ctx, cancel := context.WithDeadline(context.Background(), deadline.Add(10*time.Second))
	defer cancel()

	stop := make(chan struct{})
	var floodWG sync.WaitGroup
	var flooded atomic.Int64
	rc := dialRaw(t, srv.Addr())
	floodWG.Add(1)
	go func() {
		defer floodWG.Done()
		rnd := rand.New(rand.NewPCG(1, 2))
		for burst := 0; burst < maxFloodBursts && time.Now().Before(deadline); burst++ {
			select {
			case <-stop:
				return
			default:
			}
			if err := rc.flood(rnd, burst*floodBurst, floodBurst); err != nil {
				t.Errorf("flood: %v", err)
				return
			}
			flooded.Add(floodBurst)
		}
	}()

	var restarts, decisions atomic.Int64
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			thr, clock := newThrottler(t, b)
			checkers := make([][]evictionChecker, idsPerWorker)
			for i := range checkers {
				checkers[i] = []evictionChecker{
					{window: time.Hour, max: 30},
					{window: time.Hour, max: 30, aligned: true},
				}
			}
			for round := 0; round < maxRounds && time.Now().Before(deadline); round++ {
				for i := range idsPerWorker {
					id := fmt.Sprintf("w%d-id%d", w, i)
					now := clock.Advance(time.Millisecond)
					for j, p := range policies {
						r, err := thr.Allow(ctx, p, id)
						if !assert.NoError(t, err) || !assert.False(t, r.Degraded, "%s %s: %v", p.Name(), id, r.Err) {
							return
						}
						decisions.Add(1)
						if j < len(checkers[i]) {
							if v := checkers[i][j].check(now, r); v != "" {
								t.Errorf("%s %s round %d: %s", p.Name(), id, round, v)
								return
							}
						} else if r.ResetAt.Before(now) {
							t.Errorf("%s %s: GCRA ResetAt %v before now %v", p.Name(), id, r.ResetAt, now)
							return
						}
					}
				}
			}
			for i := range checkers {
				for j := range checkers[i] {
					restarts.Add(int64(checkers[i][j].restarts))
				}
			}
		}()
	}
	wg.Wait()
	close(stop)
	floodWG.Wait()

	evictions, err := dialRaw(t, srv.Addr()).stat("evictions")
	require.NoError(t, err)
	st := b.Stats()
	t.Logf("%d decisions, %d items flooded, %d server evictions, %d windows restarted by eviction (%d found without their counter)",
		decisions.Load(), flooded.Load(), evictions, restarts.Load(), st.WindowsLost)
	require.Positive(t, evictions, "the flood evicted nothing")
	assert.Positive(t, restarts.Load(), "no eviction hit the backend's items: the test proved nothing")
	assert.Zero(t, st.RetriesExhausted)
}

// TestEvictionInterleavings evicts (deletes) items at chosen moments, which
// a real server's LRU does only at random.
func TestEvictionInterleavings(t *testing.T) {
	ctx := context.Background()
	p := mustPolicy(t, "evict", "3/min")
	t.Run("window item evicted: a fresh window, never the old count", func(t *testing.T) {
		b, raw := newTestBackend(t, sharedAddrs(t, 1))
		thr, clock := newThrottler(t, b)
		for range 2 {
			r, err := thr.Allow(ctx, p, "u")
			require.NoError(t, err)
			require.True(t, r.Allowed)
		}
		require.NoError(t, raw.Delete(newKeys(b.prefix, testkit.Compile(t, p), "u").window(0)))
		now := clock.Advance(10 * time.Second)
		r, err := thr.Allow(ctx, p, "u")
		require.NoError(t, err)
		assert.True(t, r.Allowed)
		assert.Equal(t, int64(1), r.Used)
		assert.Equal(t, now.Add(time.Minute), r.ResetAt)
	})

	t.Run("counter evicted between a denial's incr and decr", func(t *testing.T) {
		b, raw := newTestBackend(t, sharedAddrs(t, 1))
		other, err := New(b.client, WithPrefix(b.prefix))
		require.NoError(t, err)
		thr, clock := newThrottler(t, b)
		thrOther, _ := newThrottler(t, other)
		for range 3 {
			r, err := thr.Allow(ctx, p, "u")
			require.NoError(t, err)
			require.True(t, r.Allowed)
		}
		k := newKeys(b.prefix, testkit.Compile(t, p), "u")
		it, err := raw.Get(k.window(0))
		require.NoError(t, err)
		w, ok := parseWindow(it.Value)
		require.True(t, ok)

		// The fourth request goes over; before it gives its unit back,
		// its counter is evicted and another process reopens the window.
		var during throttler.Result
		b.hooks.overLimit = func() {
			b.hooks.overLimit = nil
			require.NoError(t, raw.Delete(k.counter(0, w)))
			during, err = thrOther.Allow(ctx, p, "u")
			require.NoError(t, err)
		}
		r, err := thr.Allow(ctx, p, "u")
		require.NoError(t, err)
		assert.False(t, r.Allowed)
		assert.True(t, during.Allowed)
		assert.Equal(t, int64(1), during.Used, "a fresh window")
		assert.Equal(t, clock.Now().Add(time.Minute), during.ResetAt)
		assert.Equal(t, uint64(1), other.Stats().WindowsLost)

		// The late decr found nothing to take from: the fresh window
		// admits exactly Max, its opener included.
		allowed := 1
		for range 5 {
			r, err := thrOther.Allow(ctx, p, "u")
			require.NoError(t, err)
			if r.Allowed {
				allowed++
			}
		}
		assert.Equal(t, 3, allowed)
	})
}
