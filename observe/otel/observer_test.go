package otelobserver_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/throttlekit/throttlekit/backend/breaker"
	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/observe"
	otelobserver "github.com/throttlekit/throttlekit/observe/otel"
	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler"
)

// TestMetricsAfterKnownTraffic drives known traffic through throttlers
// observed by one Observer and checks every metric's value in a
// collection.
func TestMetricsAfterKnownTraffic(t *testing.T) {
	ctx := context.Background()
	_, withClock := testkit.Clock()
	mem := memorybackend.New()

	down := failing{err: fmt.Errorf("dial tcp 127.0.0.1:1: %w", syscall.ECONNREFUSED)}
	guarded, err := breaker.Wrap(down, "127.0.0.1:1", breaker.WithFailures(3), breaker.WithFailingFor(0), breaker.WithLogger(nil))
	require.NoError(t, err)
	src, err := rollout.NewStaticSource(30)
	require.NoError(t, err)
	ro, err := rollout.New(memorybackend.New(), memorybackend.New(), src, rollout.WithMode(rollout.MirrorMode))
	require.NoError(t, err)

	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	o, err := otelobserver.New(otelobserver.WithMeterProvider(mp),
		otelobserver.WithBreakers(guarded.Breakers), otelobserver.WithRollout("sessions", ro))
	require.NoError(t, err)

	obs := throttler.WithObserver(o)
	quiet := throttler.WithLogger(nil)
	api := testkit.Throttler(t, mem, obs, withClock, quiet)
	cached := testkit.Throttler(t, mem, obs, withClock, quiet, throttler.WithDenyCache(100, time.Minute))
	open := testkit.Throttler(t, guarded, obs, withClock, quiet)
	closed := testkit.Throttler(t, failing{err: context.DeadlineExceeded}, obs, withClock, quiet,
		throttler.WithFailureMode(throttler.FailClosed))
	other := testkit.Throttler(t, failing{err: errors.New("ERR unknown command")}, obs, withClock, quiet)
	routed := testkit.Throttler(t, ro, obs, withClock, quiet)

	p := testkit.Policy(t, "api", "10/min")
	two := testkit.Policy(t, "search", "2/s, 100/h")

	// 12 requests on a 10/min limit: 10 allowed, the 9th and 10th leave
	// under 20% (Remaining 1 and 0), 2 denied.
	for range 12 {
		_, err := api.Allow(ctx, p, "alice")
		require.NoError(t, err)
	}
	// The deny cache: 10 allowed, one denial from the store, then 2 from
	// the cache.
	for i := range 13 {
		r, err := cached.Allow(ctx, p, "bob")
		require.NoError(t, err)
		require.Equal(t, i >= 11, r.Cached, "request %d", i)
	}
	// A policy of two limits: the 2/s limit binds and denies.
	for range 3 {
		_, err := api.Allow(ctx, two, "carol")
		require.NoError(t, err)
	}
	// A store that is down: 3 failures open the breaker, the 2 after are
	// answered by it. Fail open: degraded and allowed.
	for range 5 {
		r, err := open.Allow(ctx, p, "dave")
		require.NoError(t, err)
		require.True(t, r.Degraded && r.Allowed)
	}
	// Timeouts under fail closed: degraded and denied.
	for range 2 {
		r, err := closed.Allow(ctx, p, "erin")
		require.NoError(t, err)
		require.True(t, r.Degraded && !r.Allowed)
	}
	// An error reply: kind other.
	_, err = other.Allow(ctx, p, "frank")
	require.NoError(t, err)
	// Through the rollout: mirrored decisions.
	for i := range 4 {
		_, err := routed.Allow(ctx, p, fmt.Sprintf("user-%d", i))
		require.NoError(t, err)
	}
	_, err = api.Peek(ctx, p, "alice")
	require.NoError(t, err)
	require.NoError(t, api.Reset(ctx, p, "alice"))

	ms := metrics(t, reader)
	check := func(name string, want float64, kv ...string) {
		t.Helper()
		m, ok := ms[name]
		if !assert.True(t, ok, "no metric %s", name) {
			return
		}
		got, ok := point(m, kv...)
		if assert.True(t, ok, "%s%v missing", name, kv) {
			assert.Equal(t, want, got, "%s%v", name, kv)
		}
	}
	const d = "throttlekit.decisions"
	check(d, 10+10+4, "throttlekit.policy", "api", "throttlekit.limit", "10/min", "throttlekit.outcome", "allowed")
	check(d, 2+1, "throttlekit.policy", "api", "throttlekit.limit", "10/min", "throttlekit.outcome", "denied")
	check(d, 2, "throttlekit.policy", "api", "throttlekit.limit", "10/min", "throttlekit.outcome", "cached")
	check(d, 5+1, "throttlekit.policy", "api", "throttlekit.limit", "10/min", "throttlekit.outcome", "degraded_allowed")
	check(d, 2, "throttlekit.policy", "api", "throttlekit.limit", "10/min", "throttlekit.outcome", "degraded_denied")
	check(d, 1, "throttlekit.policy", "search", "throttlekit.limit", "2/s", "throttlekit.outcome", "denied")
	// carol's two allowed decisions: Remaining 1 of 2 then 0 of 2 on the
	// binding 2/s limit; the second is near the limit.
	check(d, 2, "throttlekit.policy", "search", "throttlekit.limit", "2/s", "throttlekit.outcome", "allowed")
	const near = "throttlekit.near_limit"
	check(near, 2+2, "throttlekit.policy", "api", "throttlekit.limit", "10/min")
	check(near, 1, "throttlekit.policy", "search", "throttlekit.limit", "2/s")
	// Outcomes never seen are not reported: OpenTelemetry exports the
	// attribute sets that were recorded.
	_, ok := point(ms[d], "throttlekit.outcome", "local_allowed")
	assert.False(t, ok)

	const dur = "throttlekit.backend.call.duration"
	check(dur, 12+11+3, "throttlekit.backend", "memory", "throttlekit.op", "allow") // cached denials make no call
	check(dur, 1, "throttlekit.backend", "memory", "throttlekit.op", "peek")
	check(dur, 1, "throttlekit.backend", "memory", "throttlekit.op", "reset")
	check(dur, 5, "throttlekit.backend", "breaker", "throttlekit.op", "allow")
	check(dur, 2+1, "throttlekit.backend", "otel_test", "throttlekit.op", "allow")
	check(dur, 4, "throttlekit.backend", "rollout", "throttlekit.op", "allow")
	h := ms[dur]
	assert.Equal(t, "s", h.Unit)
	if hd, ok := h.Data.(metricdata.Histogram[float64]); assert.True(t, ok) && assert.NotEmpty(t, hd.DataPoints) {
		assert.Equal(t, otelobserver.DefaultBuckets, hd.DataPoints[0].Bounds, "the advised buckets")
	}
	const errs = "throttlekit.backend.errors"
	check(errs, 3, "throttlekit.backend", "breaker", "throttlekit.op", "allow", "error.type", observe.KindUnreachable)
	check(errs, 2, "throttlekit.backend", "breaker", "throttlekit.op", "allow", "error.type", observe.KindBreakerOpen)
	check(errs, 2, "throttlekit.backend", "otel_test", "throttlekit.op", "allow", "error.type", observe.KindTimeout)
	check(errs, 1, "throttlekit.backend", "otel_test", "throttlekit.op", "allow", "error.type", observe.KindOther)
	for _, set := range attributeSets(ms[errs]) {
		v, _ := set.Value("error.type")
		assert.NotEqual(t, "", v.AsString())
	}

	check("throttlekit.breaker.state", 1, "throttlekit.server", "127.0.0.1:1", "throttlekit.state", "open")
	check("throttlekit.breaker.state", 0, "throttlekit.server", "127.0.0.1:1", "throttlekit.state", "closed")
	check("throttlekit.breaker.state", 0, "throttlekit.server", "127.0.0.1:1", "throttlekit.state", "half_open")
	check("throttlekit.breaker.rejected", 2, "throttlekit.server", "127.0.0.1:1")
	check("throttlekit.rollout.new_ratio", 0.3, "throttlekit.rollout.name", "sessions")
	check("throttlekit.rollout.killed", 0, "throttlekit.rollout.name", "sessions")
	check("throttlekit.rollout.events", 4, "throttlekit.rollout.name", "sessions", "throttlekit.rollout.event", "mirrored")
	check("throttlekit.rollout.events", 0, "throttlekit.rollout.name", "sessions", "throttlekit.rollout.event", "shadow_compared")
	check("throttlekit.rollout.mismatches", 0, "throttlekit.rollout.name", "sessions", "throttlekit.rollout.mismatch", "allowed_denied")

	// Units and the identifier: no metric attribute holds one.
	assert.Equal(t, "{decision}", ms[d].Unit)
	for name, m := range ms {
		for _, set := range attributeSets(m) {
			for _, kv := range set.ToSlice() {
				assert.NotEqual(t, otelobserver.IdentifierKey, kv.Key, "%s has an identifier attribute", name)
				for _, id := range []string{"alice", "bob", "carol", "dave", "erin", "frank", "user-0"} {
					assert.NotEqual(t, id, kv.Value.Emit(), "%s carries identifier %s", name, id)
				}
			}
		}
	}

	// Close unregisters the breaker and rollout callback; decisions are
	// still counted.
	require.NoError(t, o.Close())
	require.NoError(t, o.Close(), "Close is idempotent")
	_, err = api.Allow(ctx, p, "zoe")
	require.NoError(t, err)
	ms = metrics(t, reader)
	if m, ok := ms["throttlekit.breaker.state"]; ok {
		assert.Empty(t, m.Data.(metricdata.Gauge[int64]).DataPoints, "read after Close")
	}
	check(d, 10+10+4+1, "throttlekit.policy", "api", "throttlekit.limit", "10/min", "throttlekit.outcome", "allowed")
}

// TestNearLimitFraction: WithNearLimit moves the threshold; a degraded
// allowance is never near the limit.
func TestNearLimitFraction(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	o, err := otelobserver.New(otelobserver.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))),
		otelobserver.WithNearLimit(0.5))
	require.NoError(t, err)
	_, withClock := testkit.Clock()
	th := testkit.Throttler(t, memorybackend.New(), withClock, throttler.WithObserver(o))
	down := testkit.Throttler(t, failing{err: syscall.ECONNRESET}, withClock, throttler.WithObserver(o), throttler.WithLogger(nil))
	p := testkit.Policy(t, "api", "10/min")
	ctx := context.Background()
	// Remaining 9 .. 0: under 5 for 4, 3, 2, 1, 0.
	for range 10 {
		_, err := th.Allow(ctx, p, "alice")
		require.NoError(t, err)
	}
	for range 3 {
		_, err := down.Allow(ctx, p, "alice")
		require.NoError(t, err)
	}
	ms := metrics(t, reader)
	got, ok := point(ms["throttlekit.near_limit"], "throttlekit.policy", "api", "throttlekit.limit", "10/min")
	require.True(t, ok)
	assert.Equal(t, 5.0, got)
	got, ok = point(ms["throttlekit.backend.errors"], "error.type", observe.KindUnreachable)
	require.True(t, ok)
	assert.Equal(t, 3.0, got)
}

// TestBadOptions: every bad option is an error wrapping
// throttler.ErrInvalidOption, never a panic.
func TestBadOptions(t *testing.T) {
	ro, err := rollout.New(memorybackend.New(), memorybackend.New(), mustStatic(t, 10))
	require.NoError(t, err)
	for name, opts := range map[string][]otelobserver.Option{
		"nil option":             {nil},
		"near limit 0":           {otelobserver.WithNearLimit(0)},
		"near limit 1":           {otelobserver.WithNearLimit(1)},
		"near limit negative":    {otelobserver.WithNearLimit(-0.5)},
		"near limit NaN":         {otelobserver.WithNearLimit(math.NaN())},
		"near limit Inf":         {otelobserver.WithNearLimit(math.Inf(1))},
		"nil meter provider":     {otelobserver.WithMeterProvider(nil)},
		"nil tracer provider":    {otelobserver.WithTracerProvider(nil)},
		"no buckets":             {otelobserver.WithBuckets(nil)},
		"decreasing buckets":     {otelobserver.WithBuckets([]float64{1, 0.5})},
		"repeated bucket":        {otelobserver.WithBuckets([]float64{1, 1})},
		"NaN bucket":             {otelobserver.WithBuckets([]float64{0.1, math.NaN()})},
		"infinite bucket":        {otelobserver.WithBuckets([]float64{0.1, math.Inf(1)})},
		"nil breakers":           {otelobserver.WithBreakers(nil)},
		"rollout without name":   {otelobserver.WithRollout("", ro)},
		"nil rollout":            {otelobserver.WithRollout("r", nil)},
		"two rollouts, one name": {otelobserver.WithRollout("r", ro), otelobserver.WithRollout("r", ro)},
	} {
		o, err := otelobserver.New(opts...)
		assert.ErrorIs(t, err, throttler.ErrInvalidOption, name)
		assert.Nil(t, o, name)
	}
	o, err := otelobserver.New(otelobserver.WithNearLimit(0.01), otelobserver.WithBuckets([]float64{0.001, 0.01}))
	require.NoError(t, err)
	assert.NotNil(t, o)
}

func mustStatic(t *testing.T, percent int) *rollout.StaticSource {
	t.Helper()
	src, err := rollout.NewStaticSource(percent)
	require.NoError(t, err)
	return src
}

// TestOddEvents: events a throttler does not send, and a nil Observer,
// neither panic nor record an identifier.
func TestOddEvents(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	o, err := otelobserver.New(otelobserver.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))),
		otelobserver.WithSpans(true))
	require.NoError(t, err)
	ctx := context.Background()
	at := testkit.T0
	for _, e := range []throttler.Event{
		{},
		{Op: "allow"},
		{Op: "allow", Identifier: "x", Result: throttler.Result{At: at}},
		{Op: "allow", Result: throttler.Result{At: at, Cached: true, Allowed: false}},
		{Op: "mystery", Err: errors.New("boom"), Latency: -time.Second},
		{Op: "refund", Result: throttler.Result{At: at, Allowed: true, Limit: -1, Remaining: math.MaxInt64}},
		{Op: "allow", Result: throttler.Result{At: at, RetryAfter: throttler.Never, NeverAllowed: true}},
	} {
		assert.NotPanics(t, func() { o.Observe(ctx, e) }, "%+v", e)
		var noCtx context.Context // a bad caller's
		assert.NotPanics(t, func() { o.Observe(noCtx, e) }, "nil context: %+v", e)
	}
	var nilObs *otelobserver.Observer
	assert.NotPanics(t, func() { nilObs.Observe(ctx, throttler.Event{Op: "allow"}) })
	assert.NoError(t, nilObs.Close())
	ms := metrics(t, reader)
	got, ok := point(ms["throttlekit.decisions"], "throttlekit.policy", "", "throttlekit.limit", "", "throttlekit.outcome", "denied")
	require.True(t, ok)
	assert.Equal(t, 4.0, got, "two results of no limit, twice")
	_, ok = point(ms["throttlekit.backend.errors"], "throttlekit.op", "mystery", "error.type", observe.KindOther)
	assert.True(t, ok)
	for _, set := range attributeSets(ms["throttlekit.decisions"]) {
		assert.False(t, set.HasValue(otelobserver.IdentifierKey))
	}
}

// TestConcurrentFirstSight: goroutines that see new policies, limits and
// backends at once all count, once each.
func TestConcurrentFirstSight(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	o, err := otelobserver.New(otelobserver.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))))
	require.NoError(t, err)
	const workers, rounds, policies = 8, 50, 5
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				n := (w + i) % policies
				o.Observe(context.Background(), throttler.Event{Op: "allow", Policy: fmt.Sprint("p", n), Backend: fmt.Sprint("b", n),
					Result: throttler.Result{Allowed: true, Binding: fmt.Sprint("l", n), Limit: 100, Remaining: 50, At: testkit.T0}})
			}
		}()
	}
	wg.Wait()
	ms := metrics(t, reader)
	total := 0.0
	for n := range policies {
		v, ok := point(ms["throttlekit.decisions"], "throttlekit.policy", fmt.Sprint("p", n), "throttlekit.limit", fmt.Sprint("l", n))
		require.True(t, ok)
		total += v
		v, ok = point(ms["throttlekit.backend.call.duration"], "throttlekit.backend", fmt.Sprint("b", n))
		require.True(t, ok)
		assert.Equal(t, float64(workers*rounds/policies), v)
	}
	assert.Equal(t, float64(workers*rounds), total)
}
