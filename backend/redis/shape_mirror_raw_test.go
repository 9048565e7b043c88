package redisbackend_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// randomShapedPolicy is a random policy of the given algorithms, or of up
// to six random ones when algs is nil: every algorithm, named limits,
// bursts, maxima and windows from 1 to the bounds.
func randomShapedPolicy(t *testing.T, rng *rand.Rand, seq int, algs []driver.Algorithm) *driver.Policy {
	maxes := []int64{1, 2, 3, 5, 10, 100, 1000, 1_000_000, driver.MaxQuota}
	windows := []time.Duration{time.Millisecond, 7 * time.Millisecond, time.Second, 1500 * time.Millisecond,
		time.Minute, time.Hour, 24 * time.Hour, driver.MaxWindow}
	for {
		n := 1 + rng.IntN(6)
		if algs != nil {
			n = len(algs)
		}
		all := rng.IntN(5) // sometimes every limit of one algorithm
		limits := make([]throttler.Limit, n)
		for i := range limits {
			alg := throttler.Algorithm(rng.IntN(4))
			if all < 4 && seq%3 == 0 {
				alg = throttler.Algorithm(all)
			}
			if algs != nil {
				alg = throttler.Algorithm(algs[i])
			}
			l := throttler.Limit{Name: fmt.Sprint("l", i), Max: maxes[rng.IntN(len(maxes))],
				Window: windows[rng.IntN(len(windows))], Algorithm: alg}
			if rng.IntN(4) == 0 {
				l.Max = 1 + rng.Int64N(50)
			}
			if l.Algorithm == throttler.GCRA && rng.IntN(2) == 0 {
				l.Burst = 1 + rng.Int64N(2*l.Max)
			}
			limits[i] = l
		}
		p, err := throttler.NewPolicy(fmt.Sprint("rev", seq), limits)
		if err == nil {
			return testkit.Compile(t, p)
		}
	}
}

// errText is the server's message of err, from THROTTLEKIT_ or WRONGTYPE on,
// with prefix taken out of the key it names.
func errText(err error, prefix string) string {
	if err == nil {
		return ""
	}
	s := err.Error()
	if i := strings.Index(s, "THROTTLEKIT_"); i >= 0 {
		s = s[i:]
	}
	return strings.ReplaceAll(s, prefix, "<P>")
}

// TestShapeScriptsMirrorGenericRaw: generic lone, shaped lone, generic
// batch and shaped batch on the same requests, up to 6 limits, with
// foreign and odd stored fields: same outcomes, same error text, same raw
// hash (x included), same expiry presence.
func TestShapeScriptsMirrorGenericRaw(t *testing.T) {
	redisbackend.ResetShapes() // room for this test's shapes
	ctx := context.Background()
	c := newClient(t, standalone(t).primary.Addr())
	type side struct {
		name   string
		prefix string
		b      *redisbackend.Backend
	}
	var sides []side
	for _, name := range []string{"generic-lone", "shaped-lone", "generic-batch", "shaped-batch"} {
		p := newPrefix()
		sides = append(sides, side{name, p, mustBackend(t, c, redisbackend.WithPrefix(p))})
	}
	rng := rand.New(rand.NewPCG(7, 28))
	deadline := time.Now().Add(90 * time.Second)
	odd := []string{"abc", "1.5", "9007199254740993", "-5", "0", "-9007199254740991", "9007199254740991", "", " 7", "0x10", "1e3", "inf", "nan"}
	rounds, compared, errSeen, okSeen, shapedRounds := 0, 0, 0, 0, 0
	shapeList := [][]driver.Algorithm{
		{3, 3, 3, 3, 3, 3}, {2, 2, 2, 2, 2, 2}, {0, 1, 2, 3, 3, 2}, {1, 1, 1, 1, 1, 1}, {0, 0, 0, 0, 0, 0},
		{3, 2, 1, 0, 3}, {2, 3}, {3}, {2}, {0}, {1},
	}
	for len(shapeList) < 50 {
		n := 1 + rng.IntN(6)
		a := make([]driver.Algorithm, n)
		for i := range a {
			a[i] = driver.Algorithm(rng.IntN(4))
		}
		shapeList = append(shapeList, a)
	}
	for round := 0; round < 300 && time.Now().Before(deadline); round++ {
		rounds++
		p0 := randomShapedPolicy(t, rng, round, shapeList[round%len(shapeList)])
		shapedRounds += map[bool]int{true: 1}[redisbackend.IsShaped(p0)]
		var algs []driver.Algorithm
		for _, l := range p0.Limits {
			algs = append(algs, l.Algorithm)
		}
		pols := []*driver.Policy{p0, randomShapedPolicy(t, rng, 1000+round, algs)}
		p := p0
		ids := []string{fmt.Sprint("r", round, "a"), fmt.Sprint("r", round, "b")}
		now := randomStart(rng)
		for step := 0; step < 8; step++ {
			// odd or foreign stored values, the same on every side
			var cleanup []string
			if rng.IntN(3) == 0 {
				id := ids[rng.IntN(len(ids))]
				var field string
				switch k := rng.IntN(len(p.Limits) + 1); {
				case k == len(p.Limits):
					field = "x"
				default:
					l := p.Limits[k]
					opts := []string{"e"}
					if l.Algorithm != driver.GCRA {
						opts = append(opts, "u")
					}
					if l.Algorithm == driver.SlidingWindow {
						opts = append(opts, "p")
					}
					field = opts[rng.IntN(len(opts))] + l.Key
				}
				v := odd[rng.IntN(len(odd))]
				bad := v != "-5" && v != "0" && v != "-9007199254740991" && v != "9007199254740991"
				for _, s := range sides {
					require.NoError(t, c.HSet(ctx, s.b.Key(p, id), field, v).Err())
					if bad {
						cleanup = append(cleanup, s.b.Key(p, id))
					}
				}
			}
			reqs := make([]driver.Request, 2+rng.IntN(10))
			for i := range reqs {
				p := pols[rng.IntN(2)]
				reqs[i] = driver.Request{Policy: p, Identifier: ids[rng.IntN(len(ids))], Cost: randomCost(rng, p), Now: now}
				if rng.IntN(3) == 0 {
					now = nextNow(rng, p, now)
				}
			}
			outs := make([][]driver.Outcome, len(sides))
			errs := make([][]string, len(sides))
			for si, s := range sides {
				outs[si], errs[si] = make([]driver.Outcome, len(reqs)), make([]string, len(reqs))
				switch s.name {
				case "generic-lone", "shaped-lone":
					for i, req := range reqs {
						var o driver.Outcome
						var err error
						if s.name == "generic-lone" {
							o, err = s.b.DecideGeneric(ctx, req)
						} else {
							o, err = s.b.Decide(ctx, req)
						}
						outs[si][i], errs[si][i] = o, errText(err, s.prefix)
					}
				default:
					var os []driver.Outcome
					var es []error
					var err error
					if s.name == "generic-batch" {
						os, es, err = s.b.DecideMany(ctx, reqs)
					} else {
						os, es, err = s.b.DecideManyShaped(ctx, reqs)
					}
					require.NoError(t, err, s.name)
					for i := range reqs {
						outs[si][i], errs[si][i] = os[i], errText(es[i], s.prefix)
					}
				}
			}
			for si := 1; si < len(sides); si++ {
				for i := range reqs {
					require.Equal(t, errs[0][i], errs[si][i], "%s req %d policy %v", sides[si].name, i, p.Name)
					if errs[0][i] == "" {
						okSeen++
						require.Equal(t, outs[0][i], outs[si][i], "%s req %d", sides[si].name, i)
					} else {
						errSeen++
					}
				}
			}
			for _, p := range pols {
				for _, id := range ids {
					var want map[string]string
					var wantTTL time.Duration
					for si, s := range sides {
						key := s.b.Key(p, id)
						typ := c.Type(ctx, key).Val()
						if typ != "hash" {
							continue
						}
						got := c.HGetAll(ctx, key).Val()
						ttl := c.PTTL(ctx, key).Val()
						if si == 0 {
							want, wantTTL = got, ttl
							continue
						}
						require.Equal(t, want, got, "%s %s", s.name, id)
						require.Equal(t, wantTTL < 0, ttl < 0, "%s %s ttl %v vs %v", s.name, id, wantTTL, ttl)
						d := wantTTL - ttl
						require.Less(t, d.Abs(), 3*time.Second, "%s %s ttl %v vs %v", s.name, id, wantTTL, ttl)
						compared++
					}
				}
			}
			for _, k := range cleanup {
				c.Del(ctx, k)
			}
			now = nextNow(rng, p, now)
		}
	}
	t.Logf("%d rounds shaped", shapedRounds)
	t.Logf("%d rounds, %d hashes compared, %d errors compared, %d outcomes compared", rounds, compared, errSeen, okSeen)
	require.Positive(t, errSeen)
	// Shapes past the process-wide cap (64) decide with the generic
	// scripts: run alone, every round is shaped; after other tests of the
	// package, some are not.
	require.Positive(t, shapedRounds, "no round ran a shape's scripts")
}
