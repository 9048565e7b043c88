package redisbackend_test

import (
	"context"
	"fmt"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// The Lua scripts mirror driver.Decide, driver.Refund and driver.Take line
// for line. This runs random sequences of decisions, takes, refunds and
// peeks through
// the scripts on a real Redis and through the Go functions on the same
// inputs, and requires the same verdicts, the same returned states and the
// same stored states, step by step: random policies of every algorithm,
// quotas from 1 to MaxQuota, windows from 1 ms to 400 days, costs beyond
// capacity, huge refunds, and a clock that jumps forwards, backwards, by
// microseconds and to before 1970.
func TestScriptsMirrorGo(t *testing.T) {
	redisbackend.ResetShapes() // room for this test's shapes
	ctx := context.Background()
	c := newClient(t, standalone(t).primary.Addr())
	b := mustBackend(t, c, redisbackend.WithPrefix(newPrefix()))
	rng := rand.New(rand.NewPCG(20300102, 30405))
	const sequences, steps = 500, 40
	deadline := time.Now().Add(60 * time.Second)
	for seq := 0; seq < sequences && time.Now().Before(deadline); seq++ {
		p := randomPolicy(t, rng, seq)
		dp := testkit.Compile(t, p)
		id := fmt.Sprint("seq:", seq)
		model := make([]driver.State, len(dp.Limits))
		now := randomStart(rng)
		var trail []string // what happened so far, for the failure message
		for step := range steps {
			req := driver.Request{Policy: dp, Identifier: id, Now: now}
			switch op := rng.IntN(12); {
			case op >= 10:
				req.Cost = 1 + randomCost(rng, dp)*int64(1+rng.IntN(3))
				trail = append(trail, fmt.Sprintf("take %d at %d µs", req.Cost, now.UnixMicro()))
				out, err := b.Take(ctx, req)
				require.NoError(t, err, "%s\n%s", p, strings.Join(trail, "\n"))
				next := append([]driver.State(nil), model...)
				granted := driver.Take(dp, now, req.Cost, next)
				require.Equal(t, granted, out.Granted, "%s\n%s", p, strings.Join(trail, "\n"))
				require.Equal(t, granted > 0, out.Allowed, "%s\n%s", p, strings.Join(trail, "\n"))
				require.Equal(t, next, out.States, "%s\n%s", p, strings.Join(trail, "\n"))
				model = next
			case op < 6:
				req.Cost = randomCost(rng, dp)
				trail = append(trail, fmt.Sprintf("decide %d at %d µs", req.Cost, now.UnixMicro()))
				out, err := b.Decide(ctx, req)
				require.NoError(t, err, "%s\n%s", p, strings.Join(trail, "\n"))
				next := append([]driver.State(nil), model...)
				allowed := driver.Decide(dp, now, req.Cost, next)
				require.Equal(t, allowed, out.Allowed, "%s\n%s", p, strings.Join(trail, "\n"))
				require.Equal(t, next, out.States, "%s\n%s", p, strings.Join(trail, "\n"))
				model = next
			case op < 8:
				req.Cost = randomRefund(rng)
				trail = append(trail, fmt.Sprintf("refund %d at %d µs", req.Cost, now.UnixMicro()))
				out, err := b.Refund(ctx, req)
				require.NoError(t, err, "%s\n%s", p, strings.Join(trail, "\n"))
				next := append([]driver.State(nil), model...)
				driver.Refund(dp, now, req.Cost, next)
				require.True(t, out.Allowed)
				require.Equal(t, next, out.States, "%s\n%s", p, strings.Join(trail, "\n"))
				model = next
			default:
				req.Cost = randomCost(rng, dp)
				trail = append(trail, fmt.Sprintf("peek %d at %d µs", req.Cost, now.UnixMicro()))
				out, err := b.Peek(ctx, req)
				require.NoError(t, err, "%s\n%s", p, strings.Join(trail, "\n"))
				allowed := driver.Decide(dp, now, req.Cost, append([]driver.State(nil), model...))
				require.Equal(t, allowed, out.Allowed, "%s\n%s", p, strings.Join(trail, "\n"))
				require.Equal(t, model, out.States, "%s\n%s", p, strings.Join(trail, "\n"))
			}
			if step%8 == 7 {
				require.Equal(t, model, storedStates(t, c, b, dp, id), "%s\n%s", p, strings.Join(trail, "\n"))
			}
			now = nextNow(rng, dp, now)
		}
		require.Equal(t, model, storedStates(t, c, b, dp, id), "%s\n%s", p, strings.Join(trail, "\n"))
	}
}

// storedStates reads identifier's hash under p as the scripts store it
// (layout 3, see the package documentation): for a limit of key K, eK, uK
// and, for a sliding window, pK; an absent field reads 0.
func storedStates(t *testing.T, c goredis.Cmdable, b *redisbackend.Backend, p *driver.Policy, identifier string) []driver.State {
	t.Helper()
	key := b.Key(p, identifier)
	states := make([]driver.State, len(p.Limits))
	var fields []string
	var into []*int64
	for i := range p.Limits {
		k, s := p.Limits[i].Key, &states[i]
		fields, into = append(fields, "e"+k), append(into, &s.End)
		if p.Limits[i].Algorithm != driver.GCRA {
			fields, into = append(fields, "u"+k), append(into, &s.Used)
		}
		if p.Limits[i].Algorithm == driver.SlidingWindow {
			fields, into = append(fields, "p"+k), append(into, &s.Prev)
		}
	}
	values, err := c.HMGet(context.Background(), key, fields...).Result()
	require.NoError(t, err, key)
	for j, v := range values {
		if v == nil {
			continue
		}
		n, err := strconv.ParseInt(v.(string), 10, 64)
		require.NoError(t, err, "%s %s = %q", key, fields[j], v)
		*into[j] = n
	}
	return states
}

func randomPolicy(t *testing.T, rng *rand.Rand, seq int) *throttler.Policy {
	maxes := []int64{1, 2, 3, 5, 10, 100, 1000, 1_000_000, driver.MaxQuota}
	windows := []time.Duration{time.Millisecond, 7 * time.Millisecond, time.Second, 1500 * time.Millisecond,
		time.Minute, time.Hour, 24 * time.Hour, driver.MaxWindow}
	for {
		n := 1 + rng.IntN(3)
		limits := make([]throttler.Limit, n)
		for i := range limits {
			l := throttler.Limit{
				Name:      fmt.Sprint("l", i),
				Max:       maxes[rng.IntN(len(maxes))],
				Window:    windows[rng.IntN(len(windows))],
				Algorithm: throttler.Algorithm(rng.IntN(4)),
			}
			if rng.IntN(4) == 0 {
				l.Max = 1 + rng.Int64N(50)
			}
			if rng.IntN(4) == 0 {
				l.Window = time.Duration(1+rng.Int64N(int64(driver.MaxWindow/time.Millisecond))) * time.Millisecond
			}
			if l.Algorithm == throttler.GCRA && rng.IntN(2) == 0 {
				l.Burst = 1 + rng.Int64N(2*l.Max)
			}
			limits[i] = l
		}
		p, err := throttler.NewPolicy(fmt.Sprint("diff", seq), limits)
		if err == nil {
			return p
		}
		// Some GCRA bursts exceed the span bound, some sliding windows the
		// product bound: draw again.
		require.ErrorIs(t, err, throttler.ErrInvalidLimit)
	}
}

func randomStart(rng *rand.Rand) time.Time {
	switch rng.IntN(10) {
	case 0: // before the epoch: floor division on negative times
		return time.UnixMicro(-rng.Int64N(1e15))
	case 1:
		return time.UnixMicro(rng.Int64N(1e6))
	default:
		return time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC).Add(time.Duration(rng.Int64N(int64(365 * 24 * time.Hour))))
	}
}

func randomCost(rng *rand.Rand, p *driver.Policy) int64 {
	switch rng.IntN(10) {
	case 0:
		return 0
	case 1: // around the smallest capacity, beyond it included
		c := p.Limits[0].Max
		return c + rng.Int64N(3) - 1
	case 2:
		return rng.Int64N(10)
	default:
		return 1
	}
}

func randomRefund(rng *rand.Rand) int64 {
	switch rng.IntN(6) {
	case 0:
		return 0
	case 1:
		return 1 << 50
	default:
		return 1 + rng.Int64N(3)
	}
}

func nextNow(rng *rand.Rand, p *driver.Policy, now time.Time) time.Time {
	w := p.Limits[rng.IntN(len(p.Limits))].Window
	switch rng.IntN(10) {
	case 0: // backwards
		return now.Add(-time.Duration(rng.Int64N(int64(w))))
	case 1: // past the window
		return now.Add(w + time.Duration(rng.Int64N(int64(w))))
	case 2, 3: // microseconds
		return now.Add(time.Duration(rng.Int64N(5000)) * time.Microsecond)
	case 4: // not at all
		return now
	default:
		return now.Add(time.Duration(rng.Int64N(int64(w)/3 + 1)))
	}
}

// decide_many.lua decides a batch exactly as decide.lua decides its
// requests one after the other, and so do the scripts written for each
// policy shape (decide_shape.lua.tmpl) that the backend sends by default.
// Random batches (up to 24 requests, several for one identifier, up to
// three policies of every algorithm, clocks that differ from request to
// request, a key holding a foreign value in some rounds) go through a
// batch script under one prefix, and one by one through a lone script
// under another; every outcome, every error and every stored state must
// match. Each side runs once generic and once shaped:
//
//	generic-batch  decide_many.lua against the shapes' lone scripts
//	shaped-batch   the shapes' batch scripts against decide.lua
func TestDecideManyMirrorsDecide(t *testing.T) {
	redisbackend.ResetShapes() // room for this test's shapes
	t.Run("generic-batch", func(t *testing.T) {
		testDecideManyMirrorsDecide(t, (*redisbackend.Backend).DecideMany, (*redisbackend.Backend).Decide)
	})
	t.Run("shaped-batch", func(t *testing.T) {
		testDecideManyMirrorsDecide(t, (*redisbackend.Backend).DecideManyShaped, (*redisbackend.Backend).DecideGeneric)
	})
}

func testDecideManyMirrorsDecide(t *testing.T,
	decideMany func(*redisbackend.Backend, context.Context, []driver.Request) ([]driver.Outcome, []error, error),
	decide func(*redisbackend.Backend, context.Context, driver.Request) (driver.Outcome, error),
) {
	ctx := context.Background()
	c := newClient(t, standalone(t).primary.Addr())
	many := mustBackend(t, c, redisbackend.WithPrefix(newPrefix()))
	one := mustBackend(t, c, redisbackend.WithPrefix(newPrefix()))
	rng := rand.New(rand.NewPCG(20261124, 7))
	const rounds, steps = 150, 6
	deadline := time.Now().Add(60 * time.Second)
	batches, foreignSeen := 0, 0
	for round := 0; round < rounds && time.Now().Before(deadline); round++ {
		policies := make([]*driver.Policy, 1+rng.IntN(3))
		for i := range policies {
			policies[i] = testkit.Compile(t, randomPolicy(t, rng, 3*round+i))
		}
		ids := []string{fmt.Sprint("round:", round, ":a"), fmt.Sprint("round:", round, ":b"), fmt.Sprint("round:", round, ":c")}
		foreign := ""
		if round%5 == 0 {
			foreign = ids[2]
			for _, b := range []*redisbackend.Backend{many, one} {
				require.NoError(t, c.Set(ctx, b.Key(policies[0], foreign), "junk", time.Minute).Err())
			}
		}
		now := randomStart(rng)
		for range steps {
			reqs := make([]driver.Request, 1+rng.IntN(24))
			for i := range reqs {
				p := policies[rng.IntN(len(policies))]
				reqs[i] = driver.Request{Policy: p, Identifier: ids[rng.IntN(len(ids))], Cost: randomCost(rng, p), Now: now}
				if rng.IntN(4) == 0 {
					now = nextNow(rng, p, now)
				}
			}
			outs, errs, err := decideMany(many, ctx, reqs)
			require.NoError(t, err)
			require.Len(t, outs, len(reqs))
			batches++
			for i, req := range reqs {
				want, wantErr := decide(one, ctx, req)
				if wantErr != nil {
					require.ErrorIs(t, wantErr, redisbackend.ErrForeignValue)
					require.ErrorIs(t, errs[i], redisbackend.ErrForeignValue, "request %d of %d", i, len(reqs))
					foreignSeen++
					continue
				}
				require.NoError(t, errs[i], "request %d of %d", i, len(reqs))
				require.Equal(t, want, outs[i], "request %d of %d: %s for %s", i, len(reqs), req.Policy.Name, req.Identifier)
			}
			now = nextNow(rng, policies[0], now)
		}
		for pi, p := range policies {
			for _, id := range ids {
				if id == foreign && pi == 0 {
					continue
				}
				require.Equal(t, storedStates(t, c, one, p, id), storedStates(t, c, many, p, id), "%s for %s", p.Name, id)
			}
		}
	}
	t.Logf("%d batches compared, %d decisions refused for a foreign value", batches, foreignSeen)
	require.Positive(t, foreignSeen, "no batch met the foreign value")
}
