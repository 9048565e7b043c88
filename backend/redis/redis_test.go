package redisbackend_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

var t0 = time.Date(2030, 1, 2, 3, 4, 5, 678_000_000, time.UTC)

func mustPolicy(tb testing.TB, name, limits string, opts ...throttler.Option) *throttler.Policy {
	tb.Helper()
	p, err := throttler.ParsePolicy(name, limits, opts...)
	require.NoError(tb, err)
	return p
}

func mustBackend(tb testing.TB, c redisbackend.Client, opts ...redisbackend.Option) *redisbackend.Backend {
	tb.Helper()
	b, err := redisbackend.New(c, opts...)
	require.NoError(tb, err)
	return b
}

func quiet(tb testing.TB, b driver.Backend, clock throttler.Clock, opts ...throttler.Option) *throttler.Throttler {
	opts = append([]throttler.Option{throttler.WithClock(clock), throttler.WithLogger(nil),
		throttler.WithCallTimeout(5 * time.Second)}, opts...)
	return testkit.Throttler(tb, b, opts...)
}

func TestNewRejectsBadOptions(t *testing.T) {
	c := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	for _, tc := range []struct {
		name   string
		client redisbackend.Client
		opts   []redisbackend.Option
		want   []error
	}{
		{"nil client", nil, nil, []error{driver.ErrInvalidOption}},
		{"nil *goredis.Client", (*goredis.Client)(nil), nil, []error{driver.ErrInvalidOption}},
		{"nil *goredis.ClusterClient", (*goredis.ClusterClient)(nil), nil, []error{driver.ErrInvalidOption}},
		{"nil read client", c, []redisbackend.Option{redisbackend.WithReadClient((*goredis.Ring)(nil))}, []error{driver.ErrInvalidOption}},
		{"open brace in prefix", c, []redisbackend.Option{redisbackend.WithPrefix("app{")}, []error{driver.ErrInvalidOption}},
		{"close brace in prefix", c, []redisbackend.Option{redisbackend.WithPrefix("}app:")}, []error{driver.ErrInvalidOption}},
		{"hash tag in prefix", c, []redisbackend.Option{redisbackend.WithPrefix("{app}:")}, []error{driver.ErrInvalidOption}},
		{"grace below a second", c, []redisbackend.Option{redisbackend.WithExpiryGrace(999 * time.Millisecond)}, []error{driver.ErrInvalidOption}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := redisbackend.New(tc.client, tc.opts...)
			require.Error(t, err)
			assert.Nil(t, b)
			for _, want := range tc.want {
				assert.ErrorIs(t, err, want)
			}
		})
	}
	b, err := redisbackend.New(c, redisbackend.WithPrefix(""), redisbackend.WithExpiryGrace(time.Minute), redisbackend.WithReadClient(nil))
	require.NoError(t, err)
	assert.NotNil(t, b)
}

func TestKeysLayout(t *testing.T) {
	c := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	p, err := throttler.NewPolicy("api v2", []throttler.Limit{
		throttler.PerSecond(10),
		throttler.PerHour(5000).Named("hourly"),
		throttler.PerMinute(60).WithBurst(20).Named("smooth"),
	})
	require.NoError(t, err)
	b := mustBackend(t, c, redisbackend.WithPrefix("app:"))
	assert.Equal(t, []string{
		"app:{user%3A42%7B%7D}:api%20v2::fixed:1000",
		"app:{user%3A42%7B%7D}:api%20v2:hourly:fixed:3600000",
		"app:{user%3A42%7B%7D}:api%20v2:smooth:gcra:60000:20",
	}, b.Keys(testkit.Compile(t, p), "user:42{}"))
	assert.Equal(t, "throttlekit:{a}:p::fixed:1000", mustBackend(t, c).Keys(testkit.Compiled(t, "p", "1/s"), "a")[0])
	// An unnamed limit's key holds neither its Max nor a GCRA burst that
	// follows Max, so raising Max keeps the key; a burst set explicitly is
	// part of the key.
	assert.Equal(t, []string{
		"throttlekit:{a}:p::fixed:1000",
		"throttlekit:{a}:p::sliding:60000",
		"throttlekit:{a}:p::gcra:3600000",
		"throttlekit:{a}:p::gcra:1000:7",
	}, mustBackend(t, c).Keys(testkit.Compiled(t, "p", "5/s, 9/min sliding, 100/h gcra, 3/s gcra burst=7"), "a"))
	assert.Equal(t, mustBackend(t, c).Keys(testkit.Compiled(t, "p", "5/s, 100/h gcra"), "a"),
		mustBackend(t, c).Keys(testkit.Compiled(t, "p", "50/s, 200/h gcra"), "a"))
}

// Only clients known to end a command at its context's deadline run
// commands on the caller's goroutine; the backend cuts every other one short
// itself, unknown types included.
func TestWhichClientsTheBackendCutsShort(t *testing.T) {
	const addr = "127.0.0.1:1"
	plain := goredis.NewClient(&goredis.Options{Addr: addr})
	timed := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
	cluster := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: []string{addr}})
	timedCluster := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: []string{addr}, ContextTimeoutEnabled: true})
	ring := goredis.NewRing(&goredis.RingOptions{Addrs: map[string]string{"a": addr}})
	timedRing := goredis.NewRing(&goredis.RingOptions{Addrs: map[string]string{"a": addr}, ContextTimeoutEnabled: true})
	failover := goredis.NewFailoverClient(&goredis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{addr},
		ContextTimeoutEnabled: true})
	for _, c := range []interface{ Close() error }{plain, timed, cluster, timedCluster, ring, timedRing, failover} {
		defer c.Close()
	}
	ap, err := timed.AutoPipeline()
	require.NoError(t, err)
	// A wrapper of a client that honours deadlines is still of a type the
	// backend does not know.
	wrapped := struct{ *goredis.Client }{timed}

	for _, tc := range []struct {
		name     string
		client   redisbackend.Client
		detached bool
	}{
		{"plain client", plain, true},
		{"client with ContextTimeoutEnabled", timed, false},
		{"plain cluster client", cluster, true},
		{"cluster client with ContextTimeoutEnabled", timedCluster, false},
		{"plain ring", ring, true},
		{"ring with ContextTimeoutEnabled", timedRing, false},
		{"failover client with ContextTimeoutEnabled", failover, false},
		{"auto-pipeliner", ap, true},
		{"unknown type", wrapped, true},
	} {
		assert.Equal(t, tc.detached, redisbackend.Detached(tc.client), tc.name)
	}
}

// A Backend that New did not build has no client: every method returns
// ErrNotInitialized, and nothing panics.
func TestZeroBackendFailsWithoutPanicking(t *testing.T) {
	ctx := context.Background()
	p := mustPolicy(t, "zero", "5/min")
	req := driver.Request{Policy: testkit.Compile(t, p), Identifier: "x", Cost: 1, Now: t0}
	for name, b := range map[string]*redisbackend.Backend{"zero": {}, "nil": nil} {
		_, err := b.Decide(ctx, req)
		assert.ErrorIs(t, err, driver.ErrNotInitialized, name)
		_, err = b.Peek(ctx, req)
		assert.ErrorIs(t, err, driver.ErrNotInitialized, name)
		_, err = b.Refund(ctx, req)
		assert.ErrorIs(t, err, driver.ErrNotInitialized, name)
		assert.ErrorIs(t, b.Reset(ctx, testkit.Compile(t, p), "x"), driver.ErrNotInitialized, name)
		assert.ErrorIs(t, b.Ping(ctx), driver.ErrNotInitialized, name)
		assert.NotPanics(t, func() { b.Keys(testkit.Compile(t, p), "x") }, name)

		// Through a throttler: an error, never a silent allow, and no panic.
		if b != nil {
			_, err = quiet(t, b, throttler.NewManualClock(t0)).Allow(ctx, p, "x")
			assert.ErrorIs(t, err, throttler.ErrNotInitialized, name)
		}
	}
}

// The hash tag is the whole escaped identifier, so an identifier cannot pick
// its slot with braces of its own, and all its keys share one slot.
func TestKeysOfAnIdentifierShareOneSlot(t *testing.T) {
	ctx := context.Background()
	cc := newClusterClient(t, cluster(t), false)
	b := mustBackend(t, cc, redisbackend.WithPrefix(newPrefix()))
	p := mustPolicy(t, "slots", "10/s, 100/min aligned, 1000/h, 50/min gcra burst=5")
	th := quiet(t, b, throttler.NewManualClock(t0))
	for _, id := range []string{"user:42", "{user:42}", "}{", "{}", "a{b}c", "{a}", "x}y{z}", "ip:203.0.113.9", "\x00\xff{"} {
		keys := b.Keys(testkit.Compile(t, p), id)
		want, err := cc.ClusterKeySlot(ctx, driver.EscapeKey(id)).Result()
		require.NoError(t, err)
		for _, k := range keys {
			got, err := cc.ClusterKeySlot(ctx, k).Result()
			require.NoError(t, err)
			assert.Equal(t, want, got, "identifier %q, key %q", id, k)
		}
		// One script touches all of them: no CROSSSLOT.
		r, err := th.Allow(ctx, p, id)
		require.NoError(t, err)
		assert.True(t, r.Allowed, "%q", id)
		assert.False(t, r.Degraded, "%q: %v", id, r.Err)
	}
	// Identifiers that differ only in where the bytes fall never share keys.
	assert.NotEqual(t, b.Keys(testkit.Compile(t, p), "a_b")[0]+b.Keys(testkit.Compile(t, p), "c")[0], b.Keys(testkit.Compile(t, p), "a")[0]+b.Keys(testkit.Compile(t, p), "b_c")[0])
	assert.NotEqual(t, b.Keys(testkit.Compile(t, p), "a:b")[0], b.Keys(testkit.Compile(t, p), "a%3Ab")[0])
}

// clientKind is one way to reach Redis that the backend must work through.
type clientKind struct {
	name string
	// client returns the client for decisions and the one for peeks, and a
	// function that waits until replicas have every write so far (nil when
	// peeks read the primary).
	client func(t *testing.T) (redisbackend.Client, redisbackend.Client, func(*testing.T))
}

// waitReplicas waits until every replica of c's primaries acknowledged the
// writes made so far.
func waitReplicas(c interface {
	Wait(ctx context.Context, numSlaves int, timeout time.Duration) *goredis.IntCmd
}) func(*testing.T) {
	return func(t *testing.T) {
		n, err := c.Wait(context.Background(), 1, 5*time.Second).Result()
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
	}
}

func clientKinds() []clientKind {
	return []clientKind{
		{"standalone", func(t *testing.T) (redisbackend.Client, redisbackend.Client, func(*testing.T)) {
			c := newClient(t, standalone(t).primary.Addr())
			return c, c, nil
		}},
		{"standalone with replica reads", func(t *testing.T) (redisbackend.Client, redisbackend.Client, func(*testing.T)) {
			s := standalone(t)
			c := newClient(t, s.primary.Addr())
			return c, newClient(t, s.replica.Addr()), waitReplicas(c)
		}},
		{"autopipeline", func(t *testing.T) (redisbackend.Client, redisbackend.Client, func(*testing.T)) {
			ap := newAutoPipeliner(t, newClient(t, standalone(t).primary.Addr()))
			return ap, ap, nil
		}},
		{"cluster", func(t *testing.T) (redisbackend.Client, redisbackend.Client, func(*testing.T)) {
			cc := newClusterClient(t, cluster(t), false)
			return cc, cc, nil
		}},
		{"cluster with replica reads", func(t *testing.T) (redisbackend.Client, redisbackend.Client, func(*testing.T)) {
			c := cluster(t)
			cc := newClusterClient(t, c, false)
			return cc, newClusterClient(t, c, true), func(t *testing.T) {
				require.NoError(t, cc.ForEachMaster(context.Background(), func(ctx context.Context, node *goredis.Client) error {
					waitReplicas(node)(t)
					return nil
				}))
			}
		}},
		{"cluster autopipeline", func(t *testing.T) (redisbackend.Client, redisbackend.Client, func(*testing.T)) {
			cc := newClusterClient(t, cluster(t), false)
			ap, err := cc.AutoPipeline()
			require.NoError(t, err)
			return ap, ap, nil
		}},
	}
}

// Every kind of client gives the results of the memory backend, the
// reference implementation, on one random timeline of decisions, peeks,
// refunds and resets with a clock that jumps both ways.
func TestMatchesMemoryBackend(t *testing.T) {
	ctx := context.Background()
	policies := []*throttler.Policy{
		mustPolicy(t, "burst", "3/s, 10/min"),
		mustPolicy(t, "aligned", "5/min aligned, 20/h"),
		mustPolicy(t, "gcra", "10/min gcra burst=4, 30/h"),
		mustPolicy(t, "one", "2/min"),
	}
	for _, kind := range clientKinds() {
		t.Run(kind.name, func(t *testing.T) {
			client, reader, syncReplicas := kind.client(t)
			rb := mustBackend(t, client, redisbackend.WithPrefix(newPrefix()), redisbackend.WithReadClient(reader))
			clock := throttler.NewManualClock(t0)
			got, want := quiet(t, rb, clock), quiet(t, memorybackend.New(), clock)
			rng := rand.New(rand.NewPCG(1, 2))
			ids := []string{"alice", "bob", "{carol}"}
			for step := range 400 {
				p := policies[rng.IntN(len(policies))]
				id := ids[rng.IntN(len(ids))]
				label := fmt.Sprintf("step %d: %s %q at %s", step, p.Name(), id, clock.Now().Format(time.StampMilli))
				var r1, r2 throttler.Result
				var err1, err2 error
				switch op := rng.IntN(10); {
				case op < 6:
					cost := int64(rng.IntN(4))
					label += fmt.Sprintf(" allow %d", cost)
					r1, err1 = got.AllowN(ctx, p, id, cost)
					r2, err2 = want.AllowN(ctx, p, id, cost)
				case op < 8:
					label += " peek"
					if syncReplicas != nil {
						syncReplicas(t)
					}
					r1, err1 = got.Peek(ctx, p, id)
					r2, err2 = want.Peek(ctx, p, id)
				case op < 9:
					n := int64(rng.IntN(3))
					label += fmt.Sprintf(" refund %d", n)
					r1, err1 = got.Refund(ctx, p, id, n)
					r2, err2 = want.Refund(ctx, p, id, n)
				default:
					label += " reset"
					err1 = got.Reset(ctx, p, id)
					err2 = want.Reset(ctx, p, id)
				}
				require.Equal(t, err2 == nil, err1 == nil, "%s: %v / %v", label, err1, err2)
				require.False(t, r1.Degraded, "%s: %v", label, r1.Err)
				require.Equal(t, r2, r1, label)
				// Mostly forwards, sometimes backwards, sometimes past windows.
				switch jump := rng.IntN(20); {
				case jump == 0:
					clock.Advance(-time.Duration(rng.IntN(2000)) * time.Millisecond)
				case jump == 1:
					clock.Advance(time.Duration(rng.IntN(3)) * time.Hour)
				default:
					clock.Advance(time.Duration(rng.IntN(700)) * time.Millisecond)
				}
			}
		})
	}
}

// A key of this backend that holds a value it did not write is an error
// that names it, never a panic and never a partial write; the throttler
// applies the failure mode.
func TestForeignValueIsAnError(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, standalone(t).primary.Addr())
	b := mustBackend(t, c, redisbackend.WithPrefix(newPrefix()))
	p := mustPolicy(t, "foreign", "5/min, 50/h", throttler.WithFailureMode(throttler.FailClosed))
	now := t0
	for _, tc := range []struct {
		name  string
		write func(key string) error
	}{
		{"hash", func(k string) error { return c.HSet(ctx, k, "u", 1, "e", 2).Err() }},
		{"list", func(k string) error { return c.RPush(ctx, k, "x").Err() }},
		{"string in another format", func(k string) error { return c.Set(ctx, k, "3", time.Minute).Err() }},
		{"string with junk", func(k string) error { return c.Set(ctx, k, "1:2:3", time.Minute).Err() }},
		{"number beyond 2^53", func(k string) error { return c.Set(ctx, k, "1:99999999999999999999", time.Minute).Err() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "id-" + tc.name
			keys := b.Keys(testkit.Compile(t, p), id)
			require.NoError(t, tc.write(keys[1]))
			for name, call := range map[string]func() (driver.Outcome, error){
				"decide": func() (driver.Outcome, error) {
					return b.Decide(ctx, driver.Request{Policy: testkit.Compile(t, p), Identifier: id, Cost: 1, Now: now})
				},
				"peek": func() (driver.Outcome, error) {
					return b.Peek(ctx, driver.Request{Policy: testkit.Compile(t, p), Identifier: id, Now: now})
				},
				"refund": func() (driver.Outcome, error) {
					return b.Refund(ctx, driver.Request{Policy: testkit.Compile(t, p), Identifier: id, Cost: 1, Now: now})
				},
			} {
				_, err := call()
				assert.ErrorIs(t, err, redisbackend.ErrForeignValue, name)
			}
			// The first limit's key, read before the foreign one, was not
			// written either.
			n, err := c.Exists(ctx, keys[0]).Result()
			require.NoError(t, err)
			assert.Zero(t, n)

			r, err := quiet(t, b, throttler.NewManualClock(now)).Allow(ctx, p, id)
			require.NoError(t, err)
			assert.True(t, r.Degraded)
			assert.False(t, r.Allowed)
			assert.ErrorIs(t, r.Err, redisbackend.ErrForeignValue)
			assert.ErrorIs(t, r.Err, throttler.ErrBackend)

			// Reset clears it.
			require.NoError(t, b.Reset(ctx, testkit.Compile(t, p), id))
			r, err = quiet(t, b, throttler.NewManualClock(now)).Allow(ctx, p, id)
			require.NoError(t, err)
			assert.True(t, r.Allowed)
			assert.False(t, r.Degraded, "%v", r.Err)
		})
	}
}

// Replies a proxy or an incompatible server could send are errors.
func TestOddRepliesAreErrors(t *testing.T) {
	for _, tc := range []struct {
		name  string
		reply any
	}{
		{"nil", nil},
		{"status", "OK"},
		{"integer", int64(1)},
		{"short array", []any{int64(1), int64(0), int64(0)}},
		{"long array", []any{int64(1), int64(0), int64(0), int64(0), int64(0)}},
		{"string element", []any{int64(1), "5", int64(0), int64(0)}},
		{"nil element", []any{int64(1), nil, int64(0), int64(0)}},
		{"float element", []any{int64(1), 1.5, int64(0), int64(0)}},
		{"verdict 2", []any{int64(2), int64(0), int64(0), int64(0)}},
		{"nested array", []any{[]any{int64(1)}, int64(0), int64(0), int64(0)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := redisbackend.ParseReply(tc.reply, 1, false)
			assert.ErrorIs(t, err, redisbackend.ErrUnexpectedReply)
			assert.ErrorIs(t, err, driver.ErrBadReply)
		})
	}
	out, err := redisbackend.ParseReply([]any{int64(1), int64(3), int64(1700000000000), int64(0), int64(0), int64(1700000000000123), int64(0)}, 2, false)
	require.NoError(t, err)
	assert.Equal(t, driver.Outcome{Allowed: true, States: []driver.State{{Used: 3, End: 1700000000000}, {End: 1700000000000123}}}, out)
	_, err = redisbackend.ParseReply([]any{int64(-1), int64(0), int64(0), int64(0)}, 1, true)
	assert.ErrorIs(t, err, redisbackend.ErrUnexpectedReply, "a negative grant")
	out, err = redisbackend.ParseReply([]any{int64(7), int64(9), int64(1700000000000), int64(4)}, 1, true)
	require.NoError(t, err)
	assert.Equal(t, driver.Outcome{Allowed: true, Granted: 7, States: []driver.State{{Used: 9, End: 1700000000000, Prev: 4}}}, out)
}

// A backend used without a throttler checks its input too.
func TestBackendRejectsBadRequests(t *testing.T) {
	ctx := context.Background()
	b := mustBackend(t, newClient(t, standalone(t).primary.Addr()), redisbackend.WithPrefix(newPrefix()))
	p := testkit.Compiled(t, "direct", "1/s")
	for _, req := range []driver.Request{
		{Identifier: "x", Cost: 1, Now: t0},
		{Policy: &driver.Policy{}, Identifier: "x", Cost: 1, Now: t0},
		{Policy: p, Identifier: "", Cost: 1, Now: t0},
		{Policy: p, Identifier: "x", Cost: -1, Now: t0},
	} {
		_, err := b.Decide(ctx, req)
		require.Error(t, err)
		assert.True(t, errors.Is(err, driver.ErrInvalidPolicy) || errors.Is(err, driver.ErrInvalidOption), "%v", err)
	}
	assert.ErrorIs(t, b.Reset(ctx, nil, "x"), throttler.ErrInvalidPolicy)
	assert.Nil(t, b.Keys(nil, "x"))

	// A zero ManualClock reads year 1, beyond what Lua's doubles hold
	// exactly: an error, not a wrong answer.
	for _, now := range []time.Time{{}, time.Date(2300, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(1650, 1, 1, 0, 0, 0, 0, time.UTC)} {
		_, err := b.Decide(ctx, driver.Request{Policy: p, Identifier: "x", Cost: 1, Now: now})
		assert.ErrorIs(t, err, driver.ErrInvalidOption, "%v", now)
	}
	for _, now := range []time.Time{time.Date(1700, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2239, 12, 31, 0, 0, 0, 0, time.UTC)} {
		_, err := b.Decide(ctx, driver.Request{Policy: p, Identifier: "x", Cost: 1, Now: now})
		assert.NoError(t, err, "%v", now)
	}
}

func TestResetDeletesEveryKey(t *testing.T) {
	ctx := context.Background()
	cc := newClusterClient(t, cluster(t), false)
	b := mustBackend(t, cc, redisbackend.WithPrefix(newPrefix()))
	p := mustPolicy(t, "reset", "5/s, 50/min, 10/min gcra")
	th := quiet(t, b, throttler.NewManualClock(t0))
	_, err := th.AllowN(ctx, p, "user", 3)
	require.NoError(t, err)
	keys := b.Keys(testkit.Compile(t, p), "user")
	n, err := cc.Exists(ctx, keys...).Result()
	require.NoError(t, err)
	require.EqualValues(t, len(keys), n)
	require.NoError(t, th.Reset(ctx, p, "user"))
	n, err = cc.Exists(ctx, keys...).Result()
	require.NoError(t, err)
	assert.Zero(t, n)
}

// Stored expiry is garbage collection: the grace after the last state of
// the policy stops mattering, measured from the request's now, whatever
// the clock, and one expiry for every key of the policy, so that its keys
// exist and vanish together (a slot in migration answers a script that
// finds some keys of a policy gone and others there with TRYAGAIN).
func TestExpiryFollowsTheStateEnd(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, standalone(t).primary.Addr())
	b := mustBackend(t, c, redisbackend.WithPrefix(newPrefix()), redisbackend.WithExpiryGrace(5*time.Second))
	p := mustPolicy(t, "ttl", "5/min, 100/h aligned, 60/min gcra burst=10")
	// An aligned hour starting 30 minutes from t0's hour.
	now := time.Date(2030, 1, 2, 3, 30, 0, 0, time.UTC)
	th := quiet(t, b, throttler.NewManualClock(now))
	_, err := th.AllowN(ctx, p, "user", 4)
	require.NoError(t, err)
	keys := b.Keys(testkit.Compile(t, p), "user")
	// The aligned hour ends last: 30 minutes from now, plus the grace.
	want := 30*time.Minute + 5*time.Second
	checkExpiry := func(label string) {
		t.Helper()
		var first time.Time
		for i, key := range keys {
			ttl, err := c.PTTL(ctx, key).Result()
			require.NoError(t, err)
			assert.LessOrEqual(t, ttl, want, "%s: %s", label, key)
			assert.Greater(t, ttl, want-2*time.Second, "%s: %s", label, key)
			// PEXPIRETIME is absolute, so keys read one after another
			// compare exactly.
			at, err := c.PExpireTime(ctx, key).Result()
			require.NoError(t, err)
			if i == 0 {
				first = time.UnixMilli(at.Milliseconds())
			} else {
				// Set by PEXPIRE within one script run, whose clock may
				// tick by a millisecond between two keys.
				assert.WithinDuration(t, first, time.UnixMilli(at.Milliseconds()), 5*time.Millisecond, "%s: every key of the policy expires at one moment", label)
			}
		}
	}
	checkExpiry("after a decision")
	_, err = th.Refund(ctx, p, "user", 1)
	require.NoError(t, err)
	checkExpiry("after a refund")
}

func TestPing(t *testing.T) {
	ctx := context.Background()
	s := standalone(t)
	require.NoError(t, mustBackend(t, newClient(t, s.primary.Addr()), redisbackend.WithReadClient(newClient(t, s.replica.Addr()))).Ping(ctx))
	require.NoError(t, mustBackend(t, newClusterClient(t, cluster(t), false)).Ping(ctx))
	require.NoError(t, mustBackend(t, newAutoPipeliner(t, newClient(t, s.primary.Addr()))).Ping(ctx))

	// A read client that cannot be reached fails the ping.
	down := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer down.Close()
	err := mustBackend(t, newClient(t, s.primary.Addr()), redisbackend.WithReadClient(down)).Ping(ctx)
	assert.Error(t, err)
}

// One decision is one round trip, whatever the policy holds: one EVALSHA
// (after the first call has cached the script).
func TestOneRoundTripPerDecision(t *testing.T) {
	ctx := context.Background()
	server := ownRedis(t)
	c := newClient(t, server.Addr())
	b := mustBackend(t, c)
	th := quiet(t, b, throttler.NewManualClock(t0))
	p := mustPolicy(t, "trip", "10/s, 100/min aligned, 1000/h, 20/s gcra burst=5")
	_, err := th.Allow(ctx, p, "warm-up")
	require.NoError(t, err)
	require.NoError(t, c.ConfigResetStat(ctx).Err())
	for i := range 10 {
		r, err := th.AllowN(ctx, p, fmt.Sprint("user:", i%3), 2)
		require.NoError(t, err)
		require.False(t, r.Degraded, "%v", r.Err)
	}
	info, err := c.InfoMap(ctx, "commandstats").Result()
	require.NoError(t, err)
	calls := make(map[string]int64)
	for name, stats := range info["Commandstats"] {
		var n int64
		_, err := fmt.Sscanf(stats, "calls=%d", &n)
		require.NoError(t, err)
		calls[name] = n
	}
	delete(calls, "cmdstat_config|resetstat") // the reset itself
	// The scripts' own GET and SET calls are counted too: one GET per limit
	// per decision, one SET per limit per allowed decision. The client sent
	// nothing but EVALSHA.
	assert.EqualValues(t, 10*len(p.Limits()), calls["cmdstat_get"])
	delete(calls, "cmdstat_get")
	delete(calls, "cmdstat_set")
	assert.Equal(t, map[string]int64{"cmdstat_evalsha": 10}, calls)
}
