package rls_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/middleware/rls"
	"github.com/throttlekit/throttlekit/middleware/rls/config"
	"github.com/throttlekit/throttlekit/throttler"
)

// conformanceConfig has a rule of each algorithm, a rule of several
// windows, a nested rule, a shadow rule and an unlimited one.
const conformanceConfig = `
domain: conf
descriptors:
  - key: aligned
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: fixed
    rate_limit: {unit: minute, requests_per_unit: 6, algorithm: fixed}
  - key: gcra
    rate_limit: {unit: second, requests_per_unit: 3, algorithm: gcra, burst: 5}
  - key: sliding
    rate_limit: {unit: minute, requests_per_unit: 7, algorithm: sliding}
  - key: multi
    rate_limit: {unit: second, requests_per_unit: 3, limits: ["8/min", "20/h sliding"]}
  - key: tenant
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: free
    rate_limit: {unlimited: true}
`

// randomRequest draws a request of one to three descriptors over a few
// values of each rule, with hits_addend now and then.
func randomRequest(r *rand.Rand) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: "conf"}
	for range 1 + r.IntN(3) {
		v := fmt.Sprint(r.IntN(3))
		var d *commonv3.RateLimitDescriptor
		switch r.IntN(9) {
		case 0:
			d = desc("aligned", v)
		case 1:
			d = desc("fixed", v)
		case 2:
			d = desc("gcra", v)
		case 3:
			d = desc("sliding", v)
		case 4:
			d = desc("multi", v)
		case 5:
			d = desc("tenant", "t"+v, "user", v)
		case 6:
			d = desc("shadow", v)
		case 7:
			d = desc("free", v)
		default:
			d = desc("unknown", v)
		}
		if r.IntN(6) == 0 {
			d.HitsAddend = wrapperspb.UInt64(uint64(r.IntN(4)))
		}
		req.Descriptors = append(req.Descriptors, d)
	}
	if r.IntN(8) == 0 {
		req.HitsAddend = uint32(r.IntN(3))
	}
	return req
}

// TestEveryStoreAnswersAlike runs the same random timeline of requests
// through the service on the in-process store and on real Redis, each with
// its own manual clock moved alike, and requires identical responses:
// every code, limit, remaining count and reset, request by request. Run
// with and without WithEnvoyCompat.
func TestEveryStoreAnswersAlike(t *testing.T) {
	redisBackend := redisStore(t)
	cfg := parse(t, conformanceConfig)
	for _, compat := range []bool{false, true} {
		t.Run(fmt.Sprintf("envoy-compat=%v", compat), func(t *testing.T) {
			var opts []rls.Option
			if compat {
				opts = append(opts, rls.WithEnvoyCompat())
			}
			reference := newFixture(t, memorybackend.New(), cfg, opts...)
			onRedis := newFixture(t, redisBackend, cfg, opts...)
			// Each run starts in fresh windows: both clocks move a day on.
			offset := time.Duration(testkit.Count(t, "RLS_CONFORMANCE_SEED", 1)) * 24 * time.Hour
			if compat {
				offset += 48 * time.Hour
			}
			reference.clock.Advance(offset)
			onRedis.clock.Advance(offset)
			r := rand.New(rand.NewPCG(uint64(offset), 7))
			steps := testkit.Count(t, "RLS_CONFORMANCE_STEPS", 1500)
			for i := range steps {
				if r.IntN(4) == 0 {
					d := time.Duration(r.IntN(1500)) * time.Millisecond
					reference.clock.Advance(d)
					onRedis.clock.Advance(d)
				}
				req := randomRequest(r)
				want, err := reference.client.ShouldRateLimit(context.Background(), req)
				require.NoError(t, err)
				got, err := onRedis.client.ShouldRateLimit(context.Background(), req)
				require.NoError(t, err)
				if !proto.Equal(want, got) {
					t.Fatalf("step %d: %v\nmemory: %v\nredis:  %v", i, req, want, got)
				}
			}
		})
	}
}

// TestLibraryAndServiceShareCounters: a Go program that imports
// throttlekit and looks the rule up in the same configuration counts on the
// very counter the service counts on, so a monolith and its gateway
// enforce one limit together.
func TestLibraryAndServiceShareCounters(t *testing.T) {
	backend := redisStore(t)
	cfg := parse(t, twoRules)
	f := newFixture(t, backend, cfg)
	th := testkit.Throttler(t, backend, throttler.WithClock(f.clock), throttler.WithCallTimeout(testkit.CallTimeout))
	m := cfg.Lookup("d", []config.Entry{{Key: "user", Value: "alice"}})
	require.NotNil(t, m.Rule)
	for i := range 5 {
		if i%2 == 0 {
			r, err := th.Allow(context.Background(), m.Rule.Policy, m.CacheKey)
			require.NoError(t, err)
			assert.Equal(t, int64(4-i), r.Remaining, "library call %d", i)
		} else {
			resp := f.ask(t, "d", desc("user", "alice"))
			assert.Equal(t, uint32(4-i), resp.Statuses[0].LimitRemaining, "service call %d", i)
		}
	}
	assert.Equal(t, over, f.ask(t, "d", desc("user", "alice")).OverallCode)
	r, err := th.Allow(context.Background(), m.Rule.Policy, m.CacheKey)
	require.NoError(t, err)
	assert.False(t, r.Allowed)
}
