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
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
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
	assert.Equal(t, "app:v3:{user%3A42%7B%7D}:api%20v2", b.Key(testkit.Compile(t, p), "user:42{}"))
	assert.Equal(t, "throttlekit:v3:{a}:p", mustBackend(t, c).Key(testkit.Compiled(t, "p", "1/s"), "a"))
	// Layouts 1 and 2 kept one string per limit under the limit's key.
	assert.Equal(t, []string{
		"app:{user%3A42%7B%7D}:api%20v2::fixed:1000",
		"app:{user%3A42%7B%7D}:api%20v2:hourly:fixed:3600000",
		"app:{user%3A42%7B%7D}:api%20v2:smooth:gcra:60000:20",
	}, b.Layout2Keys(testkit.Compile(t, p), "user:42{}"))
}

// Layout 3 keeps every limit of a policy in one hash, a field per limit
// and per number, integers only, and the expiry it last set. An unnamed
// limit's fields hold neither its Max nor a GCRA burst that follows Max,
// so raising Max keeps them; a burst set explicitly is part of them.
func TestStoredLayout(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, standalone(t).primary.Addr())
	b := mustBackend(t, c, redisbackend.WithPrefix(newPrefix()))
	th := quiet(t, b, throttlertest.NewManualClock(t0))
	p := mustPolicy(t, "p", "5/s, 9/min sliding, 100/h gcra, 3/s gcra burst=7")
	_, err := th.Allow(ctx, p, "a")
	require.NoError(t, err)
	fields, err := c.HKeys(ctx, b.Key(testkit.Compile(t, p), "a")).Result()
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{
		"e:fixed:1000", "u:fixed:1000",
		"e:sliding:60000", "u:sliding:60000", // p, still 0, is not written
		"e:gcra:3600000",
		"e:gcra:1000:7",
		"x",
	}, fields)
	raised := mustPolicy(t, "p", "50/s, 90/min sliding, 200/h gcra, 30/s gcra burst=7")
	assert.Equal(t, b.Key(testkit.Compile(t, p), "a"), b.Key(testkit.Compile(t, raised), "a"))
	r, err := th.Peek(ctx, raised, "a")
	require.NoError(t, err)
	// The windows keep their count; a GCRA bucket keeps its TAT, read with
	// the new emission interval.
	for i, l := range r.Limits()[:2] {
		assert.EqualValues(t, 1, l.Used, "limit %d: raising Max keeps the window", i)
	}
	assert.Equal(t, t0.Add(36*time.Second), r.Limits()[2].ResetAt, "the TAT is kept")
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
		assert.NotPanics(t, func() { b.Key(testkit.Compile(t, p), "x") }, name)

		// Through a throttler: an error, never a silent allow, and no panic.
		if b != nil {
			_, err = quiet(t, b, throttlertest.NewManualClock(t0)).Allow(ctx, p, "x")
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
	th := quiet(t, b, throttlertest.NewManualClock(t0))
	for _, id := range []string{"user:42", "{user:42}", "}{", "{}", "a{b}c", "{a}", "x}y{z}", "ip:203.0.113.9", "\x00\xff{"} {
		keys := append(b.Layout2Keys(testkit.Compile(t, p), id), b.Key(testkit.Compile(t, p), id),
			b.LeaseKey(mustConcurrency(t, "uploads", 5, time.Minute), id))
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
	cp := testkit.Compile(t, p)
	assert.NotEqual(t, b.Key(cp, "a_b")+b.Key(cp, "c"), b.Key(cp, "a")+b.Key(cp, "b_c"))
	assert.NotEqual(t, b.Key(cp, "a:b"), b.Key(cp, "a%3Ab"))
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
			clock := throttlertest.NewManualClock(t0)
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
	// The second limit's count: read after the first limit's fields.
	const field = "u:fixed:3600000"
	for _, tc := range []struct {
		name  string
		write func(key string) error
	}{
		{"list", func(k string) error { return c.RPush(ctx, k, "x").Err() }},
		{"string", func(k string) error { return c.Set(ctx, k, "1:2", time.Minute).Err() }},
		{"field not a number", func(k string) error { return c.HSet(ctx, k, field, "junk").Err() }},
		{"field with a fraction", func(k string) error { return c.HSet(ctx, k, field, "1.5").Err() }},
		{"field beyond 2^53", func(k string) error { return c.HSet(ctx, k, field, "99999999999999999999").Err() }},
		{"expiry not a number", func(k string) error { return c.HSet(ctx, k, "x", "soon").Err() }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "id-" + tc.name
			key := b.Key(testkit.Compile(t, p), id)
			require.NoError(t, tc.write(key))
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
				"take": func() (driver.Outcome, error) {
					return b.Take(ctx, driver.Request{Policy: testkit.Compile(t, p), Identifier: id, Cost: 1, Now: now})
				},
			} {
				_, err := call()
				assert.ErrorIs(t, err, redisbackend.ErrForeignValue, name)
			}
			// Nothing was written: a hash holds the one field put there.
			if typ, err := c.Type(ctx, key).Result(); assert.NoError(t, err) && typ == "hash" {
				n, err := c.HLen(ctx, key).Result()
				require.NoError(t, err)
				assert.EqualValues(t, 1, n)
			}

			r, err := quiet(t, b, throttlertest.NewManualClock(now)).Allow(ctx, p, id)
			require.NoError(t, err)
			assert.True(t, r.Degraded)
			assert.False(t, r.Allowed)
			assert.ErrorIs(t, r.Err, redisbackend.ErrForeignValue)
			assert.ErrorIs(t, r.Err, throttler.ErrBackend)

			// Reset clears it.
			require.NoError(t, b.Reset(ctx, testkit.Compile(t, p), id))
			r, err = quiet(t, b, throttlertest.NewManualClock(now)).Allow(ctx, p, id)
			require.NoError(t, err)
			assert.True(t, r.Allowed)
			assert.False(t, r.Degraded, "%v", r.Err)
		})
	}
}

// Replies a proxy or an incompatible server could send are errors. A reply
// holds, per limit, only the fields its algorithm keeps: Used, End and Prev
// for a sliding window, Used and End for a fixed one, End for GCRA.
func TestOddRepliesAreErrors(t *testing.T) {
	sliding := testkit.Compiled(t, "odd", "10/s sliding")
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
			_, err := redisbackend.ParseReply(tc.reply, sliding, false)
			assert.ErrorIs(t, err, redisbackend.ErrUnexpectedReply)
			assert.ErrorIs(t, err, driver.ErrBadReply)
		})
	}
	fixedAndGCRA := testkit.Compiled(t, "odd", "10/s, 10/s gcra")
	out, err := redisbackend.ParseReply([]any{int64(1), int64(3), int64(1700000000000), int64(1700000000000123)}, fixedAndGCRA, false)
	require.NoError(t, err)
	assert.Equal(t, driver.Outcome{Allowed: true, States: []driver.State{{Used: 3, End: 1700000000000}, {End: 1700000000000123}}}, out)
	_, err = redisbackend.ParseReply([]any{int64(1), int64(3), int64(1700000000000), int64(0), int64(0), int64(1700000000000123), int64(0)}, fixedAndGCRA, false)
	assert.ErrorIs(t, err, redisbackend.ErrUnexpectedReply, "three fields for every limit")
	_, err = redisbackend.ParseReply([]any{int64(-1), int64(0), int64(0), int64(0)}, sliding, true)
	assert.ErrorIs(t, err, redisbackend.ErrUnexpectedReply, "a negative grant")
	out, err = redisbackend.ParseReply([]any{int64(7), int64(9), int64(1700000000000), int64(4)}, sliding, true)
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
	assert.Empty(t, b.Key(nil, "x"))
	assert.Nil(t, b.Layout2Keys(nil, "x"))

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

func TestResetDeletesTheKey(t *testing.T) {
	ctx := context.Background()
	cc := newClusterClient(t, cluster(t), false)
	b := mustBackend(t, cc, redisbackend.WithPrefix(newPrefix()))
	p := mustPolicy(t, "reset", "5/s, 50/min, 10/min gcra")
	th := quiet(t, b, throttlertest.NewManualClock(t0))
	_, err := th.AllowN(ctx, p, "user", 3)
	require.NoError(t, err)
	key := b.Key(testkit.Compile(t, p), "user")
	n, err := cc.Exists(ctx, key).Result()
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.NoError(t, th.Reset(ctx, p, "user"))
	n, err = cc.Exists(ctx, key).Result()
	require.NoError(t, err)
	assert.Zero(t, n)
}

// Stored expiry is garbage collection: when a write needs the key to live
// longer than it was set to, the expiry moves to a grace past the moment
// the last state of the policy stops mattering, plus one more grace of
// slack, measured from the request's now, whatever the clock. The x field
// holds that moment by the writer's clock. A write that needs no more (a
// refund, a second decision in the same window) leaves the expiry alone,
// and nothing ever moves it back.
func TestExpiryFollowsTheStateEnd(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, standalone(t).primary.Addr())
	const grace = 5 * time.Second
	b := mustBackend(t, c, redisbackend.WithPrefix(newPrefix()), redisbackend.WithExpiryGrace(grace))
	p := mustPolicy(t, "ttl", "5/min, 100/h aligned, 60/min gcra burst=10")
	// An aligned hour starting 30 minutes from t0's hour.
	now := time.Date(2030, 1, 2, 3, 30, 0, 0, time.UTC)
	th := quiet(t, b, throttlertest.NewManualClock(now))
	_, err := th.AllowN(ctx, p, "user", 4)
	require.NoError(t, err)
	key := b.Key(testkit.Compile(t, p), "user")
	// The aligned hour ends last: 30 minutes from now, plus the grace and
	// the slack.
	want := 30*time.Minute + 2*grace
	x, err := c.HGet(ctx, key, "x").Int64()
	require.NoError(t, err)
	assert.Equal(t, now.Add(want).UnixMilli(), x)
	at, err := c.PExpireTime(ctx, key).Result()
	require.NoError(t, err)
	checkExpiry := func(label string) {
		t.Helper()
		ttl, err := c.PTTL(ctx, key).Result()
		require.NoError(t, err)
		assert.LessOrEqual(t, ttl, want, label)
		assert.Greater(t, ttl, want-2*time.Second, label)
		again, err := c.PExpireTime(ctx, key).Result()
		require.NoError(t, err)
		assert.Equal(t, at, again, "%s: the expiry did not move", label)
	}
	checkExpiry("after a decision")
	_, err = th.Refund(ctx, p, "user", 1)
	require.NoError(t, err)
	checkExpiry("after a refund")
	_, err = th.Allow(ctx, p, "user")
	require.NoError(t, err)
	checkExpiry("after a second decision in the same windows")
	// A policy that dropped the aligned hour needs the key for about a
	// minute only: the expiry stays where the hour set it.
	short := mustPolicy(t, "ttl", "5/min")
	_, err = th.Allow(ctx, short, "user")
	require.NoError(t, err)
	checkExpiry("after a decision under a shorter policy")
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
	th := quiet(t, b, throttlertest.NewManualClock(t0))
	p := mustPolicy(t, "trip", "10/s, 100/min aligned, 1000/h, 20/s gcra burst=5")
	_, err := th.Allow(ctx, p, "warm-up")
	require.NoError(t, err)
	require.NoError(t, c.ConfigResetStat(ctx).Err())
	allowed := 0
	for i := range 10 {
		r, err := th.AllowN(ctx, p, fmt.Sprint("user:", i%3), 2)
		require.NoError(t, err)
		require.False(t, r.Degraded, "%v", r.Err)
		if r.Allowed {
			allowed++
		}
	}
	require.NotZero(t, allowed)
	require.Less(t, allowed, 10)
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
	// The scripts' own calls are counted too: one HMGET per decision for
	// the four limits together, one HSET per allowed decision, and one
	// PEXPIRE per identifier, on its first write: the later ones need the
	// key no longer than that set it to. The client sent nothing but
	// EVALSHA.
	assert.EqualValues(t, 10, calls["cmdstat_hmget"])
	assert.EqualValues(t, allowed, calls["cmdstat_hset"])
	assert.EqualValues(t, 3, calls["cmdstat_pexpire"])
	delete(calls, "cmdstat_hmget")
	delete(calls, "cmdstat_hset")
	delete(calls, "cmdstat_pexpire")
	assert.Equal(t, map[string]int64{"cmdstat_evalsha": 10}, calls)
}
