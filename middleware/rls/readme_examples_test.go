package rls_test

import (
	"bytes"
	"context"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/encoding/protojson"

	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/internal/localserver"
	"github.com/throttlekit/throttlekit/middleware/rls"
	"github.com/throttlekit/throttlekit/middleware/rls/config"
)

// Figures a step expects of a status.
const (
	noLimit   = -1 // OK with no limit: no rule applies, or it was replaced
	unlimited = -2 // OK, LimitRemaining MaxUint32: an unlimited rule
)

// step sends the same request times times and checks every answer's
// overall code, and the last answer's remaining count per descriptor.
type step struct {
	descriptors [][]string // each descriptor's entries as key, value, …
	times       int
	overall     rlsv3.RateLimitResponse_Code
	remaining   []int64
}

// readmeExamples are envoy ratelimit's README examples, each loaded from its
// file unchanged, with the figures the README states for it.
var readmeExamples = []struct {
	file    string
	steps   []step
	metrics map[string]float64 // "name{key1,key2}" → value after the steps
}{
	{file: "example1.yaml", steps: []step{
		// 500 requests a second per database.
		{[][]string{{"database", "users"}}, 500, ok, []int64{0}},
		{[][]string{{"database", "users"}}, 1, over, []int64{0}},
		{[][]string{{"database", "default"}}, 1, ok, []int64{499}},
		{[][]string{{"database", "other"}}, 1, ok, []int64{noLimit}},
	}},
	{file: "example2.yaml", steps: []step{
		// 5 marketing messages a day to one number, in the same request as
		// the 100 a day to any number: a logical OR of the two.
		{[][]string{{"message_type", "marketing", "to_number", "2061111111"}, {"to_number", "2061111111"}}, 5, ok, []int64{0, 95}},
		{[][]string{{"message_type", "marketing", "to_number", "2061111111"}, {"to_number", "2061111111"}}, 1, over, []int64{0, 95}},
		// Another number has its own 5.
		{[][]string{{"message_type", "marketing", "to_number", "2062222222"}}, 1, ok, []int64{4}},
		{[][]string{{"to_number", "2061111111"}}, 95, ok, []int64{0}},
		{[][]string{{"to_number", "2061111111"}}, 1, over, []int64{0}},
	}},
	{file: "example3.yaml", steps: []step{
		// 10 a second per address; 50.0.0.5 is blocked outright.
		{[][]string{{"remote_address", "50.0.0.1"}}, 10, ok, []int64{0}},
		{[][]string{{"remote_address", "50.0.0.1"}}, 1, over, []int64{0}},
		{[][]string{{"remote_address", "50.0.0.5"}}, 1, over, []int64{0}},
	}},
	{file: "example4.yaml", steps: []step{
		// Two entries never match a rule of one level.
		{[][]string{{"key", "value", "subkey", "subvalue"}}, 1, ok, []int64{noLimit}},
		{[][]string{{"key", "value"}}, 1, ok, []int64{299}},
	}},
	{file: "example4_nested.yaml", steps: []step{
		{[][]string{{"key", "value", "subkey", "subvalue"}}, 300, ok, []int64{0}},
		{[][]string{{"key", "value", "subkey", "subvalue"}}, 1, over, []int64{0}},
	}},
	{file: "example5.yaml", steps: []step{
		{[][]string{{"ldap", "x"}}, 3, ok, []int64{unlimited}},
		{[][]string{{"azure", "x"}}, 100, ok, []int64{0}},
		{[][]string{{"azure", "x"}}, 1, over, []int64{0}},
	}},
	{file: "example6.yaml", steps: []step{
		// user-a is in shadow mode: never limited, its breaches counted.
		{[][]string{{"service", "auth-service", "user", "user-a"}}, 15, ok, []int64{0}},
		{[][]string{{"service", "auth-service", "user", "user-b"}}, 20, ok, []int64{0}},
		{[][]string{{"service", "auth-service", "user", "user-b"}}, 1, over, []int64{0}},
	}, metrics: map[string]float64{
		"ratelimit_service_rate_limit_shadow_mode{service.user_user-a}": 5,
		"ratelimit_service_rate_limit_over_limit{service.user_user-a}":  5,
		"ratelimit_service_rate_limit_over_limit{service.user_user-b}":  1,
	}},
	{file: "example7.yaml", steps: []step{
		// Both rules match: the one that replaces applies, 10 a second,
		// and the replaced one is not counted.
		{[][]string{{"key_1", "value_1", "user", "bkthomps"}, {"key_2", "value_2", "user", "bkthomps"}}, 10, ok, []int64{noLimit, 0}},
		{[][]string{{"key_1", "value_1", "user", "bkthomps"}, {"key_2", "value_2", "user", "bkthomps"}}, 1, over, []int64{noLimit, 0}},
		{[][]string{{"key_1", "value_1", "user", "bkthomps"}}, 5, ok, []int64{0}},
		{[][]string{{"key_1", "value_1", "user", "bkthomps"}}, 1, over, []int64{0}},
	}},
	{file: "example8.yaml", steps: []step{
		{[][]string{{"key1", "unspecified_value"}}, 10, ok, []int64{0}},
		{[][]string{{"key1", "unspecified_value2"}}, 1, ok, []int64{9}},
		{[][]string{{"key1", "value1"}}, 20, ok, []int64{0}},
	}, metrics: map[string]float64{
		"ratelimit_service_rate_limit_total_hits{key1_unspecified_value}":  10,
		"ratelimit_service_rate_limit_total_hits{key1_unspecified_value2}": 1,
		"ratelimit_service_rate_limit_total_hits{key1_value1}":             20,
	}},
	{file: "example9.yaml", steps: []step{
		{[][]string{{"key1", "value1"}}, 20, ok, []int64{0}},
		{[][]string{{"key1", "value1"}}, 1, over, []int64{0}},
		{[][]string{{"key1", "value2"}}, 1, ok, []int64{19}},
		{[][]string{{"key1", "other"}}, 1, ok, []int64{noLimit}},
	}},
	{file: "example10.yaml", steps: []step{
		{[][]string{{"route", "api", "http_method", "GET", "subject_id", "123"}}, 60, ok, []int64{0}},
		{[][]string{{"route", "web", "http_method", "POST", "subject_id", "456"}}, 1, ok, []int64{59}},
	}, metrics: map[string]float64{
		"ratelimit_service_rate_limit_total_hits{route_api.http_method_GET.subject_id}":  60,
		"ratelimit_service_rate_limit_total_hits{route_web.http_method_POST.subject_id}": 1,
	}},
	{file: "example10_wildcard.yaml", steps: []step{
		{[][]string{{"user", "alice", "action", "readfile", "resource", "documents"}}, 100, ok, []int64{0}},
	}, metrics: map[string]float64{
		"ratelimit_service_rate_limit_total_hits{user_alice.action_readfile.resource}": 100,
	}},
	{file: "example11.yaml", steps: []step{
		// files/* share one threshold of 10 an hour.
		{[][]string{{"files", "files/a.pdf"}}, 5, ok, []int64{5}},
		{[][]string{{"files", "files/b.csv"}}, 5, ok, []int64{0}},
		{[][]string{{"files", "files/c.txt"}}, 1, over, []int64{0}},
		// files_no_share/* each have their own.
		{[][]string{{"files_no_share", "files_no_share/a.pdf"}}, 10, ok, []int64{0}},
		{[][]string{{"files_no_share", "files_no_share/b.csv"}}, 10, ok, []int64{0}},
	}},
	{file: "example11_metrics.yaml", steps: []step{
		{[][]string{{"route", "api/v1", "method", "GET"}}, 30, ok, []int64{30}},
		{[][]string{{"route", "api/v2", "method", "GET"}}, 30, ok, []int64{0}},
		{[][]string{{"route", "api/v3", "method", "GET"}}, 1, over, []int64{0}},
	}},
}

// transport sends a request over gRPC or /json.
type transport func(tb testing.TB, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse

// TestEnvoyReadmeExamples loads each configuration of envoy ratelimit's
// README unchanged and checks, on real Redis, over gRPC with
// go-control-plane's client and over /json, the figures the README states.
func TestEnvoyReadmeExamples(t *testing.T) {
	localserver.SkipIfShort(t)
	srv := localserver.RedisT(t, localserver.RedisOptions{})
	client := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	backend, err := redisbackend.New(client)
	require.NoError(t, err)
	for _, ex := range readmeExamples {
		data, err := os.ReadFile(filepath.Join("config", "testdata", "envoy-readme", ex.file))
		require.NoError(t, err)
		cfg, err := config.Parse([]config.File{{Name: ex.file, Data: data}})
		require.NoError(t, err, ex.file)
		domain := cfg.Domains()[0]
		for _, via := range []string{"grpc", "json"} {
			t.Run(ex.file+"/"+via, func(t *testing.T) {
				require.NoError(t, client.FlushAll(context.Background()).Err())
				reg := prometheus.NewRegistry()
				m, err := rls.NewMetrics(reg)
				require.NoError(t, err)
				f := newFixture(t, backend, cfg, rls.WithMetrics(m))
				send := transport(func(tb testing.TB, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
					resp, err := f.client.ShouldRateLimit(context.Background(), req)
					require.NoError(tb, err)
					return resp
				})
				if via == "json" {
					send = jsonTransport(t, f.srv)
				}
				for i, s := range ex.steps {
					req := &rlsv3.RateLimitRequest{Domain: domain}
					for _, kv := range s.descriptors {
						req.Descriptors = append(req.Descriptors, desc(kv...))
					}
					var resp *rlsv3.RateLimitResponse
					for n := range s.times {
						resp = send(t, req)
						require.Equal(t, s.overall, resp.OverallCode, "step %d, request %d of %d", i, n+1, s.times)
					}
					for j, want := range s.remaining {
						st := resp.Statuses[j]
						switch want {
						case noLimit:
							assert.Nil(t, st.CurrentLimit, "step %d descriptor %d", i, j)
							assert.Equal(t, ok, st.Code)
						case unlimited:
							assert.Equal(t, uint32(math.MaxUint32), st.LimitRemaining, "step %d descriptor %d", i, j)
							assert.Equal(t, ok, st.Code)
						default:
							assert.Equal(t, uint32(want), st.LimitRemaining, "step %d descriptor %d", i, j)
							require.NotNil(t, st.CurrentLimit, "step %d descriptor %d", i, j)
						}
					}
				}
				for series, want := range ex.metrics {
					assert.Equal(t, want, metricValue(t, reg, domain, series), series)
				}
			})
		}
	}
}

// jsonTransport posts requests to the server's /json handler over HTTP.
func jsonTransport(tb testing.TB, srv *rls.Server) transport {
	h := httptest.NewServer(srv.JSONHandler())
	tb.Cleanup(h.Close)
	return func(tb testing.TB, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
		body, err := protojson.Marshal(req)
		require.NoError(tb, err)
		r, err := http.Post(h.URL+"/json", "application/json", bytes.NewReader(body))
		require.NoError(tb, err)
		defer r.Body.Close()
		out, err := io.ReadAll(r.Body)
		require.NoError(tb, err)
		var resp rlsv3.RateLimitResponse
		require.NoError(tb, protojson.Unmarshal(out, &resp), "%d %s", r.StatusCode, out)
		wantStatus := http.StatusOK
		if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
			wantStatus = http.StatusTooManyRequests
		}
		assert.Equal(tb, wantStatus, r.StatusCode)
		return &resp
	}
}

// metricValue reads one counter: series is "name{key1.key2…}", the rule's
// statistics key after its domain.
func metricValue(tb testing.TB, reg *prometheus.Registry, domain, series string) float64 {
	tb.Helper()
	name, rest, _ := bytes.Cut([]byte(series), []byte("{"))
	key := string(bytes.TrimSuffix(rest, []byte("}")))
	mfs, err := reg.Gather()
	require.NoError(tb, err)
	for _, mf := range mfs {
		if mf.GetName() != string(name) {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			got := labels["key1"]
			if labels["key2"] != "" {
				got += "." + labels["key2"]
			}
			if labels["domain"] == domain && got == key {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
