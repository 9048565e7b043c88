package legacybackend_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	legacybackend "github.com/throttlekit/throttlekit/backend/legacy"
	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/localserver"
	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// envoy's units, as its UnitToDivider maps them to seconds.
const (
	envoySecond = int64(1)
	envoyMinute = int64(60)
	envoyHour   = int64(3600)
	envoyDay    = int64(86400)
)

// envoyJitter is the TTL envoy ratelimit adds to every hit in these tests
// (its EXPIRATION_JITTER_MAX_SECONDS draws one up to 300 s): it keeps a
// one-second key alive while a slow -race run reads it on a manual clock.
const envoyJitter = 30

// descriptor is an envoy ratelimit request's descriptor: its domain and
// its entries, in order.
type descriptor struct {
	domain  string
	entries [][2]string
}

// freshDescriptor returns a descriptor no other test uses.
func freshDescriptor() descriptor {
	return descriptor{
		domain:  fmt.Sprintf("edge%08x", rand.Uint32()),
		entries: [][2]string{{"remote_address", "10.0.0.1"}, {"path", "/api/v1"}},
	}
}

// identifier is the identifier throttlekit's service gives the
// descriptor: envoy's key without its prefix and its window start.
func (d descriptor) identifier() string {
	parts := []string{d.domain}
	for _, e := range d.entries {
		parts = append(parts, e[0], e[1])
	}
	return strings.Join(parts, "_")
}

// envoyKey returns the key envoy ratelimit's cache key generator writes
// for d under a unit of div seconds at now: the prefix, the domain and
// "_", then each entry's key, "_", value and "_", then the start of the
// unit's window in Unix seconds.
func envoyKey(prefix string, d descriptor, div int64, now time.Time) string {
	var b strings.Builder
	b.WriteString(prefix)
	b.WriteString(d.domain)
	b.WriteByte('_')
	for _, e := range d.entries {
		b.WriteString(e[0])
		b.WriteByte('_')
		b.WriteString(e[1])
		b.WriteByte('_')
	}
	now64 := now.Unix()
	b.WriteString(strconv.FormatInt((now64/div)*div, 10))
	return b.String()
}

// envoyProcess counts hits the way envoy ratelimit's fixed-window Redis
// cache does: INCRBY of the hits, then EXPIRE of the unit plus a jitter,
// pipelined; a hit is over the limit when the count after it is above
// the limit's requests per unit. Denied hits are counted too.
type envoyProcess struct {
	c      goredis.Cmdable
	prefix string
}

func (p envoyProcess) hit(d descriptor, div, perUnit int64, now time.Time, hits int64) (count int64, ok bool, err error) {
	key := envoyKey(p.prefix, d, div, now)
	bg := context.Background()
	var incr *goredis.IntCmd
	_, err = p.c.Pipelined(bg, func(pipe goredis.Pipeliner) error {
		incr = pipe.IncrBy(bg, key, hits)
		pipe.Expire(bg, key, time.Duration(div+envoyJitter)*time.Second)
		return nil
	})
	if err != nil {
		return 0, false, err
	}
	return incr.Val(), incr.Val() <= perUnit, nil
}

func (p envoyProcess) mustHit(tb testing.TB, d descriptor, div int64, now time.Time, hits int64) int64 {
	tb.Helper()
	n, _, err := p.hit(d, div, 1<<40, now, hits)
	require.NoError(tb, err)
	return n
}

func newEnvoy(tb testing.TB, c goredis.UniversalClient, opts ...legacybackend.Option) *legacybackend.EnvoyRedis {
	tb.Helper()
	b, err := legacybackend.NewEnvoyRedis(c, opts...)
	require.NoError(tb, err)
	return b
}

// dayStart is a midnight UTC after t0: every envoy window starts there.
var dayStart = time.Unix((t0.Unix()/envoyDay+1)*envoyDay, 0).UTC()

// aligned returns an AlignedWindow limit of max per window.
func aligned(tb testing.TB, max int64, window time.Duration) driver.Limit {
	return limit(tb, "", driver.AlignedWindow, max, window)
}

// windowEnd is the end of envoy's window of div seconds holding now, in
// Unix milliseconds.
func windowEnd(div int64, now time.Time) int64 {
	return (now.Unix()/div*div + div) * 1000
}

// Keys written as envoy writes them are read back, for each unit, with
// and without a prefix, at the first and the last instant of a window and
// at the next window's first: the window a key names ends exactly at its
// start plus the unit, with no TTL read.
func TestEnvoyPeekReadsEnvoyKeys(t *testing.T) {
	c := redisClient(t)
	for _, prefix := range []string{"", "ratelimit:"} {
		b := newEnvoy(t, c, legacybackend.WithEnvoyPrefix(prefix))
		envoy := envoyProcess{c: c, prefix: prefix}
		for _, unit := range []struct {
			div    int64
			window time.Duration
		}{{envoySecond, time.Second}, {envoyMinute, time.Minute}, {envoyHour, time.Hour}, {envoyDay, 24 * time.Hour}} {
			t.Run(fmt.Sprintf("prefix %q, %v", prefix, unit.window), func(t *testing.T) {
				d := freshDescriptor()
				p := policy(t, "rls", aligned(t, 100, unit.window))
				start := dayStart.Add(3 * unit.window)
				last := start.Add(unit.window - time.Nanosecond)
				next := start.Add(unit.window)
				end := start.Add(unit.window).UnixMilli()

				envoy.mustHit(t, d, unit.div, start.Add(-time.Nanosecond), 9) // the window before
				require.Equal(t, int64(4), envoy.mustHit(t, d, unit.div, start, 4))

				for _, now := range []time.Time{start, start.Add(unit.window / 2), last} {
					out, err := b.Peek(ctx(t), request(p, d.identifier(), now))
					require.NoError(t, err)
					require.True(t, out.Allowed)
					require.Equal(t, []driver.State{{Used: 4, End: end}}, out.States, "at %v", now)
				}
				// The window before is read at its own last instant.
				out, err := b.Peek(ctx(t), request(p, d.identifier(), start.Add(-time.Nanosecond)))
				require.NoError(t, err)
				require.Equal(t, []driver.State{{Used: 9, End: start.UnixMilli()}}, out.States)

				// At the next window's start its own key, missing, is read.
				out, err = b.Peek(ctx(t), request(p, d.identifier(), next))
				require.NoError(t, err)
				require.Equal(t, []driver.State{{}}, out.States)
				envoy.mustHit(t, d, unit.div, next.Add(unit.window/3), 2)
				out, err = b.Peek(ctx(t), request(p, d.identifier(), next))
				require.NoError(t, err)
				require.Equal(t, []driver.State{{Used: 2, End: next.Add(unit.window).UnixMilli()}}, out.States)

				// Cost 0 is the same peek, and writes nothing.
				out, err = b.Decide(ctx(t), request(p, d.identifier(), last))
				require.NoError(t, err)
				require.Equal(t, []driver.State{{Used: 4, End: end}}, out.States)
				n, err := c.Get(context.Background(), envoyKey(prefix, d, unit.div, start)).Int64()
				require.NoError(t, err)
				require.Equal(t, int64(4), n)
			})
		}
	}
}

// A policy of several units reads each from its own key; a limit envoy
// does not count (GCRA, an anchored window, an aligned window of no envoy
// unit) holds the zero State. A count above Max, which envoy reaches by
// counting denied hits, reads as Max.
func TestEnvoyPeekPolicyOfSeveralUnits(t *testing.T) {
	c := redisClient(t)
	prefix := freshPrefix()
	b := newEnvoy(t, c, legacybackend.WithEnvoyPrefix(prefix))
	envoy := envoyProcess{c: c, prefix: prefix}
	d := freshDescriptor()
	p := policy(t, "rls",
		limit(t, "", driver.GCRA, 100, time.Hour),
		aligned(t, 10, time.Second),
		aligned(t, 50, time.Minute),
		limit(t, "", driver.FixedWindow, 10, time.Minute),
		aligned(t, 1000, time.Hour),
		aligned(t, 10, 2*time.Hour),
		aligned(t, 100000, 7*24*time.Hour))
	now := dayStart.Add(5*time.Hour + 7*time.Minute + 13*time.Second + 250*time.Millisecond)
	envoy.mustHit(t, d, envoySecond, now, 3)
	envoy.mustHit(t, d, envoyMinute, now, 70) // over its 50
	envoy.mustHit(t, d, envoyHour, now, 400)
	envoy.mustHit(t, d, 604800, now, 12345)

	out, err := b.Peek(ctx(t), request(p, d.identifier(), now))
	require.NoError(t, err)
	require.Equal(t, []driver.State{
		{},
		{Used: 3, End: windowEnd(envoySecond, now)},
		{Used: 50, End: windowEnd(envoyMinute, now)},
		{},
		{Used: 400, End: windowEnd(envoyHour, now)},
		{},
		{Used: 12345, End: windowEnd(604800, now)},
	}, out.States)
	require.True(t, out.Allowed, "a count at Max leaves room for a peek")
	require.Equal(t, legacybackend.Stats{Reads: 1, Found: 1}, b.Stats())
}

// Two units whose windows start at the same second name one key: it holds
// the requests since that second, which both limits read, and which a
// decision raises once and keeps for the longer unit.
func TestEnvoySharedWindowStart(t *testing.T) {
	c := redisClient(t)
	prefix := freshPrefix()
	b := newEnvoy(t, c, legacybackend.WithEnvoyPrefix(prefix), legacybackend.Deciding())
	envoy := envoyProcess{c: c, prefix: prefix}
	d := freshDescriptor()
	p := policy(t, "rls", aligned(t, 10, time.Minute), aligned(t, 100, time.Hour))
	now := dayStart.Add(5*time.Hour + 10*time.Second) // the first minute of an hour
	key := envoyKey(prefix, d, envoyHour, now)
	require.Equal(t, key, envoyKey(prefix, d, envoyMinute, now))
	envoy.mustHit(t, d, envoyHour, now, 7)

	out, err := b.Peek(ctx(t), request(p, d.identifier(), now))
	require.NoError(t, err)
	require.Equal(t, []driver.State{{Used: 7, End: windowEnd(envoyMinute, now)}, {Used: 7, End: windowEnd(envoyHour, now)}}, out.States)

	out = decide(t, b, p, d.identifier(), now, 2)
	require.True(t, out.Allowed)
	require.Equal(t, []driver.State{{Used: 9, End: windowEnd(envoyMinute, now)}, {Used: 9, End: windowEnd(envoyHour, now)}}, out.States)
	n, err := c.Get(context.Background(), key).Int64()
	require.NoError(t, err)
	require.Equal(t, int64(9), n, "counted once")
	ttl, err := c.TTL(context.Background(), key).Result()
	require.NoError(t, err)
	require.Greater(t, ttl, time.Minute, "kept for the hour")

	// A minute later the minute has a key of its own, the hour the same.
	later := now.Add(time.Minute)
	out = decide(t, b, p, d.identifier(), later, 1)
	require.Equal(t, []driver.State{{Used: 1, End: windowEnd(envoyMinute, later)}, {Used: 10, End: windowEnd(envoyHour, later)}}, out.States)
	ttl, err = c.TTL(context.Background(), envoyKey(prefix, d, envoyMinute, later)).Result()
	require.NoError(t, err)
	require.LessOrEqual(t, ttl, time.Minute)
	require.Greater(t, ttl, 50*time.Second)
}

// A Deciding backend counts as envoy does: INCRBY of the cost and EXPIRE
// of the unit on every call, denied calls included; allowed while every
// count after is at most Max; the states say the counts after, at most
// Max.
func TestEnvoyDecidingCountsAsEnvoy(t *testing.T) {
	c := redisClient(t)
	prefix := freshPrefix()
	b := newEnvoy(t, c, legacybackend.WithEnvoyPrefix(prefix), legacybackend.Deciding())
	envoy := envoyProcess{c: c, prefix: prefix}
	d := freshDescriptor()
	p := policy(t, "rls", aligned(t, 5, time.Minute), aligned(t, 7, time.Hour))
	now := dayStart.Add(2*time.Hour + 30*time.Minute + 500*time.Millisecond)
	m, h := windowEnd(envoyMinute, now), windowEnd(envoyHour, now)
	mKey, hKey := envoyKey(prefix, d, envoyMinute, now), envoyKey(prefix, d, envoyHour, now)

	out := decide(t, b, p, d.identifier(), now, 3)
	require.True(t, out.Allowed)
	require.Equal(t, []driver.State{{Used: 3, End: m}, {Used: 3, End: h}}, out.States)
	require.Equal(t, int64(4), envoy.mustHit(t, d, envoyMinute, now, 1)) // envoy's own hit, minute only
	out = decide(t, b, p, d.identifier(), now, 1)
	require.True(t, out.Allowed)
	require.Equal(t, []driver.State{{Used: 5, End: m}, {Used: 4, End: h}}, out.States)
	out = decide(t, b, p, d.identifier(), now, 1)
	require.False(t, out.Allowed)
	require.Equal(t, []driver.State{{Used: 5, End: m}, {Used: 5, End: h}}, out.States, "the minute's 6 reads as its Max")
	for key, want := range map[string]int64{mKey: 6, hKey: 5} {
		n, err := c.Get(context.Background(), key).Int64()
		require.NoError(t, err)
		require.Equal(t, want, n, "denied units counted, as envoy counts them")
	}
	ttl, err := c.TTL(context.Background(), hKey).Result()
	require.NoError(t, err)
	require.Greater(t, ttl, 59*time.Minute)

	// What the throttler reports from those states.
	st := driver.Evaluate(&p.Limits[0], out.States[0], now, 1, out.Allowed)
	require.Equal(t, int64(0), st.Remaining)
	require.True(t, time.UnixMilli(m).Equal(st.ResetAt))

	s := b.Stats()
	require.Equal(t, uint64(3), s.Decided)
	require.Equal(t, uint64(1), s.Opened)
}

// Seed merges the given states into envoy's keys by driver.Merge's rule
// (the larger count of the same window) and then counts the cost.
func TestEnvoySeed(t *testing.T) {
	c := redisClient(t)
	prefix := freshPrefix()
	b := newEnvoy(t, c, legacybackend.WithEnvoyPrefix(prefix), legacybackend.Deciding())
	envoy := envoyProcess{c: c, prefix: prefix}
	d := freshDescriptor()
	id := d.identifier()
	p := policy(t, "rls", aligned(t, 10, time.Minute), aligned(t, 100, time.Hour))
	now := dayStart.Add(2*time.Hour + 30*time.Minute)
	m, h := windowEnd(envoyMinute, now), windowEnd(envoyHour, now)
	envoy.mustHit(t, d, envoyHour, now, 20)
	// A server that does not know the script yet: the call sends it.
	require.NoError(t, c.ScriptFlush(context.Background()).Err())
	seed := func(cost int64, given ...driver.State) driver.Outcome {
		t.Helper()
		req := request(p, id, now)
		req.Cost = cost
		out, err := b.Seed(ctx(t), req, given)
		require.NoError(t, err)
		return out
	}

	// The minute key is missing: it takes the given count; the hour keeps
	// its larger one.
	out := seed(0, driver.State{Used: 4, End: m}, driver.State{Used: 6, End: h})
	require.True(t, out.Allowed)
	require.Equal(t, []driver.State{{}, {Used: 20, End: h}}, out.Prior)
	require.Equal(t, []driver.State{{Used: 4, End: m}, {Used: 20, End: h}}, out.States)
	ttl, err := c.TTL(context.Background(), envoyKey(prefix, d, envoyMinute, now)).Result()
	require.NoError(t, err)
	require.Greater(t, ttl, 50*time.Second)

	// Seeding again changes nothing; a closed window, or one of another
	// end, is not taken.
	out = seed(0, driver.State{Used: 4, End: m}, driver.State{Used: 6, End: h})
	require.Equal(t, out.Prior, out.States)
	out = seed(0, driver.State{Used: 9, End: now.UnixMilli()}, driver.State{Used: 90, End: h + 3600_000})
	require.Equal(t, []driver.State{{Used: 4, End: m}, {Used: 20, End: h}}, out.States)

	// Merge, then count the cost, denied or not.
	out = seed(3, driver.State{Used: 8, End: m}, driver.State{})
	require.False(t, out.Allowed)
	require.Equal(t, []driver.State{{Used: 4, End: m}, {Used: 20, End: h}}, out.Prior)
	require.Equal(t, []driver.State{{Used: 10, End: m}, {Used: 23, End: h}}, out.States)
	n, err := c.Get(context.Background(), envoyKey(prefix, d, envoyMinute, now)).Int64()
	require.NoError(t, err)
	require.Equal(t, int64(11), n)
	out = seed(0, driver.State{}, driver.State{})
	require.True(t, out.Allowed)

	s := b.Stats()
	require.Equal(t, uint64(2), s.Seeded, "the first and the fourth call raised a count")
}

// During the way in, a split rollout at 100 % from a read-only EnvoyRedis
// carries an open envoy window into the new store: same count, same end.
func TestEnvoyRolloutCarriesWindow(t *testing.T) {
	c := redisClient(t)
	prefix := freshPrefix()
	old := newEnvoy(t, c, legacybackend.WithEnvoyPrefix(prefix))
	envoy := envoyProcess{c: c, prefix: prefix}
	th, clock := migrate(t, old)
	now := dayStart.Add(3*time.Hour + 20*time.Minute + 42*time.Second)
	clock.Set(now)
	p, err := throttler.ParsePolicy("rls", "20/min aligned, 500/h aligned")
	require.NoError(t, err)
	d := freshDescriptor()
	envoy.mustHit(t, d, envoyMinute, now.Add(-30*time.Second), 6)

	reset := time.UnixMilli(windowEnd(envoyMinute, now))
	requireRemaining(t, th, p, d.identifier(), true, 20-6-1, reset)
	clock.Advance(10 * time.Second)
	requireRemaining(t, th, p, d.identifier(), true, 20-6-2, reset)

	// Read once, written never.
	n, err := c.Get(context.Background(), envoyKey(prefix, d, envoyMinute, now)).Int64()
	require.NoError(t, err)
	require.Equal(t, int64(6), n)
	require.Equal(t, uint64(1), old.Stats().Found)

	// An identifier envoy never counted starts afresh.
	requireRemaining(t, th, p, "other", true, 19, reset)
}

// While envoy ratelimit processes still serve, throttlekit counts in their
// keys (a Deciding EnvoyRedis as the old side of a mirror rollout at 0 %,
// the new store written alongside). An envoy process counting at the same
// time shares every window: the key counts every request of both, and no
// quota is granted twice. Then at 100 % the new store decides and envoy's
// keys count the units it grants.
func TestEnvoyMirrorCountsWithEnvoy(t *testing.T) {
	c := redisClient(t)
	prefix := freshPrefix()
	old := newEnvoy(t, c, legacybackend.WithEnvoyPrefix(prefix), legacybackend.Deciding())
	mem := memorybackend.New()
	src, err := rollout.NewStaticSource(0)
	require.NoError(t, err)
	var secondary atomic.Int64
	rb, err := rollout.New(old, mem, src, rollout.WithMode(rollout.MirrorMode),
		rollout.WithSecondaryErrorHandler(func(error) { secondary.Add(1) }))
	require.NoError(t, err)
	now := dayStart.Add(7*time.Hour + 5*time.Minute + 15*time.Second)
	clock := throttlertest.NewManualClock(now)
	th, err := throttler.New(rb, throttler.WithClock(clock), throttler.WithCallTimeout(testTimeout))
	require.NoError(t, err)
	const max = 40
	p, err := throttler.ParsePolicy("rls", fmt.Sprintf("%d/min aligned", max))
	require.NoError(t, err)
	d := freshDescriptor()
	id := d.identifier()
	reset := time.UnixMilli(windowEnd(envoyMinute, now))

	// Some history from envoy before the first throttlekit process.
	envoy := envoyProcess{c: c, prefix: prefix}
	envoy.mustHit(t, d, envoyMinute, now, 5)

	const workers, perWorker = 4, 15 // of each kind: 120 requests in all
	var allowedTK, allowedEnvoy atomic.Int64
	// One throttlekit decision first, so that however the scheduler orders
	// the workers below, both kinds of process have granted in the window.
	first, err := th.Allow(context.Background(), p, id)
	require.NoError(t, err)
	require.True(t, first.Allowed)
	allowedTK.Add(1)
	errs := make(chan error, 2*workers*perWorker)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for range perWorker {
				r, err := th.Allow(context.Background(), p, id)
				switch {
				case err != nil:
					errs <- err
				case r.Degraded:
					errs <- r.Err
				case !r.ResetAt.Equal(reset):
					errs <- fmt.Errorf("reset %v, want %v", r.ResetAt, reset)
				case r.Allowed:
					allowedTK.Add(1)
				}
			}
		}()
		go func() {
			defer wg.Done()
			for range perWorker {
				_, ok, err := envoy.hit(d, envoyMinute, max, now, 1)
				if err != nil {
					errs <- err
				} else if ok {
					allowedEnvoy.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	total := int64(5 + 1 + 2*workers*perWorker)
	n, err := c.Get(context.Background(), envoyKey(prefix, d, envoyMinute, now)).Int64()
	require.NoError(t, err)
	require.Equal(t, total, n, "every request of both counted once")
	require.Equal(t, int64(max-5), allowedTK.Load()+allowedEnvoy.Load(), "the quota granted once: %d by throttlekit, %d by envoy", allowedTK.Load(), allowedEnvoy.Load())
	require.Positive(t, allowedTK.Load())
	require.Zero(t, secondary.Load())

	// The new store holds the window, full, with envoy's end.
	newTh, err := throttler.New(mem, throttler.WithClock(clock))
	require.NoError(t, err)
	r, err := newTh.Peek(context.Background(), p, id)
	require.NoError(t, err)
	require.Equal(t, int64(0), r.Remaining)
	require.True(t, reset.Equal(r.ResetAt))

	// Once no envoy process remains: 100 %, the new store decides and
	// envoy's keys are raised to its counts.
	require.NoError(t, src.Set(100))
	next := clock.Advance(time.Minute)
	for i := range 3 {
		requireRemaining(t, th, p, id, true, max-int64(i)-1, time.UnixMilli(windowEnd(envoyMinute, next)))
	}
	n, err = c.Get(context.Background(), envoyKey(prefix, d, envoyMinute, next)).Int64()
	require.NoError(t, err)
	require.Equal(t, int64(3), n, "envoy's key counts the units the new store granted")
	require.Zero(t, secondary.Load())
}

// On a Redis Cluster the keys of one identifier's units lie in different
// slots: reads and decisions go to each key's primary, in one pipeline.
func TestEnvoyCluster(t *testing.T) {
	localserver.SkipIfShort(t)
	cluster := localserver.RedisClusterT(t, 3, 0)
	c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: cluster.Addrs(), ReadTimeout: testTimeout, WriteTimeout: testTimeout})
	t.Cleanup(func() { _ = c.Close() })
	b := newEnvoy(t, c, legacybackend.WithEnvoyPrefix("rl:"), legacybackend.Deciding())
	require.NoError(t, b.Ping(ctx(t)))
	envoy := envoyProcess{c: c, prefix: "rl:"}
	p := policy(t, "rls", aligned(t, 10, time.Minute), aligned(t, 100, time.Hour))
	now := dayStart.Add(9*time.Hour + 17*time.Minute + 3*time.Second)
	m, h := windowEnd(envoyMinute, now), windowEnd(envoyHour, now)
	split := 0
	for i := range 12 {
		d := freshDescriptor()
		d.entries = append(d.entries, [2]string{"user", strconv.Itoa(i)})
		mKey, hKey := envoyKey("rl:", d, envoyMinute, now), envoyKey("rl:", d, envoyHour, now)
		ms, err := c.ClusterKeySlot(context.Background(), mKey).Result()
		require.NoError(t, err)
		hs, err := c.ClusterKeySlot(context.Background(), hKey).Result()
		require.NoError(t, err)
		if ms != hs {
			split++
		}
		envoy.mustHit(t, d, envoyMinute, now, int64(i%5+1))
		envoy.mustHit(t, d, envoyHour, now, int64(i+20))

		out, err := b.Peek(ctx(t), request(p, d.identifier(), now))
		require.NoError(t, err)
		require.Equal(t, []driver.State{{Used: int64(i%5 + 1), End: m}, {Used: int64(i + 20), End: h}}, out.States)

		out = decide(t, b, p, d.identifier(), now, 2)
		require.True(t, out.Allowed)
		require.Equal(t, []driver.State{{Used: int64(i%5 + 3), End: m}, {Used: int64(i + 22), End: h}}, out.States)

		req := request(p, d.identifier(), now)
		req.Cost = 1
		out, err = b.Seed(ctx(t), req, []driver.State{{Used: 9, End: m}, {}})
		require.NoError(t, err)
		require.Equal(t, []driver.State{{Used: 10, End: m}, {Used: int64(i + 23), End: h}}, out.States)
		for key, want := range map[string]int64{mKey: 10, hKey: int64(i + 23)} {
			n, err := c.Get(context.Background(), key).Int64()
			require.NoError(t, err)
			require.Equal(t, want, n)
		}
	}
	require.Positive(t, split, "some identifier's keys must lie in two slots")
}

// A value envoy could not have written is an error wrapping
// driver.ErrBadReply, for every operation, and nothing is written over
// it.
func TestEnvoyBadValues(t *testing.T) {
	c := redisClient(t)
	prefix := freshPrefix()
	ro := newEnvoy(t, c, legacybackend.WithEnvoyPrefix(prefix))
	dec := newEnvoy(t, c, legacybackend.WithEnvoyPrefix(prefix), legacybackend.Deciding())
	p := policy(t, "rls", aligned(t, 10, time.Minute))
	now := dayStart.Add(time.Hour + 30*time.Second)
	bg := context.Background()
	for _, bad := range []struct {
		name  string
		write func(key string) error
	}{
		{"text", func(k string) error { return c.Set(bg, k, "abc", time.Minute).Err() }},
		{"fraction", func(k string) error { return c.Set(bg, k, "1.5", time.Minute).Err() }},
		{"padded", func(k string) error { return c.Set(bg, k, " 5", time.Minute).Err() }},
		{"empty", func(k string) error { return c.Set(bg, k, "", time.Minute).Err() }},
		{"hash", func(k string) error { return c.HSet(bg, k, "count", 3).Err() }},
		{"list", func(k string) error { return c.RPush(bg, k, "3").Err() }},
	} {
		t.Run(bad.name, func(t *testing.T) {
			d := freshDescriptor()
			key := envoyKey(prefix, d, envoyMinute, now)
			require.NoError(t, bad.write(key))
			dump, err := c.Dump(bg, key).Result()
			require.NoError(t, err)
			_, err = ro.Peek(ctx(t), request(p, d.identifier(), now))
			require.ErrorIs(t, err, driver.ErrBadReply)
			_, err = dec.Decide(ctx(t), request(p, d.identifier(), now)) // cost 0
			require.ErrorIs(t, err, driver.ErrBadReply)
			req := request(p, d.identifier(), now)
			req.Cost = 1
			_, err = dec.Decide(ctx(t), req)
			require.ErrorIs(t, err, driver.ErrBadReply)
			_, err = dec.Seed(ctx(t), req, []driver.State{{Used: 3, End: windowEnd(envoyMinute, now)}})
			require.ErrorIs(t, err, driver.ErrBadReply)
			after, err := c.Dump(bg, key).Result()
			require.NoError(t, err)
			require.Equal(t, dump, after, "nothing written over it")
		})
	}
	require.Positive(t, ro.Stats().Malformed)

	// A count beyond int64, which INCRBY refuses, reads as Max.
	d := freshDescriptor()
	require.NoError(t, c.Set(bg, envoyKey(prefix, d, envoyMinute, now), "99999999999999999999", time.Minute).Err())
	out, err := ro.Peek(ctx(t), request(p, d.identifier(), now))
	require.NoError(t, err)
	require.Equal(t, []driver.State{{Used: 10, End: windowEnd(envoyMinute, now)}}, out.States)
	req := request(p, d.identifier(), now)
	req.Cost = 1
	_, err = dec.Decide(ctx(t), req)
	require.ErrorIs(t, err, driver.ErrBadReply)
}

// Read-only refuses to spend; Deciding refuses a policy it cannot hold
// whole; a policy with no envoy unit reads nothing, and says so once.
func TestEnvoyRefusals(t *testing.T) {
	c := redisClient(t)
	prefix := freshPrefix()
	var logs bytes.Buffer
	ro := newEnvoy(t, c, legacybackend.WithEnvoyPrefix(prefix), legacybackend.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	dec := newEnvoy(t, c, legacybackend.WithEnvoyPrefix(prefix), legacybackend.Deciding())
	now := dayStart.Add(time.Hour)
	rls := policy(t, "rls", aligned(t, 10, time.Minute))
	req := request(rls, "id", now)
	req.Cost = 1
	_, err := ro.Decide(ctx(t), req)
	require.ErrorIs(t, err, errors.ErrUnsupported)
	_, err = ro.Seed(ctx(t), req, []driver.State{{}})
	require.ErrorIs(t, err, errors.ErrUnsupported)
	_, err = dec.Seed(ctx(t), req, nil)
	require.ErrorIs(t, err, driver.ErrInvalidState)
	_, err = dec.Seed(ctx(t), req, []driver.State{{Used: 1<<53 + 1, End: windowEnd(envoyMinute, now)}})
	require.ErrorIs(t, err, driver.ErrInvalidState)
	req.Cost = -1
	_, err = dec.Decide(ctx(t), req)
	require.ErrorIs(t, err, driver.ErrInvalidOption)

	mixed := policy(t, "mixed", aligned(t, 10, time.Minute), limit(t, "", driver.GCRA, 5, time.Second))
	for _, pol := range []*driver.Policy{mixed, policy(t, "fixed", limit(t, "", driver.FixedWindow, 10, time.Minute))} {
		req := request(pol, "id", now)
		req.Cost = 1
		_, err = dec.Decide(ctx(t), req)
		require.ErrorIs(t, err, errors.ErrUnsupported)
		_, err = dec.Seed(ctx(t), req, make([]driver.State, len(pol.Limits)))
		require.ErrorIs(t, err, errors.ErrUnsupported)
	}

	// A peek of a policy with no envoy unit costs no round trip.
	fixed := policy(t, "fixed", limit(t, "", driver.FixedWindow, 10, time.Minute), aligned(t, 10, 90*time.Second))
	for range 2 {
		out, err := ro.Peek(ctx(t), request(fixed, "id", now))
		require.NoError(t, err)
		require.True(t, out.Allowed)
		require.Equal(t, make([]driver.State, 2), out.States)
	}
	require.Equal(t, legacybackend.Stats{Unmatched: 2}, ro.Stats())
	require.Equal(t, 1, strings.Count(logs.String(), "level=WARN"), logs.String())
	require.Contains(t, logs.String(), "policy=fixed")
}

func TestNewEnvoyRedisErrors(t *testing.T) {
	c := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = c.Close() })
	var nilClient *goredis.Client
	for name, opts := range map[string][]legacybackend.Option{
		"nil option":      {nil},
		"WithKeyFunc":     {legacybackend.WithKeyFunc(legacybackend.DefaultKey)},
		"WithMatcher":     {legacybackend.WithMatcher(legacybackend.MatchWindow(0))},
		"WithWindow":      {legacybackend.WithWindow(time.Minute)},
		"WithNoTTLWindow": {legacybackend.WithNoTTLWindow(time.Minute)},
		"WithResetMillis": {legacybackend.WithResetMillis()},
	} {
		t.Run(name, func(t *testing.T) {
			b, err := legacybackend.NewEnvoyRedis(c, opts...)
			require.ErrorIs(t, err, driver.ErrInvalidOption)
			require.Nil(t, b)
		})
	}
	for name, client := range map[string]goredis.UniversalClient{"nil client": nil, "typed nil client": nilClient} {
		t.Run(name, func(t *testing.T) {
			b, err := legacybackend.NewEnvoyRedis(client)
			require.ErrorIs(t, err, driver.ErrInvalidOption)
			require.Nil(t, b)
		})
	}
	// WithEnvoyPrefix is for NewEnvoyRedis only.
	_, err := legacybackend.NewRedis(c, legacybackend.WithEnvoyPrefix("x"))
	require.ErrorIs(t, err, driver.ErrInvalidOption)
	b, err := legacybackend.NewEnvoyRedis(c, legacybackend.WithEnvoyPrefix("x"), legacybackend.Deciding(), legacybackend.WithLogger(nil))
	require.NoError(t, err)
	require.NotNil(t, b)
}

func TestEnvoyRedisNotBuilt(t *testing.T) {
	p := policy(t, "rls", aligned(t, 10, time.Minute))
	for name, b := range map[string]*legacybackend.EnvoyRedis{"nil": nil, "zero": {}} {
		t.Run(name, func(t *testing.T) {
			req := request(p, "id", t0)
			_, err := b.Peek(context.Background(), req)
			require.ErrorIs(t, err, driver.ErrNotInitialized)
			_, err = b.Decide(context.Background(), req)
			require.ErrorIs(t, err, driver.ErrNotInitialized)
			req.Cost = 1
			_, err = b.Decide(context.Background(), req)
			require.ErrorIs(t, err, driver.ErrNotInitialized)
			_, err = b.Seed(context.Background(), req, []driver.State{{}})
			require.ErrorIs(t, err, driver.ErrNotInitialized)
			require.ErrorIs(t, b.Ping(context.Background()), driver.ErrNotInitialized)
			b.SetLogger(nil)
			require.Equal(t, legacybackend.Stats{}, b.Stats())
		})
	}
}
