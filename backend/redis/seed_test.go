package redisbackend_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// seed.lua mirrors driver.Seed (driver.Merge, then driver.Decide) line for
// line. This runs random sequences of seeds, decisions, refunds and resets
// through the backend on a real Redis and through the Go functions on the
// same inputs, and requires the same verdicts, the same states after, the
// same prior states and the same stored states, step by step. The given
// states are drawn around what the store holds and around now: nothing,
// the held state with its counts nudged (the same End), windows closed,
// closing at now, open, previous, current and next aligned windows, TATs
// before, at and after now, and a few ends near 2^53; with every cost from
// 0 to beyond capacity, for random policies of every algorithm and a clock
// that jumps both ways. Over a thousand of the fixed and aligned given
// windows are open beside another open window the store holds, where the
// store keeps its End and the larger count; the test requires more than
// 50 of each.
func TestSeedScriptMirrorsGo(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, standalone(t).primary.Addr())
	b := mustBackend(t, c, redisbackend.WithPrefix(newPrefix()))
	rng := rand.New(rand.NewPCG(20261125, 20))
	const sequences, steps = 400, 40
	deadline := time.Now().Add(60 * time.Second)
	// took[alg] and ignored[alg] count given states that changed what the
	// store held for a limit of that algorithm, and those that did not.
	var took, ignored [4]int
	// otherEnd[alg] counts, for the fixed and aligned windows, given
	// windows open at now beside another open window the store held:
	// the case in which the store keeps its End and the larger count.
	var otherEnd [2]int
	allowed, denied := 0, 0
	for seq := 0; seq < sequences && time.Now().Before(deadline); seq++ {
		p := randomPolicy(t, rng, seq)
		dp := testkit.Compile(t, p)
		id := fmt.Sprint("seed:", seq)
		model := make([]driver.State, len(dp.Limits))
		now := randomStart(rng)
		var trail []string // what happened so far, for the failure message
		for step := range steps {
			req := driver.Request{Policy: dp, Identifier: id, Now: now}
			switch op := rng.IntN(20); {
			case op < 12:
				req.Cost = randomCost(rng, dp)
				if rng.IntN(3) == 0 {
					req.Cost = 0
				}
				given := make([]driver.State, len(dp.Limits))
				for i := range given {
					given[i] = randomGiven(rng, &dp.Limits[i], model[i], now)
				}
				trail = append(trail, fmt.Sprintf("seed %v cost %d at %d µs", given, req.Cost, now.UnixMicro()))
				msg := fmt.Sprintf("%s\n%s", p, strings.Join(trail, "\n"))
				for i := range given {
					one := append([]driver.State(nil), model...)
					alone := make([]driver.State, len(given))
					copy(alone, one)
					alone[i] = given[i]
					if driver.Merge(dp, now, one, alone) {
						took[dp.Limits[i].Algorithm]++
					} else {
						ignored[dp.Limits[i].Algorithm]++
					}
					l := &dp.Limits[i]
					h, g := driver.InForce(l, model[i], now), driver.InForce(l, given[i], now)
					if alg := l.Algorithm; alg <= driver.AlignedWindow && h != (driver.State{}) && g != (driver.State{}) && h.End != g.End {
						otherEnd[alg]++
					}
				}
				out, err := b.Seed(ctx, req, append([]driver.State(nil), given...))
				require.NoError(t, err, msg)
				prior := append([]driver.State(nil), model...)
				next := append([]driver.State(nil), model...)
				ok := driver.Seed(dp, now, req.Cost, next, given)
				require.Equal(t, ok, out.Allowed, msg)
				require.Equal(t, next, out.States, msg)
				require.Equal(t, prior, out.Prior, msg)
				if req.Cost > 0 && ok {
					allowed++
				} else if req.Cost > 0 {
					denied++
				}
				model = next
			case op < 16:
				req.Cost = randomCost(rng, dp)
				trail = append(trail, fmt.Sprintf("decide %d at %d µs", req.Cost, now.UnixMicro()))
				out, err := b.Decide(ctx, req)
				require.NoError(t, err, "%s\n%s", p, strings.Join(trail, "\n"))
				next := append([]driver.State(nil), model...)
				require.Equal(t, driver.Decide(dp, now, req.Cost, next), out.Allowed, "%s\n%s", p, strings.Join(trail, "\n"))
				require.Equal(t, next, out.States, "%s\n%s", p, strings.Join(trail, "\n"))
				model = next
			case op < 19:
				req.Cost = randomRefund(rng)
				trail = append(trail, fmt.Sprintf("refund %d at %d µs", req.Cost, now.UnixMicro()))
				out, err := b.Refund(ctx, req)
				require.NoError(t, err, "%s\n%s", p, strings.Join(trail, "\n"))
				driver.Refund(dp, now, req.Cost, model)
				require.Equal(t, model, out.States, "%s\n%s", p, strings.Join(trail, "\n"))
			default: // the store loses everything, as after expiry
				trail = append(trail, "reset")
				require.NoError(t, b.Reset(ctx, dp, id))
				clear(model)
			}
			if step%4 == 3 {
				require.Equal(t, model, storedStates(t, c, b, dp, id), "%s\n%s", p, strings.Join(trail, "\n"))
			}
			now = nextNow(rng, dp, now)
		}
		require.Equal(t, model, storedStates(t, c, b, dp, id), "%s\n%s", p, strings.Join(trail, "\n"))
	}
	t.Logf("given states taken %v, ignored %v (fixed, aligned, GCRA, sliding); open beside another open window %v (fixed, aligned); seeds with a cost: %d allowed, %d denied",
		took, ignored, otherEnd, allowed, denied)
	for alg, n := range otherEnd {
		require.Greater(t, n, 50, "algorithm %d: too few given windows beside another open one", alg)
	}
	for alg := range took {
		require.Positive(t, took[alg], "algorithm %d: no given state was taken", alg)
		require.Positive(t, ignored[alg], "algorithm %d: no given state was ignored", alg)
	}
	require.Positive(t, allowed)
	require.Positive(t, denied)
}

// randomGiven draws a state for limit l as another store might hand it
// over at now, around held (what this store holds) and now; never a
// negative field, as driver.CheckGiven requires.
func randomGiven(rng *rand.Rand, l *driver.Limit, held driver.State, now time.Time) driver.State {
	nowMs, nowUs, w := now.UnixMilli(), now.UnixMicro(), l.WindowMillis
	count := func() int64 {
		if rng.IntN(3) == 0 {
			return rng.Int64N(4)
		}
		return rng.Int64N(2*l.Max + 3)
	}
	var s driver.State
	switch rng.IntN(12) {
	case 0: // nothing
	case 1, 2, 3: // what the store holds, counts nudged: the same End
		s = held
		s.Used += rng.Int64N(5) - 2
		s.Prev += rng.Int64N(5) - 2
	case 4: // a window closing, or a TAT reached, exactly at now
		s = driver.State{Used: count(), End: nowMs}
		if l.Algorithm == driver.GCRA {
			s = driver.State{End: nowUs}
		}
	case 5: // far ahead: near 2^53, or 2^52 before 1970, where an End
		// - now beyond 2^53 would leave refund.lua's exact range (a real
		// TAT lies at most 10 × MaxWindow after its now)
		far := int64(1<<53 - 1)
		if nowUs < 0 {
			far = 1 << 52
		}
		s = driver.State{Used: count(), End: far - rng.Int64N(1000)}
		if l.Algorithm == driver.SlidingWindow {
			s.Prev = count()
		}
	default:
		switch l.Algorithm {
		case driver.GCRA:
			span := l.Capacity * l.EmissionMicros
			s.End = nowUs + rng.Int64N(2*span+1) - span
			if rng.IntN(4) == 0 {
				s.Used = count() // ignored: GCRA keeps no count
			}
		case driver.FixedWindow:
			s = driver.State{Used: count(), End: nowMs + rng.Int64N(2*w+1) - w}
		default: // aligned and sliding: two windows back to the next one
			end := (floorDivMs(nowMs, w)+1)*w + (rng.Int64N(4)-2)*w
			s = driver.State{Used: count(), End: end}
			if l.Algorithm == driver.SlidingWindow {
				s.Prev = count()
			}
		}
	}
	s.Used, s.End, s.Prev = max(s.Used, 0), max(s.End, 0), max(s.Prev, 0)
	return s
}

// floorDivMs is a / b rounded towards minus infinity, for b > 0.
func floorDivMs(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}

// Seed checks its input before any round trip: a backend whose client
// cannot reach any server answers each bad input with the error that
// names it, never a connection error.
func TestSeedChecksBeforeAnyRoundTrip(t *testing.T) {
	ctx := context.Background()
	down := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer down.Close()
	b := mustBackend(t, down)
	dp := testkit.Compile(t, mustPolicy(t, "seed-check", "10/min, 100/h sliding"))
	fine := []driver.State{{Used: 1, End: t0.UnixMilli() + 1000}, {Used: 1, End: t0.UnixMilli() + 1000}}
	req := driver.Request{Policy: dp, Identifier: "x", Cost: 1, Now: t0}
	for _, tc := range []struct {
		name  string
		req   driver.Request
		given []driver.State
		want  error
	}{
		{"no states", req, nil, driver.ErrInvalidState},
		{"too few", req, fine[:1], driver.ErrInvalidState},
		{"too many", req, append(append([]driver.State(nil), fine...), fine[0]), driver.ErrInvalidState},
		{"negative Used", req, []driver.State{{Used: -1, End: 5}, fine[1]}, driver.ErrInvalidState},
		{"negative End", req, []driver.State{fine[0], {Used: 1, End: -5}}, driver.ErrInvalidState},
		{"negative Prev", req, []driver.State{fine[0], {Used: 1, End: 5, Prev: -1}}, driver.ErrInvalidState},
		{"End above 2^53 - 1", req, []driver.State{{Used: 1, End: 1 << 53}, fine[1]}, driver.ErrInvalidState},
		{"Used above 2^53 - 1", req, []driver.State{fine[0], {Used: 1 << 60, End: 5}}, driver.ErrInvalidState},
		{"nil policy", driver.Request{Identifier: "x", Now: t0}, fine, driver.ErrInvalidPolicy},
		{"empty identifier", driver.Request{Policy: dp, Now: t0}, fine, driver.ErrInvalidOption},
		{"negative cost", driver.Request{Policy: dp, Identifier: "x", Cost: -1, Now: t0}, fine, driver.ErrInvalidOption},
		{"now beyond exact microseconds", driver.Request{Policy: dp, Identifier: "x", Now: time.UnixMicro(1 << 53)}, fine, driver.ErrInvalidOption},
	} {
		_, err := b.Seed(ctx, tc.req, tc.given)
		assert.ErrorIs(t, err, tc.want, tc.name)
	}
	_, err := (&redisbackend.Backend{}).Seed(ctx, req, fine)
	assert.ErrorIs(t, err, driver.ErrNotInitialized)
	var nilBackend *redisbackend.Backend
	_, err = nilBackend.Seed(ctx, req, fine)
	assert.ErrorIs(t, err, driver.ErrNotInitialized)
}

// A key holding a value seed.lua did not write is ErrForeignValue, and the
// script stops before any write: the other limit's key stays absent.
func TestSeedForeignValue(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, standalone(t).primary.Addr())
	b := mustBackend(t, c, redisbackend.WithPrefix(newPrefix()))
	dp := testkit.Compile(t, mustPolicy(t, "seed-foreign", "5/min, 50/h"))
	given := []driver.State{{Used: 2, End: t0.UnixMilli() + 30_000}, {Used: 3, End: t0.UnixMilli() + 600_000}}
	for _, tc := range []struct {
		name  string
		write func(key string) error
	}{
		{"string", func(k string) error { return c.Set(ctx, k, "3", time.Minute).Err() }},
		{"field not a number", func(k string) error { return c.HSet(ctx, k, "u:fixed:3600000", "3x").Err() }},
		{"field beyond 2^53", func(k string) error { return c.HSet(ctx, k, "e:fixed:3600000", "99999999999999999999").Err() }},
	} {
		id := "id-" + tc.name
		key := b.Key(dp, id)
		require.NoError(t, tc.write(key))
		for _, cost := range []int64{0, 1} {
			_, err := b.Seed(ctx, driver.Request{Policy: dp, Identifier: id, Cost: cost, Now: t0}, given)
			assert.ErrorIs(t, err, redisbackend.ErrForeignValue, tc.name)
			assert.ErrorIs(t, err, driver.ErrBadReply, tc.name)
		}
		if typ, err := c.Type(ctx, key).Result(); assert.NoError(t, err) && typ == "hash" {
			n, err := c.HLen(ctx, key).Result()
			require.NoError(t, err)
			assert.EqualValues(t, 1, n, "%s: the first limit's fields were written", tc.name)
		}
	}
}

// A seed sets the key's expiry as decide.lua does: when the states after
// the step need the key longer than it was set to, a grace past the latest
// end of the states it wrote, plus a grace of slack, counted from the
// request's now. A limit whose given state counts nothing and that held
// nothing stays absent, and a seed that changes nothing writes nothing.
func TestSeedExpiry(t *testing.T) {
	ctx := context.Background()
	c := newClient(t, standalone(t).primary.Addr())
	const grace = 5 * time.Second
	b := mustBackend(t, c, redisbackend.WithPrefix(newPrefix()), redisbackend.WithExpiryGrace(grace))
	p := testkit.Compile(t, mustPolicy(t, "seed-ttl", "5/min, 100/h aligned, 60/min gcra burst=10, 10/min sliding"))
	// An aligned hour that started 30 minutes ago.
	now := time.Date(2030, 1, 2, 3, 30, 0, 0, time.UTC)
	nowMs := now.UnixMilli()
	key := b.Key(p, "user")
	checkExpiry := func(label string, fields int64, want time.Duration) {
		t.Helper()
		n, err := c.HLen(ctx, key).Result()
		require.NoError(t, err)
		assert.Equal(t, fields, n, "%s: fields stored", label)
		ttl, err := c.PTTL(ctx, key).Result()
		require.NoError(t, err)
		assert.LessOrEqual(t, ttl, want, label)
		assert.Greater(t, ttl, want-2*time.Second, label)
	}
	// Only the fixed window counts: 40 s left, plus the grace and the
	// slack. Its two fields and x are stored.
	given := []driver.State{{Used: 2, End: nowMs + 40_000}, {}, {End: now.UnixMicro()}, {}}
	out, err := b.Seed(ctx, driver.Request{Policy: p, Identifier: "user", Now: now}, given)
	require.NoError(t, err)
	require.True(t, out.Allowed)
	require.Equal(t, make([]driver.State, 4), out.Prior)
	checkExpiry("one limit seeded", 3, 40*time.Second+2*grace)

	// A seed of cost 1 writes every limit, with the aligned hour's end (30
	// minutes away) as the latest.
	out, err = b.Seed(ctx, driver.Request{Policy: p, Identifier: "user", Cost: 1, Now: now}, make([]driver.State, 4))
	require.NoError(t, err)
	require.True(t, out.Allowed)
	require.Equal(t, int64(3), out.States[0].Used)
	// Fixed and aligned: e and u; GCRA: e; sliding: e and u, its p still 0
	// and so not written; and x.
	checkExpiry("after a seed of cost 1", 2+2+1+2+1, 30*time.Minute+2*grace)

	// A seed that changes one state needs no longer expiry: it stays.
	given = []driver.State{{Used: 4, End: nowMs + 40_000}, {}, {}, {}}
	out, err = b.Seed(ctx, driver.Request{Policy: p, Identifier: "user", Now: now.Add(time.Second)}, given)
	require.NoError(t, err)
	require.Equal(t, int64(4), out.States[0].Used)
	checkExpiry("after a seed that changed one state", 8, 30*time.Minute+2*grace)

	// A seed that changes nothing writes nothing.
	require.NoError(t, c.PExpire(ctx, key, time.Hour).Err())
	before, err := c.PExpireTime(ctx, key).Result()
	require.NoError(t, err)
	out, err = b.Seed(ctx, driver.Request{Policy: p, Identifier: "user", Now: now.Add(time.Second)}, given)
	require.NoError(t, err)
	require.Equal(t, out.Prior, out.States)
	after, err := c.PExpireTime(ctx, key).Result()
	require.NoError(t, err)
	assert.Equal(t, before, after, "a seed that changed nothing wrote the key")
}

// One seed is one round trip: one EVALSHA, and after SCRIPT FLUSH the same
// call falls back to EVAL and succeeds.
func TestSeedIsOneScriptCall(t *testing.T) {
	ctx := context.Background()
	server := ownRedis(t)
	c := newClient(t, server.Addr())
	b := mustBackend(t, c)
	p := testkit.Compile(t, mustPolicy(t, "seed-trip", "10/s, 100/min aligned, 20/s gcra burst=5, 50/min sliding"))
	given := []driver.State{{Used: 1, End: t0.UnixMilli() + 500}, {}, {End: t0.UnixMicro() + 100_000}, {Used: 3, End: t0.UnixMilli() + 30_000}}
	_, err := b.Seed(ctx, driver.Request{Policy: p, Identifier: "warm-up", Now: t0}, given)
	require.NoError(t, err)
	before := commandCalls(t, server.Addr(), "evalsha")
	for i := range 10 {
		_, err := b.Seed(ctx, driver.Request{Policy: p, Identifier: fmt.Sprint("user:", i%3), Cost: int64(i % 2), Now: t0}, given)
		require.NoError(t, err)
	}
	assert.Equal(t, before+10, commandCalls(t, server.Addr(), "evalsha"))

	require.NoError(t, c.ScriptFlush(ctx).Err())
	evals := commandCalls(t, server.Addr(), "eval")
	out, err := b.Seed(ctx, driver.Request{Policy: p, Identifier: "after-flush", Cost: 1, Now: t0}, given)
	require.NoError(t, err)
	assert.True(t, out.Allowed)
	assert.Equal(t, int64(2), out.States[0].Used)
	assert.Equal(t, evals+1, commandCalls(t, server.Addr(), "eval"))
}

// Seed works through every kind of client, Cluster and batching included:
// the identifier's keys share a slot, and a seed is one script call.
func TestSeedEveryClient(t *testing.T) {
	ctx := context.Background()
	p := testkit.Compile(t, mustPolicy(t, "seed-clients", "5/min, 100/h aligned, 60/min gcra, 10/min sliding"))
	nowMs := t0.UnixMilli()
	alignedEnd := (nowMs/3_600_000 + 1) * 3_600_000
	slidingEnd := (nowMs/60_000 + 1) * 60_000
	given := []driver.State{{Used: 4, End: nowMs + 40_000}, {Used: 70, End: alignedEnd}, {End: t0.UnixMicro() + 30_000_000}, {Used: 2, End: slidingEnd, Prev: 6}}
	kinds := append(clientKinds(), clientKind{"standalone with batching", func(t *testing.T) (redisbackend.Client, redisbackend.Client, func(*testing.T)) {
		c := newClient(t, standalone(t).primary.Addr())
		return c, c, nil
	}})
	for i, kind := range kinds {
		t.Run(kind.name, func(t *testing.T) {
			c, _, _ := kind.client(t)
			opts := []redisbackend.Option{redisbackend.WithPrefix(newPrefix())}
			if i == len(kinds)-1 {
				opts = append(opts, redisbackend.WithBatching(0))
			}
			b := mustBackend(t, c, opts...)
			for _, id := range []string{"a", "user:42", "{b}"} {
				out, err := b.Seed(ctx, driver.Request{Policy: p, Identifier: id, Cost: 1, Now: t0}, given)
				require.NoError(t, err, id)
				want := make([]driver.State, 4)
				require.Equal(t, driver.Seed(p, t0, 1, want, given), out.Allowed, id)
				require.Equal(t, want, out.States, id)
				require.Equal(t, make([]driver.State, 4), out.Prior, id)

				// The next decision goes on from the seeded windows.
				d, err := b.Decide(ctx, driver.Request{Policy: p, Identifier: id, Cost: 1, Now: t0})
				require.NoError(t, err, id)
				require.False(t, d.Allowed, id) // the fixed window: 4 given + 1 seeded = 5 of 5
				require.Equal(t, want, d.States, id)
			}
		})
	}
}

// Replies a proxy or an incompatible server could send to a seed are
// errors.
func TestOddSeedRepliesAreErrors(t *testing.T) {
	fixed := testkit.Compiled(t, "odd", "10/s") // a reply holds its Used and End
	for _, tc := range []struct {
		name  string
		reply any
	}{
		{"not an array", "OK"},
		{"a decision's reply", []any{int64(1), int64(1), int64(2)}},
		{"too long", []any{int64(1), int64(1), int64(2), int64(0), int64(0), int64(0)}},
		{"a string in the prior states", []any{int64(1), int64(1), int64(2), "x", int64(0)}},
		{"a bad verdict", []any{int64(2), int64(1), int64(2), int64(0), int64(0)}},
	} {
		_, err := redisbackend.ParseSeedReply(tc.reply, fixed)
		assert.ErrorIs(t, err, redisbackend.ErrUnexpectedReply, tc.name)
	}
	out, err := redisbackend.ParseSeedReply([]any{int64(1), int64(3), int64(1700000000000), int64(2), int64(1700000000000)}, fixed)
	require.NoError(t, err)
	assert.Equal(t, driver.Outcome{Allowed: true, States: []driver.State{{Used: 3, End: 1700000000000}},
		Prior: []driver.State{{Used: 2, End: 1700000000000}}}, out)
}
