package promobserver_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/breaker"
	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
	promobserver "github.com/throttlekit/throttlekit/observe/prometheus"
	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// failing is a backend whose store is always down, with err.
type failing struct{ err error }

func (f failing) Decide(context.Context, driver.Request) (driver.Outcome, error) {
	return driver.Outcome{}, f.err
}

// scrape fetches the registry's metrics over HTTP, as Prometheus would, and
// parses the text format.
func scrape(t *testing.T, reg *prometheus.Registry) map[string]*dto.MetricFamily {
	t.Helper()
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	parser := expfmt.NewTextParser(model.LegacyValidation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	require.NoError(t, err)
	return families
}

// value returns the value of the series of family name whose labels
// include want, and whether there is one.
func value(families map[string]*dto.MetricFamily, name string, want map[string]string) (float64, bool) {
	f, ok := families[name]
	if !ok {
		return 0, false
	}
next:
	for _, m := range f.GetMetric() {
		got := map[string]string{}
		for _, l := range m.GetLabel() {
			got[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if got[k] != v {
				continue next
			}
		}
		switch {
		case m.Counter != nil:
			return m.GetCounter().GetValue(), true
		case m.Gauge != nil:
			return m.GetGauge().GetValue(), true
		case m.Histogram != nil:
			return float64(m.GetHistogram().GetSampleCount()), true
		}
	}
	return 0, false
}

func labels(kv ...string) map[string]string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return m
}

// TestScrapeAfterKnownTraffic drives known traffic through throttlers
// observed by one collector and checks every metric's value in a scrape.
func TestScrapeAfterKnownTraffic(t *testing.T) {
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

	c, err := promobserver.New(promobserver.WithBreakers(guarded.Breakers), promobserver.WithRollout("sessions", ro))
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(c))

	obs := throttler.WithObserver(c)
	quiet := throttler.WithLogger(nil)
	api := testkit.Throttler(t, mem, obs, withClock, quiet)
	cached := testkit.Throttler(t, mem, obs, withClock, quiet, throttler.WithDenyCache(100, time.Minute))
	open := testkit.Throttler(t, guarded, obs, withClock, quiet)
	closed := testkit.Throttler(t, failing{err: context.DeadlineExceeded}, obs, withClock, quiet,
		throttler.WithFailureMode(throttler.FailClosed))
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
	// Through the rollout: mirrored decisions.
	for i := range 4 {
		_, err := routed.Allow(ctx, p, fmt.Sprintf("user-%d", i))
		require.NoError(t, err)
	}
	_, err = api.Peek(ctx, p, "alice")
	require.NoError(t, err)

	f := scrape(t, reg)
	check := func(name string, want float64, kv ...string) {
		t.Helper()
		got, ok := value(f, name, labels(kv...))
		if assert.True(t, ok, "%s%v missing", name, kv) {
			assert.Equal(t, want, got, "%s%v", name, kv)
		}
	}
	const d = "throttlekit_decisions_total"
	check(d, 10+10+4, "policy", "api", "limit", "10/min", "outcome", "allowed")
	check(d, 2+1, "policy", "api", "limit", "10/min", "outcome", "denied")
	check(d, 2, "policy", "api", "limit", "10/min", "outcome", "cached")
	check(d, 5, "policy", "api", "limit", "10/min", "outcome", "degraded_allowed")
	check(d, 2, "policy", "api", "limit", "10/min", "outcome", "degraded_denied")
	check(d, 0, "policy", "api", "limit", "10/min", "outcome", "local_allowed")
	check(d, 1, "policy", "search", "limit", "2/s", "outcome", "denied")
	// carol's two allowed decisions: Remaining 1 of 2 then 0 of 2 on the
	// binding 2/s limit; the second is near the limit.
	check(d, 2, "policy", "search", "limit", "2/s", "outcome", "allowed")
	check("throttlekit_near_limit_total", 2+2, "policy", "api", "limit", "10/min")
	check("throttlekit_near_limit_total", 1, "policy", "search", "limit", "2/s")

	const lat = "throttlekit_backend_call_duration_seconds"
	check(lat, 12+11+3, "backend", "memory", "op", "allow") // cached denials make no call
	check(lat, 1, "backend", "memory", "op", "peek")
	check(lat, 5, "backend", "breaker", "op", "allow")
	check(lat, 4, "backend", "rollout", "op", "allow")
	const errs = "throttlekit_backend_errors_total"
	check(errs, 3, "backend", "breaker", "op", "allow", "kind", "unreachable")
	check(errs, 2, "backend", "breaker", "op", "allow", "kind", "breaker_open")
	check(errs, 2, "backend", "prometheus_test", "op", "allow", "kind", "timeout")

	check("throttlekit_breaker_state", 1, "server", "127.0.0.1:1", "state", "open")
	check("throttlekit_breaker_state", 0, "server", "127.0.0.1:1", "state", "closed")
	check("throttlekit_breaker_rejected_total", 2, "server", "127.0.0.1:1")
	check("throttlekit_rollout_new_ratio", 0.3, "rollout", "sessions")
	check("throttlekit_rollout_killed", 0, "rollout", "sessions")
	check("throttlekit_rollout_events_total", 4, "rollout", "sessions", "event", "mirrored")
	check("throttlekit_rollout_mismatches_total", 0, "rollout", "sessions", "kind", "allowed_denied")

	// No series is labelled by identifier.
	for name, fam := range f {
		for _, m := range fam.GetMetric() {
			for _, l := range m.GetLabel() {
				for _, id := range []string{"alice", "bob", "carol", "dave", "erin", "user-0"} {
					assert.NotEqual(t, id, l.GetValue(), "%s has an identifier label", name)
				}
			}
		}
	}
}

func TestBadOptions(t *testing.T) {
	for name, opt := range map[string]promobserver.Option{
		"near limit 0":      promobserver.WithNearLimit(0),
		"near limit 1":      promobserver.WithNearLimit(1),
		"near limit NaN":    promobserver.WithNearLimit(nan()),
		"no buckets":        promobserver.WithBuckets(nil),
		"unsorted buckets":  promobserver.WithBuckets([]float64{1, 0.5}),
		"NaN bucket":        promobserver.WithBuckets([]float64{0.1, nan()}),
		"infinite bucket":   promobserver.WithBuckets([]float64{0.1, math.Inf(1)}),
		"-Inf bucket":       promobserver.WithBuckets([]float64{math.Inf(-1), 0.1}),
		"nil breakers":      promobserver.WithBreakers(nil),
		"unnamed rollout":   promobserver.WithRollout("", nil),
		"empty namespace":   promobserver.WithNamespace(""),
		"nil option itself": nil,
	} {
		_, err := promobserver.New(opt)
		assert.ErrorIs(t, err, throttler.ErrInvalidOption, name)
	}
}

func nan() float64 {
	var zero float64
	return zero / zero
}

// TestNamespace: WithNamespace renames every metric.
func TestNamespace(t *testing.T) {
	c, err := promobserver.New(promobserver.WithNamespace("edge"))
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(c))
	th := testkit.Throttler(t, memorybackend.New(), throttler.WithObserver(c))
	_, err = th.Allow(context.Background(), testkit.Policy(t, "api", "1/s"), "x")
	require.NoError(t, err)
	f := scrape(t, reg)
	for name := range f {
		assert.True(t, strings.HasPrefix(name, "edge_"), name)
	}
	assert.Contains(t, f, "edge_decisions_total")
	assert.False(t, errors.Is(err, throttler.ErrInvalidOption))
}

// TestQuotaGauge: the remaining quota of named subjects, per limit, read
// at the scrape; other identifiers never appear.
func TestQuotaGauge(t *testing.T) {
	ctx := context.Background()
	_, clock := testkit.Clock()
	th := testkit.Throttler(t, memorybackend.New(), clock)
	p := testkit.Policy(t, "partner", "300/min, 15750/h")
	c, err := promobserver.New(promobserver.WithQuotaGauge(th, p, "partner:acme"))
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(c))
	r, err := th.AllowUpTo(ctx, p, "partner:acme", 120)
	require.NoError(t, err)
	require.EqualValues(t, 120, r.Granted)
	_, err = th.AllowN(ctx, p, "someone-else", 5)
	require.NoError(t, err)

	f := scrape(t, reg)
	got := func(name string, kv ...string) float64 {
		v, ok := value(f, name, labels(kv...))
		require.True(t, ok, "%s%v", name, kv)
		return v
	}
	assert.Equal(t, 180.0, got("throttlekit_quota_remaining", "policy", "partner", "limit", "300/min", "subject", "partner:acme"))
	assert.Equal(t, 15630.0, got("throttlekit_quota_remaining", "policy", "partner", "limit", "15750/h", "subject", "partner:acme"))
	assert.Equal(t, 300.0, got("throttlekit_quota_limit", "policy", "partner", "limit", "300/min", "subject", "partner:acme"))
	assert.Equal(t, 0.0, got("throttlekit_quota_scrape_errors", "policy", "partner", "subject", "partner:acme"))
	_, ok := value(f, "throttlekit_quota_remaining", labels("subject", "someone-else"))
	assert.False(t, ok)

	subjects := make([]string, promobserver.MaxQuotaSubjects+1)
	for i := range subjects {
		subjects[i] = fmt.Sprint("s", i)
	}
	_, err = promobserver.New(promobserver.WithQuotaGauge(th, p, subjects...))
	assert.ErrorIs(t, err, throttler.ErrInvalidOption)
	_, err = promobserver.New(promobserver.WithQuotaGauge(nil, p, "x"))
	assert.ErrorIs(t, err, throttler.ErrInvalidOption)
}
