package rls_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/middleware/rls"
	"github.com/throttlekit/throttlekit/middleware/rls/config"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// parse loads one YAML file, failing the test on an error.
func parse(tb testing.TB, yaml string) *config.Config {
	tb.Helper()
	cfg, err := config.Parse([]config.File{{Name: "test.yaml", Data: []byte(yaml)}})
	require.NoError(tb, err)
	return cfg
}

// fixture is a Server on a backend with a manual clock, served over real
// gRPC on a loopback port.
type fixture struct {
	clock  *throttlertest.ManualClock
	srv    *rls.Server
	client rlsv3.RateLimitServiceClient
}

// aligned is a start time on a whole hour, so that every envoy unit's
// window opens there.
var aligned = time.Date(2030, 1, 2, 3, 0, 0, 0, time.UTC)

func newFixture(tb testing.TB, b driver.Backend, cfg *config.Config, opts ...rls.Option) *fixture {
	tb.Helper()
	clock := throttlertest.NewManualClock(aligned)
	// A loaded machine may take longer than the default 100 ms to answer;
	// a store failure must fail the test, never be decided by the failure
	// mode (which would make the figures the scheduler's).
	th := testkit.Throttler(tb, b, throttler.WithClock(clock), throttler.WithCallTimeout(testkit.CallTimeout))
	opts = append([]rls.Option{rls.WithClock(clock.Now), rls.WithFailureMode(rls.FailError)}, opts...)
	srv, err := rls.New(th, cfg, opts...)
	require.NoError(tb, err)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	gs := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(gs, srv)
	go func() { _ = gs.Serve(lis) }()
	tb.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(tb, err)
	tb.Cleanup(func() { conn.Close() })
	return &fixture{clock: clock, srv: srv, client: rlsv3.NewRateLimitServiceClient(conn)}
}

// desc builds a descriptor from key, value pairs.
func desc(kv ...string) *commonv3.RateLimitDescriptor {
	d := &commonv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func (f *fixture) ask(tb testing.TB, domain string, ds ...*commonv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	tb.Helper()
	resp, err := f.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
	require.NoError(tb, err)
	return resp
}

const ok, over = rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT

func TestFixedWindowCountsAndResets(t *testing.T) {
	f := newFixture(t, memorybackend.New(), parse(t, `
domain: api
descriptors:
  - key: client
    rate_limit: {unit: minute, requests_per_unit: 3}
`))
	f.clock.Advance(20 * time.Second)
	for i, want := range []uint32{2, 1, 0} {
		resp := f.ask(t, "api", desc("client", "a"))
		require.Equal(t, ok, resp.OverallCode, "hit %d", i)
		st := resp.Statuses[0]
		assert.Equal(t, want, st.LimitRemaining)
		assert.Equal(t, uint32(3), st.CurrentLimit.RequestsPerUnit)
		assert.Equal(t, rlsv3.RateLimitResponse_RateLimit_MINUTE, st.CurrentLimit.Unit)
		// The window is aligned on the clock, as envoy ratelimit's: it ends
		// at 03:01:00 whatever second it opened.
		assert.Equal(t, 40*time.Second, st.DurationUntilReset.AsDuration())
	}
	resp := f.ask(t, "api", desc("client", "a"))
	assert.Equal(t, over, resp.OverallCode)
	assert.Equal(t, over, resp.Statuses[0].Code)
	assert.Equal(t, uint32(0), resp.Statuses[0].LimitRemaining)
	// Another value has its own counter.
	assert.Equal(t, uint32(2), f.ask(t, "api", desc("client", "b")).Statuses[0].LimitRemaining)
	f.clock.Advance(40 * time.Second)
	assert.Equal(t, uint32(2), f.ask(t, "api", desc("client", "a")).Statuses[0].LimitRemaining)
}

func TestNoRuleUnlimitedAndBlocked(t *testing.T) {
	f := newFixture(t, memorybackend.New(), parse(t, `
domain: d
descriptors:
  - key: ldap
    rate_limit: {unlimited: true}
  - key: ip
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
`))
	resp := f.ask(t, "d", desc("nothing", "here"), desc("ldap", "x"), desc("ip", "50.0.0.5"))
	assert.Equal(t, over, resp.OverallCode)
	assert.Equal(t, ok, resp.Statuses[0].Code)
	assert.Nil(t, resp.Statuses[0].CurrentLimit)
	assert.Equal(t, ok, resp.Statuses[1].Code)
	assert.Equal(t, uint32(math.MaxUint32), resp.Statuses[1].LimitRemaining)
	assert.Equal(t, over, resp.Statuses[2].Code)
	assert.Equal(t, uint32(0), resp.Statuses[2].CurrentLimit.RequestsPerUnit)
}

const twoRules = `
domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 2}
`

func TestAllOrNothingRefundsTheOthers(t *testing.T) {
	f := newFixture(t, memorybackend.New(), parse(t, twoRules))
	for range 2 {
		require.Equal(t, ok, f.ask(t, "d", desc("user", "u"), desc("tenant", "t")).OverallCode)
	}
	resp := f.ask(t, "d", desc("user", "u"), desc("tenant", "t"))
	require.Equal(t, over, resp.OverallCode)
	assert.Equal(t, ok, resp.Statuses[0].Code)
	// The user's unit was given back: 5 - 2 spent.
	assert.Equal(t, uint32(3), resp.Statuses[0].LimitRemaining)
	assert.Equal(t, uint32(3), f.ask(t, "d", desc("user", "u")).Statuses[0].LimitRemaining+1)
}

func TestEnvoyCompatCountsAsEnvoyRatelimit(t *testing.T) {
	f := newFixture(t, memorybackend.New(), parse(t, twoRules), rls.WithEnvoyCompat())
	for range 3 {
		f.ask(t, "d", desc("user", "u"), desc("tenant", "t"))
	}
	// Every request spent the user's quota, denied or not.
	assert.Equal(t, uint32(1), f.ask(t, "d", desc("user", "u")).Statuses[0].LimitRemaining)

	// A hits_addend past what remains empties the window.
	resp, err := f.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
		Domain: "d", HitsAddend: 2, Descriptors: []*commonv3.RateLimitDescriptor{desc("user", "v")}})
	require.NoError(t, err)
	require.Equal(t, uint32(3), resp.Statuses[0].LimitRemaining)
	resp, err = f.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{
		Domain: "d", HitsAddend: 4, Descriptors: []*commonv3.RateLimitDescriptor{desc("user", "v")}})
	require.NoError(t, err)
	require.Equal(t, over, resp.OverallCode)
	assert.Equal(t, over, f.ask(t, "d", desc("user", "v")).OverallCode, "the denied hit spent the rest")

	// An unknown domain is OK, as envoy ratelimit answers it.
	assert.Equal(t, ok, f.ask(t, "nope", desc("a", "b")).OverallCode)
}

func TestShadowModeNeverDenies(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := rls.NewMetrics(reg)
	require.NoError(t, err)
	f := newFixture(t, memorybackend.New(), parse(t, `
domain: d
descriptors:
  - key: user
    shadow_mode: true
    rate_limit: {unit: second, requests_per_unit: 1}
`), rls.WithMetrics(m))
	for range 3 {
		resp := f.ask(t, "d", desc("user", "a"))
		assert.Equal(t, ok, resp.OverallCode)
	}
	n, err := testutil.GatherAndCount(reg, "ratelimit_service_rate_limit_shadow_mode")
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.Equal(t, 2.0, testutil.ToFloat64(mustVec(t, reg, "ratelimit_service_rate_limit_shadow_mode")))
	assert.Equal(t, 3.0, testutil.ToFloat64(mustVec(t, reg, "ratelimit_service_rate_limit_total_hits")))
	assert.Equal(t, 2.0, testutil.ToFloat64(mustVec(t, reg, "ratelimit_service_rate_limit_over_limit")))
}

// mustVec returns a collector that yields the one series of name in reg.
func mustVec(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	return prometheus.CollectorFunc(func(ch chan<- prometheus.Metric) {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(name, "", nil, nil), prometheus.CounterValue, m.GetCounter().GetValue())
			}
		}
	})
}

func TestHitsAddendZeroOnlyReads(t *testing.T) {
	f := newFixture(t, memorybackend.New(), parse(t, twoRules))
	d := desc("user", "u")
	d.HitsAddend = wrapperspb.UInt64(0)
	for range 3 {
		assert.Equal(t, uint32(5), f.ask(t, "d", d).Statuses[0].LimitRemaining)
	}
	d.HitsAddend = wrapperspb.UInt64(4)
	assert.Equal(t, uint32(1), f.ask(t, "d", d).Statuses[0].LimitRemaining)
	// More than the limit can ever hold: over the limit, not an error.
	d.HitsAddend = wrapperspb.UInt64(6)
	assert.Equal(t, over, f.ask(t, "d", d).OverallCode)
}

func TestDescriptorLimitOverride(t *testing.T) {
	f := newFixture(t, memorybackend.New(), parse(t, twoRules))
	d := desc("route", "r1")
	d.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_HOUR}
	assert.Equal(t, uint32(1), f.ask(t, "d", d).Statuses[0].LimitRemaining)
	assert.Equal(t, uint32(0), f.ask(t, "d", d).Statuses[0].LimitRemaining)
	resp := f.ask(t, "d", d)
	assert.Equal(t, over, resp.OverallCode)
	assert.Equal(t, rlsv3.RateLimitResponse_RateLimit_HOUR, resp.Statuses[0].CurrentLimit.Unit)
}

func TestResponseHeadersNameTheStoredReset(t *testing.T) {
	f := newFixture(t, memorybackend.New(), parse(t, twoRules),
		rls.WithResponseHeaders(rls.HeaderNames{Limit: "x-ratelimit-limit", Remaining: "x-ratelimit-remaining", Reset: "x-ratelimit-reset"}))
	f.clock.Advance(10*time.Second + 300*time.Millisecond)
	resp := f.ask(t, "d", desc("user", "u"), desc("tenant", "t"))
	headers := map[string]string{}
	for _, h := range resp.ResponseHeadersToAdd {
		headers[h.Key] = h.Value
	}
	// The tenant binds: 1 left of 2; 49.7 s rounds up to 50.
	assert.Equal(t, map[string]string{"x-ratelimit-limit": "2", "x-ratelimit-remaining": "1", "x-ratelimit-reset": "50"}, headers)
}

func TestRequestErrors(t *testing.T) {
	f := newFixture(t, memorybackend.New(), parse(t, twoRules))
	long := strings.Repeat("v", 300)
	many := make([]*commonv3.RateLimitDescriptor, 40)
	for i := range many {
		many[i] = desc("user", "u")
	}
	huge := desc("user", "u")
	huge.HitsAddend = wrapperspb.UInt64(1 << 50)
	for name, tc := range map[string]struct {
		req  *rlsv3.RateLimitRequest
		code codes.Code
		err  error
	}{
		"empty domain":     {&rlsv3.RateLimitRequest{Descriptors: []*commonv3.RateLimitDescriptor{desc("user", "u")}}, codes.InvalidArgument, rls.ErrInvalidRequest},
		"no descriptors":   {&rlsv3.RateLimitRequest{Domain: "d"}, codes.InvalidArgument, rls.ErrInvalidRequest},
		"empty entries":    {&rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{{}}}, codes.InvalidArgument, rls.ErrInvalidRequest},
		"empty key":        {&rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{desc("", "u")}}, codes.InvalidArgument, rls.ErrInvalidRequest},
		"long value":       {&rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{desc("user", long)}}, codes.InvalidArgument, rls.ErrInvalidRequest},
		"many descriptors": {&rlsv3.RateLimitRequest{Domain: "d", Descriptors: many}, codes.InvalidArgument, rls.ErrInvalidRequest},
		"huge hits_addend": {&rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{huge}}, codes.InvalidArgument, rls.ErrInvalidRequest},
		"unknown domain":   {&rlsv3.RateLimitRequest{Domain: "nope", Descriptors: []*commonv3.RateLimitDescriptor{desc("user", "u")}}, codes.NotFound, rls.ErrUnknownDomain},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := f.client.ShouldRateLimit(context.Background(), tc.req)
			require.Error(t, err)
			assert.Equal(t, tc.code, status.Code(err), "%v", err)
			// In process, the same error matches its sentinel.
			_, err = f.srv.ShouldRateLimit(context.Background(), tc.req)
			assert.ErrorIs(t, err, tc.err)
		})
	}
}

func TestNoConfigYet(t *testing.T) {
	srv, err := rls.New(testkit.Throttler(t, memorybackend.New()), nil)
	require.NoError(t, err)
	_, err = srv.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{desc("a", "b")}})
	assert.ErrorIs(t, err, rls.ErrNoConfig)
	assert.Equal(t, codes.FailedPrecondition, status.Code(err))
	require.Error(t, srv.NewHealth(0).Check(context.Background()))
}

func TestJSONEndpoint(t *testing.T) {
	f := newFixture(t, memorybackend.New(), parse(t, twoRules))
	h := httptest.NewServer(f.srv.JSONHandler())
	defer h.Close()
	post := func(body string) (int, string) {
		resp, err := http.Post(h.URL, "application/json", strings.NewReader(body))
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	req := `{"domain":"d","descriptors":[{"entries":[{"key":"tenant","value":"t"}]}]}`
	code, body := post(req)
	require.Equal(t, http.StatusOK, code, body)
	var resp rlsv3.RateLimitResponse
	require.NoError(t, protojson.Unmarshal([]byte(body), &resp))
	assert.Equal(t, ok, resp.OverallCode)
	assert.Equal(t, uint32(1), resp.Statuses[0].LimitRemaining)
	post(req)
	code, body = post(req)
	assert.Equal(t, http.StatusTooManyRequests, code)
	assert.Contains(t, body, `"overallCode":"OVER_LIMIT"`)

	for _, bad := range []string{``, `{`, `{"domain":"d"}`, `{"domain":"nope","descriptors":[{"entries":[{"key":"a"}]}]}`,
		`{"domain":"d","hitsAddend":-1,"descriptors":[{"entries":[{"key":"a"}]}]}`, `{"domain":"d","descriptors":[{}]}`, `[]`} {
		code, body := post(bad)
		assert.Equal(t, http.StatusBadRequest, code, "%s: %s", bad, body)
	}
	big := `{"domain":"d","descriptors":[{"entries":[{"key":"a","value":"` + strings.Repeat("x", 70<<10) + `"}]}]}`
	code, _ = post(big)
	assert.Equal(t, http.StatusRequestEntityTooLarge, code)
	resp2, err := http.Get(h.URL)
	require.NoError(t, err)
	resp2.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp2.StatusCode)
}

// TestReloadKeepsWindows: a raised requests_per_unit keeps the open window
// and its count; an unchanged rule keeps its window when others change.
func TestReloadKeepsWindows(t *testing.T) {
	f := newFixture(t, memorybackend.New(), parse(t, twoRules))
	for range 2 {
		f.ask(t, "d", desc("user", "u"))
	}
	f.clock.Advance(5 * time.Second)
	require.NoError(t, f.srv.SetConfig(parse(t, `
domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: route
    rate_limit: {unit: second, requests_per_unit: 1}
`)))
	resp := f.ask(t, "d", desc("user", "u"))
	assert.Equal(t, uint32(7), resp.Statuses[0].LimitRemaining, "10 - 3: the count carried over")
	assert.Equal(t, 55*time.Second, resp.Statuses[0].DurationUntilReset.AsDuration())
	// The tenant rule is gone: no limit.
	assert.Nil(t, f.ask(t, "d", desc("tenant", "t")).Statuses[0].CurrentLimit)
}

func TestNewRefusesBadOptions(t *testing.T) {
	th := testkit.Throttler(t, memorybackend.New())
	for _, opt := range []rls.Option{rls.WithLogger(nil), rls.WithNearLimitRatio(0), rls.WithNearLimitRatio(2),
		rls.WithBounds(rls.Bounds{Descriptors: -1}), rls.WithMetrics(nil), rls.WithClock(nil), rls.WithFailureMode(7), nil} {
		_, err := rls.New(th, nil, opt)
		assert.ErrorIs(t, err, rls.ErrInvalidOption)
	}
	_, err := rls.New(nil, nil)
	assert.ErrorIs(t, err, rls.ErrInvalidOption)
	_, err = rls.ParseFailureMode("sometimes")
	assert.ErrorIs(t, err, rls.ErrInvalidOption)
}

// FuzzShouldRateLimit feeds arbitrary bytes as a gRPC request and as a
// /json body: the service never panics, and answers either a response or an
// error that names its cause.
func FuzzShouldRateLimit(f *testing.F) {
	f.Add([]byte(`{"domain":"d","descriptors":[{"entries":[{"key":"user","value":"u"}]}]}`))
	f.Add([]byte(`{"domain":"d","hitsAddend":4294967295,"descriptors":[{"entries":[{"key":"tenant"}],"hitsAddend":"0"}]}`))
	f.Add([]byte(`{"domain":"d","descriptors":[{"entries":[{"key":"r","value":"v"}],"limit":{"requestsPerUnit":0,"unit":"DAY"}}]}`))
	f.Add([]byte{0x0a, 0x01, 'd', 0x12, 0x00})
	clock := throttlertest.NewManualClock(aligned)
	th, err := throttler.New(memorybackend.New(), throttler.WithClock(clock))
	require.NoError(f, err)
	srv, err := rls.New(th, parse(f, twoRules), rls.WithClock(clock.Now))
	require.NoError(f, err)
	h := srv.JSONHandler()
	f.Fuzz(func(t *testing.T, data []byte) {
		var req rlsv3.RateLimitRequest
		if proto.Unmarshal(data, &req) == nil {
			resp, err := srv.ShouldRateLimit(context.Background(), &req)
			if err != nil {
				if !errors.Is(err, rls.ErrInvalidRequest) && !errors.Is(err, rls.ErrUnknownDomain) {
					t.Fatalf("unexpected error %v", err)
				}
			} else if len(resp.Statuses) != len(req.Descriptors) {
				t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(req.Descriptors))
			}
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/json", bytes.NewReader(data)))
		switch rec.Code {
		case http.StatusOK, http.StatusTooManyRequests, http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		default:
			t.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
	})
}
