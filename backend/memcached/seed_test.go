package memcachedbackend

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// seedAt runs one Seed straight on the backend and checks that its step is
// driver.Seed's from the prior states it reports.
func seedAt(t *testing.T, b *Backend, p *throttler.Policy, id string, now time.Time, cost int64, given ...driver.State) driver.Outcome {
	t.Helper()
	dp := testkit.Compile(t, p)
	out, err := b.Seed(context.Background(), driver.Request{Policy: dp, Identifier: id, Cost: cost, Now: now}, given)
	require.NoError(t, err)
	requireSeedStep(t, dp, now, cost, given, out)
	return out
}

// requireSeedStep fails unless out is driver.Seed's step from out.Prior.
func requireSeedStep(t *testing.T, p *driver.Policy, now time.Time, cost int64, given []driver.State, out driver.Outcome) {
	t.Helper()
	want := append([]driver.State(nil), out.Prior...)
	allowed := driver.Seed(p, now, cost, want, given)
	require.Equal(t, allowed, out.Allowed, "verdict from prior %v", out.Prior)
	require.Len(t, out.States, len(p.Limits))
	for i := range want {
		require.Equal(t, driver.InForce(&p.Limits[i], want[i], now), driver.InForce(&p.Limits[i], out.States[i], now),
			"limit %d after merging %v into %v", i, given[i], out.Prior[i])
	}
}

// at is a fixed-window state: used units in the window ending at t0 + end.
func at(used int64, end time.Duration) driver.State {
	return driver.State{Used: used, End: t0.Add(end).UnixMilli()}
}

// storedWindow returns the incarnation limit i's window item names, and
// the raw value of its counter.
func storedWindow(t *testing.T, raw *memcache.Client, k keys, i int) (window, string) {
	t.Helper()
	it, err := raw.Get(k.window(i))
	require.NoError(t, err)
	w, ok := parseWindow(it.Value)
	require.True(t, ok, "window item %q", it.Value)
	c, err := raw.Get(k.counter(i, w))
	require.NoError(t, err)
	return w, string(c.Value)
}

// TestSeedMergesEachAlgorithm walks driver.Merge's rules on each
// algorithm and checks what the items hold after each step: a window
// taken as given, a smaller count left alone, a larger count (of the same
// window or of another one) replacing the open one behind a forward marker
// with the open window's End.
func TestSeedMergesEachAlgorithm(t *testing.T) {
	ctx := context.Background()
	now := t0.Add(10 * time.Second)
	decide := func(t *testing.T, b *Backend, p *throttler.Policy) driver.State {
		t.Helper()
		out, err := b.Decide(ctx, driver.Request{Policy: testkit.Compile(t, p), Identifier: "u", Cost: 1, Now: now})
		require.NoError(t, err)
		require.True(t, out.Allowed)
		return out.States[0]
	}

	t.Run("fixed", func(t *testing.T) {
		b, raw := newTestBackend(t, sharedAddrs(t, 1))
		p := mustPolicy(t, "fixed", "10/min")
		k := newKeys(b.prefix, testkit.Compile(t, p), "u")

		out := seedAt(t, b, p, "u", now, 0, at(4, 40*time.Second))
		assert.Equal(t, []driver.State{{}}, out.Prior, "nothing held")
		w, used := storedWindow(t, raw, k, 0)
		assert.Equal(t, at(4, 40*time.Second).End, w.end, "the given window, as it is")
		assert.Equal(t, "4", used)
		assert.Equal(t, at(5, 40*time.Second), decide(t, b, p))

		// A smaller count of the same window changes nothing.
		out = seedAt(t, b, p, "u", now, 0, at(3, 40*time.Second))
		assert.Equal(t, at(5, 40*time.Second), out.States[0])
		w2, used := storedWindow(t, raw, k, 0)
		assert.Equal(t, w, w2, "same incarnation")
		assert.Equal(t, "5", used)

		// A larger count replaces the counter: the old one forwards.
		out = seedAt(t, b, p, "u", now, 0, at(8, 40*time.Second))
		assert.Equal(t, at(5, 40*time.Second), out.Prior[0])
		assert.Equal(t, at(8, 40*time.Second), out.States[0])
		w3, used := storedWindow(t, raw, k, 0)
		assert.Equal(t, w.end, w3.end)
		assert.NotEqual(t, w.token, w3.token, "a new incarnation")
		assert.Equal(t, "8", used)
		old, err := raw.Get(k.counter(0, w))
		require.NoError(t, err)
		assert.Equal(t, string(w3.forward()), string(old.Value), "the old counter forwards to the new one")
		assert.Equal(t, at(9, 40*time.Second), decide(t, b, p))

		// Another open window: the open one stays, End and incarnation,
		// when the given count is smaller...
		out = seedAt(t, b, p, "u", now, 0, at(2, 30*time.Second))
		assert.Equal(t, at(9, 40*time.Second), out.Prior[0])
		assert.Equal(t, at(9, 40*time.Second), out.States[0])
		w4, used := storedWindow(t, raw, k, 0)
		assert.Equal(t, w3, w4, "same incarnation")
		assert.Equal(t, "9", used)
		// ... and keeps its End with the larger count when it is not.
		out = seedAt(t, b, p, "u", now, 0, at(10, 70*time.Second))
		assert.Equal(t, at(9, 40*time.Second), out.Prior[0])
		assert.Equal(t, at(10, 40*time.Second), out.States[0])
		w5, used := storedWindow(t, raw, k, 0)
		assert.Equal(t, w.end, w5.end, "the open window's End stays")
		assert.Equal(t, "10", used)
	})

	t.Run("aligned", func(t *testing.T) {
		b, raw := newTestBackend(t, sharedAddrs(t, 1))
		p := mustPolicy(t, "aligned", "10/min aligned")
		k := newKeys(b.prefix, testkit.Compile(t, p), "u")
		end := driver.WindowEnd(&testkit.Compile(t, p).Limits[0], now.UnixMilli())
		given := driver.State{Used: 6, End: end}
		seedAt(t, b, p, "u", now, 0, given)
		_, used := storedWindow(t, raw, k, 0)
		assert.Equal(t, "6", used)
		assert.Equal(t, driver.State{Used: 7, End: end}, decide(t, b, p))
		out := seedAt(t, b, p, "u", now, 0, driver.State{Used: 9, End: end})
		assert.Equal(t, driver.State{Used: 7, End: end}, out.Prior[0])
		assert.Equal(t, driver.State{Used: 10, End: end}, decide(t, b, p))
	})

	t.Run("gcra", func(t *testing.T) {
		b, raw := newTestBackend(t, sharedAddrs(t, 1))
		p := mustPolicy(t, "gcra", "10/min gcra") // T = 6 s
		k := newKeys(b.prefix, testkit.Compile(t, p), "u")
		tat := func(d time.Duration) driver.State { return driver.State{End: t0.Add(d).UnixMicro()} }
		stored := func() string {
			it, err := raw.Get(k.cas(0))
			require.NoError(t, err)
			return string(it.Value)
		}
		seedAt(t, b, p, "u", now, 0, tat(34*time.Second))
		assert.Equal(t, strconv.FormatInt(tat(34*time.Second).End, 10), stored())
		out := seedAt(t, b, p, "u", now, 0, tat(20*time.Second))
		assert.Equal(t, tat(34*time.Second), out.States[0], "an earlier TAT changes nothing")
		out = seedAt(t, b, p, "u", now, 0, tat(50*time.Second))
		assert.Equal(t, tat(34*time.Second), out.Prior[0])
		assert.Equal(t, strconv.FormatInt(tat(50*time.Second).End, 10), stored())
		assert.Equal(t, tat(56*time.Second), decide(t, b, p))
	})

	t.Run("sliding", func(t *testing.T) {
		b, raw := newTestBackend(t, sharedAddrs(t, 1))
		p := mustPolicy(t, "sliding", "10/min sliding")
		k := newKeys(b.prefix, testkit.Compile(t, p), "u")
		end := driver.WindowEnd(&testkit.Compile(t, p).Limits[0], now.UnixMilli())
		seedAt(t, b, p, "u", now, 0, driver.State{Used: 2, End: end, Prev: 5})
		out := seedAt(t, b, p, "u", now, 0, driver.State{Used: 4, End: end, Prev: 1})
		assert.Equal(t, driver.State{Used: 4, End: end, Prev: 5}, out.States[0], "count by count")
		it, err := raw.Get(k.cas(0))
		require.NoError(t, err)
		assert.Equal(t, fmt.Sprintf("4:%d:5", end), string(it.Value))
	})
}

// TestSeedIgnoresClosedWindows: a given state that counts nothing at now
// writes nothing, into a store that holds a window or nothing.
func TestSeedIgnoresClosedWindows(t *testing.T) {
	b, raw := newTestBackend(t, sharedAddrs(t, 1))
	p := mustPolicy(t, "closed", "10/min, 10/min gcra")
	k := newKeys(b.prefix, testkit.Compile(t, p), "u")
	now := t0.Add(10 * time.Second)
	closed := []driver.State{at(9, 10*time.Second), {End: now.UnixMicro()}}

	before := b.Stats().RoundTrips
	out := seedAt(t, b, p, "empty", now, 0, closed...)
	assert.Equal(t, make([]driver.State, 2), out.States)
	assert.Equal(t, uint64(1), b.Stats().RoundTrips-before, "one read, no write")

	_, err := b.Decide(context.Background(), driver.Request{Policy: testkit.Compile(t, p), Identifier: "u", Cost: 2, Now: t0})
	require.NoError(t, err)
	w, _ := storedWindow(t, raw, k, 0)
	before = b.Stats().RoundTrips
	out = seedAt(t, b, p, "u", now, 0, closed[0], driver.State{End: now.Add(-time.Second).UnixMicro()})
	assert.Equal(t, at(2, time.Minute), out.States[0])
	assert.Equal(t, uint64(2), b.Stats().RoundTrips-before, "two reads, no write")
	w2, used := storedWindow(t, raw, k, 0)
	assert.Equal(t, w, w2)
	assert.Equal(t, "2", used)
}

// TestSeedRoundTrips pins what a seed costs: reads as a peek, then one
// round trip per write.
func TestSeedRoundTrips(t *testing.T) {
	b, _ := newTestBackend(t, sharedAddrs(t, 1))
	p := mustPolicy(t, "trips", "10/min")
	count := func(given driver.State) uint64 {
		before := b.Stats().RoundTrips
		seedAt(t, b, p, "u", t0, 0, given)
		return b.Stats().RoundTrips - before
	}
	assert.Equal(t, uint64(3), count(at(3, 30*time.Second)), "open: get, add counter, publish")
	assert.Equal(t, uint64(2), count(at(2, 30*time.Second)), "unchanged: get, get counter")
	assert.Equal(t, uint64(5), count(at(4, 30*time.Second)), "replace: get, get counter, add counter, forward, publish")

	gcra := mustPolicy(t, "trips-gcra", "10/min gcra")
	before := b.Stats().RoundTrips
	seedAt(t, b, gcra, "u", t0, 0, driver.State{End: t0.Add(time.Second).UnixMicro()})
	assert.Equal(t, uint64(2), b.Stats().RoundTrips-before, "get, add")
}

// TestConcurrentSeedsKeepTheMax races seeds of one window from two
// backends (two processes): whatever the order, the window ends holding
// the largest given count, each seed's step is driver.Seed's on what it
// reports as prior, and no seed sees a count drop.
func TestConcurrentSeedsKeepTheMax(t *testing.T) {
	addrs := sharedAddrs(t, 1)
	b1, _ := newTestBackend(t, addrs)
	b2, err := New(b1.client, WithPrefix(b1.prefix))
	require.NoError(t, err)
	p := mustPolicy(t, "max", "1000/h, 1000/h aligned, 1000/h gcra")
	dp := testkit.Compile(t, p)
	now := t0
	alignedEnd := driver.WindowEnd(&dp.Limits[1], now.UnixMilli())
	const goroutines, each = 8, 25
	counts := rand.New(rand.NewPCG(3, 4)).Perm(goroutines * each)

	var wg sync.WaitGroup
	errs := make(chan error, goroutines*each)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := []*Backend{b1, b2}[g%2]
			last := int64(0)
			for j := range each {
				k := int64(counts[g*each+j] + 1)
				given := []driver.State{at(k, 30*time.Minute), {Used: k, End: alignedEnd}, {End: now.Add(time.Duration(k) * time.Second).UnixMicro()}}
				out, err := b.Seed(context.Background(), driver.Request{Policy: dp, Identifier: "hot", Now: now}, given)
				if err != nil {
					errs <- err
					return
				}
				want := append([]driver.State(nil), out.Prior...)
				driver.Merge(dp, now, want, given)
				if fmt.Sprint(want) != fmt.Sprint(out.States) {
					errs <- fmt.Errorf("seed of %d: prior %v, after %v, want %v", k, out.Prior, out.States, want)
					return
				}
				if out.States[0].Used < last || out.States[0].Used < k {
					errs <- fmt.Errorf("seed of %d: count %d after %d", k, out.States[0].Used, last)
					return
				}
				last = out.States[0].Used
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	top := int64(goroutines * each)
	out, err := b1.Peek(context.Background(), driver.Request{Policy: dp, Identifier: "hot", Now: now})
	require.NoError(t, err)
	assert.Equal(t, []driver.State{at(top, 30*time.Minute), {Used: top, End: alignedEnd}, {End: now.Add(time.Duration(top) * time.Second).UnixMicro()}},
		out.States)
}

// TestSeedRacingDecideNeverOverAdmits races seeds of one open window
// (1 to 90 units) with decisions of one unit: every allowed decision got
// a count of its own, none above Max, so no unit is ever admitted twice;
// the window ends full, holding exactly Max, and no give-back fails
// (those that meet a forwarded counter have nothing to give back).
func TestSeedRacingDecideNeverOverAdmits(t *testing.T) {
	addrs := sharedAddrs(t, 1)
	b1, _ := newTestBackend(t, addrs)
	b2, err := New(b1.client, WithPrefix(b1.prefix))
	require.NoError(t, err)
	p := mustPolicy(t, "racing", "100/h")
	dp := testkit.Compile(t, p)
	now := t0
	end := at(0, 30*time.Minute).End
	seedAt(t, b1, p, "hot", now, 0, at(1, 30*time.Minute))

	const seeders, deciders, seeds, decisions = 6, 6, 30, 40
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		granted = map[int64]int{}
		errs    = make(chan error, (seeders+deciders)*decisions)
	)
	for g := range seeders + deciders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := []*Backend{b1, b2}[g%2]
			rnd := rand.New(rand.NewPCG(uint64(g), 5))
			if g < seeders {
				for range seeds {
					given := []driver.State{at(1+rnd.Int64N(90), 30*time.Minute)}
					out, err := b.Seed(context.Background(), driver.Request{Policy: dp, Identifier: "hot", Now: now}, given)
					switch {
					case err != nil:
						errs <- err
					case out.States[0].End != end || out.States[0].Used > 100:
						errs <- fmt.Errorf("seed: after %v", out.States[0])
					}
				}
				return
			}
			for range decisions {
				out, err := b.Decide(context.Background(), driver.Request{Policy: dp, Identifier: "hot", Cost: 1, Now: now})
				switch {
				case err != nil:
					errs <- err
				case out.States[0].End != end:
					errs <- fmt.Errorf("decision: window %v", out.States[0])
				case out.Allowed:
					mu.Lock()
					granted[out.States[0].Used]++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for used, n := range granted {
		assert.Equal(t, 1, n, "count %d granted %d times", used, n)
		assert.LessOrEqual(t, used, int64(100))
	}
	assert.GreaterOrEqual(t, len(granted), 10, "the seeds never hold more than 90")
	assert.LessOrEqual(t, len(granted), 99, "the window held 1 before the race")
	out, err := b1.Peek(context.Background(), driver.Request{Policy: dp, Identifier: "hot", Now: now})
	require.NoError(t, err)
	assert.Equal(t, at(100, 30*time.Minute), out.States[0])
	assert.Zero(t, b1.Stats().RollbackFailures+b2.Stats().RollbackFailures)
}

// TestSeedMeetsUnitsAboutToBeGivenBack runs a seed while a request that
// will be denied holds a unit in the minute window (it passed the minute,
// the hour denies it). A given count above what the counter reads replaces
// the window, and the give-back then finds the forward marker: the window
// holds exactly the given count. A given count between the committed count
// and the one read writes nothing, and after the give-back the window
// holds one unit less than given: the documented limitation ("Seeding").
func TestSeedMeetsUnitsAboutToBeGivenBack(t *testing.T) {
	for _, c := range []struct {
		given, want int64
	}{
		{given: 5, want: 5}, // above the 4 read: replaced
		{given: 4, want: 3}, // the 4 read holds the denied unit
	} {
		t.Run(fmt.Sprintf("given %d", c.given), func(t *testing.T) {
			b, _ := newTestBackend(t, sharedAddrs(t, 1))
			seeder, err := New(b.client, WithPrefix(b.prefix))
			require.NoError(t, err)
			p := mustPolicy(t, "tentative", "10/min, 3/h")
			dp := testkit.Compile(t, p)
			decideAt(t, b, p, t0)
			_, err = b.Decide(context.Background(), driver.Request{Policy: dp, Identifier: "u", Cost: 2, Now: t0})
			require.NoError(t, err)
			now := t0.Add(10 * time.Second)
			given := at(c.given, time.Minute)
			var seeded driver.Outcome
			b.hooks.overLimit = func() {
				b.hooks.overLimit = nil
				seeded = seedAt(t, seeder, p, "u", now, 0, given, driver.State{})
			}
			out := decideAt(t, b, p, now)
			require.False(t, out.Allowed)
			assert.Equal(t, at(4, time.Minute), seeded.Prior[0], "the seed read the denied request's unit")
			assert.Zero(t, b.Stats().RollbackFailures)
			peek, err := b.Peek(context.Background(), driver.Request{Policy: dp, Identifier: "u", Now: now})
			require.NoError(t, err)
			assert.Equal(t, at(c.want, time.Minute), peek.States[0])
			assert.Equal(t, at(3, time.Hour), peek.States[1])
		})
	}
}

// TestForwardedWindowWithoutPublish: a seed that swapped the counter for a
// forward marker and stopped before pointing the window item at the new
// counter (a crash, a timeout). Peek follows the marker and writes
// nothing; a decision follows it, counts in the new counter and points the
// window item at it; a refund follows it; a reset deletes the chain.
func TestForwardedWindowWithoutPublish(t *testing.T) {
	b, raw := newTestBackend(t, sharedAddrs(t, 1))
	p := mustPolicy(t, "forward", "10/min")
	dp := testkit.Compile(t, p)
	k := newKeys(b.prefix, dp, "u")
	ctx := context.Background()
	req := func(cost int64) driver.Request {
		return driver.Request{Policy: dp, Identifier: "u", Cost: cost, Now: t0.Add(10 * time.Second)}
	}
	_, err := b.Decide(ctx, driver.Request{Policy: dp, Identifier: "u", Cost: 2, Now: t0})
	require.NoError(t, err)
	old, _ := storedWindow(t, raw, k, 0)
	next := window{end: at(0, 40*time.Second).End, token: newToken()}
	forward := func() {
		require.NoError(t, raw.Set(&memcache.Item{Key: k.window(0), Value: old.encode(), Expiration: 120}))
		require.NoError(t, raw.Set(&memcache.Item{Key: k.counter(0, old), Value: next.forward(), Expiration: 120}))
	}
	require.NoError(t, raw.Add(&memcache.Item{Key: k.counter(0, next), Value: []byte("7"), Expiration: 120}))
	forward()

	out, err := b.Peek(ctx, req(0))
	require.NoError(t, err)
	assert.Equal(t, at(7, 40*time.Second), out.States[0])
	w, _ := storedWindow(t, raw, k, 0)
	assert.Equal(t, old, w, "a peek writes nothing")

	out, err = b.Decide(ctx, req(1))
	require.NoError(t, err)
	require.True(t, out.Allowed)
	assert.Equal(t, at(8, 40*time.Second), out.States[0])
	w, used := storedWindow(t, raw, k, 0)
	assert.Equal(t, next, w, "the decision pointed the window item past the marker")
	assert.Equal(t, "8", used)

	forward()
	out, err = b.Refund(ctx, req(3))
	require.NoError(t, err)
	assert.Equal(t, at(5, 40*time.Second), out.States[0])

	// A seed over a chain replaces its live end.
	forward()
	seeded := seedAt(t, b, p, "u", t0.Add(10*time.Second), 0, at(9, 40*time.Second))
	assert.Equal(t, at(5, 40*time.Second), seeded.Prior[0])
	w, used = storedWindow(t, raw, k, 0)
	assert.Equal(t, "9", used)

	// The chain is now old, next, w: a reset deletes all of it.
	forward()
	require.NoError(t, b.Reset(ctx, dp, "u"))
	for _, key := range []string{k.window(0), k.counter(0, old), k.counter(0, next), k.counter(0, w)} {
		_, err := raw.Get(key)
		assert.ErrorIs(t, err, memcache.ErrCacheMiss, "%s deleted", key)
	}
}

// TestSeedWithCost merges, then decides the cost on the merged window;
// a denial keeps the merge.
func TestSeedWithCost(t *testing.T) {
	b, _ := newTestBackend(t, sharedAddrs(t, 1))
	p := mustPolicy(t, "cost", "10/min, 5/min gcra")
	now := t0.Add(10 * time.Second)
	given := []driver.State{at(8, 40*time.Second), {End: now.Add(12 * time.Second).UnixMicro()}}
	out := seedAt(t, b, p, "u", now, 2, given...)
	assert.True(t, out.Allowed)
	assert.Equal(t, at(10, 40*time.Second), out.States[0])
	out = seedAt(t, b, p, "u", now, 1, given...)
	assert.False(t, out.Allowed)
	assert.Equal(t, at(10, 40*time.Second), out.Prior[0])
}

// TestSeedRejectsInvalidStates: states not matching the policy are
// driver.ErrInvalidState, before any round trip.
func TestSeedRejectsInvalidStates(t *testing.T) {
	b, err := New(dummyClient())
	require.NoError(t, err)
	dp := testkit.Compile(t, mustPolicy(t, "invalid", "10/min"))
	for _, given := range [][]driver.State{nil, {{}, {}}, {{Used: -1}}} {
		_, err := b.Seed(context.Background(), driver.Request{Policy: dp, Identifier: "u", Now: t0}, given)
		assert.ErrorIs(t, err, driver.ErrInvalidState, "%v", given)
	}
	assert.Zero(t, b.Stats().RoundTrips)
	_, err = (&Backend{}).Seed(context.Background(), driver.Request{Policy: dp, Identifier: "u", Now: t0}, []driver.State{{}})
	assert.ErrorIs(t, err, driver.ErrNotInitialized)
}

// TestSeedRetriesLostRaces: a decision that counts between a seed's read
// and its swap makes the swap fail; the seed reads again and merges into
// the count that includes the decision. A GCRA write alike. Without
// retries left, the seed fails with ErrRetriesExhausted.
func TestSeedRetriesLostRaces(t *testing.T) {
	tat := func(d time.Duration) driver.State { return driver.State{End: t0.Add(d).UnixMicro()} }
	for _, c := range []struct {
		limits                string
		given, prior, greater driver.State
	}{
		// One unit at t0, one by the racing decision.
		{"10/min", at(8, time.Minute), at(2, time.Minute), at(9, time.Minute)},
		// T = 6 s: TAT t0+6s, then t0+16s after the racing decision.
		{"10/min gcra", tat(50 * time.Second), tat(16 * time.Second), tat(51 * time.Second)},
	} {
		t.Run(c.limits, func(t *testing.T) {
			b, _ := newTestBackend(t, sharedAddrs(t, 1))
			other, err := New(b.client, WithPrefix(b.prefix))
			require.NoError(t, err)
			p := mustPolicy(t, "race", c.limits)
			decideAt(t, b, p, t0)
			now := t0.Add(10 * time.Second)
			b.hooks.beforeSeedWrite = func() {
				b.hooks.beforeSeedWrite = nil
				require.True(t, decideAt(t, other, p, now).Allowed)
			}
			out := seedAt(t, b, p, "u", now, 0, c.given)
			assert.Equal(t, uint64(1), b.Stats().CASConflicts)
			assert.Equal(t, c.prior, out.Prior[0], "the prior state includes the racing decision")
			assert.Equal(t, c.given, out.States[0])

			strict, err := New(b.client, WithPrefix(b.prefix), WithCASRetries(0))
			require.NoError(t, err)
			strict.hooks.beforeSeedWrite = func() { require.True(t, decideAt(t, other, p, now).Allowed) }
			_, err = strict.Seed(context.Background(), driver.Request{Policy: testkit.Compile(t, p), Identifier: "u", Now: now},
				[]driver.State{c.greater})
			assert.ErrorIs(t, err, ErrRetriesExhausted)
			assert.Equal(t, uint64(1), strict.Stats().RetriesExhausted)
		})
	}
}
