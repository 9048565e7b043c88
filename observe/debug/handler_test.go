package debugpage_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/breaker"
	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
	debugpage "github.com/throttlekit/throttlekit/observe/debug"
	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// down is a backend whose store refuses connections.
type down struct{}

var errRefused = fmt.Errorf("dial tcp 192.0.2.9:6379: %w", syscall.ECONNREFUSED)

func (down) Decide(context.Context, driver.Request) (driver.Outcome, error) {
	return driver.Outcome{}, errRefused
}

func (down) Ping(context.Context) error { return errRefused }

// fakeSource is a flag source with a fixed split that says when its server
// last answered and fails its pings.
type fakeSource struct {
	split     *rollout.Split
	lastFetch time.Time
}

func (s fakeSource) Split() *rollout.Split      { return s.split }
func (s fakeSource) LastFetch() time.Time       { return s.lastFetch }
func (s fakeSource) Ping(context.Context) error { return errors.New("unleash: HTTP 503") }

func get(t *testing.T, srv *httptest.Server, query string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Get(srv.URL + query)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(body)
}

func allow(t *testing.T, th *throttler.Throttler, p *throttler.Policy, id string, n int) {
	t.Helper()
	for range n {
		_, err := th.Allow(context.Background(), p, id)
		require.NoError(t, err)
	}
}

// TestPage: every section, in JSON and in HTML, after known traffic
// through real throttlers.
func TestPage(t *testing.T) {
	ctx := context.Background()
	clock, withClock := testkit.Clock()
	mem := memorybackend.New()
	guarded, err := breaker.Wrap(down{}, "192.0.2.9:6379", breaker.WithFailures(2), breaker.WithFailingFor(0), breaker.WithLogger(nil))
	require.NoError(t, err)
	set, err := breaker.NewSet(breaker.WithFailures(3), breaker.WithFailingFor(0), breaker.WithLogger(nil))
	require.NoError(t, err)
	for range 3 { // three failures open the breaker of 10.0.0.1
		done, err := set.For("10.0.0.1:11211").Allow()
		require.NoError(t, err)
		done(errors.New("i/o timeout"))
	}
	done, err := set.For("10.0.0.2:11211").Allow()
	require.NoError(t, err)
	done(nil)

	src, err := rollout.NewStaticSource(30, rollout.WithStaticGroupID("sessions-2030"))
	require.NoError(t, err)
	ro, err := rollout.New(memorybackend.New(), memorybackend.New(), src, rollout.WithMode(rollout.MirrorMode))
	require.NoError(t, err)
	killed, err := rollout.New(memorybackend.New(), memorybackend.New(),
		fakeSource{split: rollout.KillSwitch("search-2030"), lastFetch: testkit.T0.Add(-90 * time.Second)})
	require.NoError(t, err)

	api := testkit.Policy(t, "api", "3/min, 100/h")
	search := testkit.Policy(t, "search", "10/s gcra burst=20")
	uploads, err := throttler.NewConcurrencyLimit("uploads", 1, time.Minute)
	require.NoError(t, err)

	page, err := debugpage.New(
		debugpage.WithBackend("memory", mem),
		debugpage.WithBackend("down", down{}),
		debugpage.WithBackend("cache", guarded),
		debugpage.WithBreakerSet("memcached", set),
		debugpage.WithSourceStatus("search", func() debugpage.SourceStatus {
			return debugpage.SourceStatus{LastUpdate: testkit.T0.Add(-time.Hour), Errors: 3, LastError: errors.New("HTTP 503")}
		}),
		debugpage.WithRollout("sessions", ro),
		debugpage.WithRollout("search", killed),
		debugpage.WithPolicies(api, search),
		debugpage.WithClock(clock))
	require.NoError(t, err)
	obs := throttler.WithObserver(page.Observer())
	th := testkit.Throttler(t, mem, withClock, obs)
	cached := testkit.Throttler(t, mem, withClock, obs, throttler.WithDenyCache(100, time.Minute))
	failOpen := testkit.Throttler(t, guarded, withClock, obs, throttler.WithLogger(nil))
	failClosed := testkit.Throttler(t, down{}, withClock, obs, throttler.WithLogger(nil),
		throttler.WithFailureMode(throttler.FailClosed))
	routed := testkit.Throttler(t, ro, withClock, obs)

	// Denied by the store: abuser 20, pest 10, nuisance 5, once 1, the
	// markup 1; alice never.
	for _, tr := range []struct {
		id string
		n  int
	}{{"abuser", 23}, {"pest", 13}, {"nuisance", 8}, {"once", 4}, {"alice", 3}, {"<b>x</b>", 4}} {
		allow(t, th, api, tr.id, tr.n)
	}
	// scraper: 20 allowed, 1 denied by the store, then 4 by the deny cache.
	allow(t, cached, search, "scraper", 25)
	// bulk: one lease held, the second refused.
	_, err = th.Acquire(ctx, uploads, "bulk")
	require.NoError(t, err)
	lease, err := th.Acquire(ctx, uploads, "bulk")
	require.NoError(t, err)
	require.False(t, lease.Acquired)
	// Degraded decisions: fail open allows bob (and opens the breaker
	// after 2 failures), fail closed denies victim; neither is counted.
	allow(t, failOpen, api, "bob", 3)
	allow(t, failClosed, api, "victim", 5)
	for i := range 5 {
		allow(t, routed, api, fmt.Sprint("user-", i), 1)
	}

	srv := httptest.NewServer(page)
	defer srv.Close()
	resp, body := get(t, srv, "/?format=json")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	assert.Equal(t, "no-store", resp.Header.Get("Cache-Control"))
	var p debugpage.Page
	require.NoError(t, json.Unmarshal([]byte(body), &p))

	assert.Equal(t, testkit.T0, p.GeneratedAt)
	require.Len(t, p.Backends, 3)
	assert.Equal(t, debugpage.Backend{Name: "memory", Kind: "*memorybackend.Backend", Pinged: true, Healthy: true,
		PingMs: p.Backends[0].PingMs}, p.Backends[0])
	assert.Less(t, p.Backends[0].PingMs, 1000.0)
	assert.Equal(t, "down", p.Backends[1].Name)
	assert.True(t, p.Backends[1].Pinged)
	assert.False(t, p.Backends[1].Healthy)
	assert.Equal(t, errRefused.Error(), p.Backends[1].Error)
	assert.Equal(t, "unreachable", p.Backends[1].ErrorKind)
	assert.Equal(t, "cache", p.Backends[2].Name)
	assert.False(t, p.Backends[2].Healthy)
	assert.Contains(t, p.Backends[2].Error, "circuit breaker open", "the ping met the open breaker")
	assert.Equal(t, "breaker_open", p.Backends[2].ErrorKind)

	assert.Equal(t, []debugpage.Breaker{
		{Source: "cache", Server: "192.0.2.9:6379", State: "open", Rejected: 2}, // bob's third request, the ping
		{Source: "memcached", Server: "10.0.0.1:11211", State: "open", Rejected: 0},
		{Source: "memcached", Server: "10.0.0.2:11211", State: "closed", Rejected: 0},
	}, p.Breakers)

	require.Len(t, p.Rollouts, 2)
	r := p.Rollouts[0]
	assert.Equal(t, "sessions", r.Name)
	assert.Equal(t, "mirror", r.Mode)
	assert.True(t, r.HasSplit)
	assert.Equal(t, "30% new (group sessions-2030)", r.Split)
	assert.Equal(t, 30, r.PercentNew)
	assert.Equal(t, "sessions-2030", r.GroupID)
	assert.False(t, r.Killed)
	assert.EqualValues(t, 5, r.Stats.Mirrored)
	assert.Equal(t, debugpage.Source{Kind: "*rollout.StaticSource", Healthy: true}, r.Source,
		"a static source is not pinged and fetches nothing")
	r = p.Rollouts[1]
	assert.Equal(t, "search", r.Name)
	assert.Equal(t, "split", r.Mode)
	assert.True(t, r.Killed)
	assert.Equal(t, 0, r.PercentNew)
	assert.Equal(t, "search-2030", r.GroupID)
	require.NotNil(t, r.Source.LastFetch)
	assert.Equal(t, testkit.T0.Add(-90*time.Second), *r.Source.LastFetch)
	require.NotNil(t, r.Source.FetchAgeSeconds)
	assert.InDelta(t, 90, *r.Source.FetchAgeSeconds, 1e-9)
	require.NotNil(t, r.Source.LastUpdate)
	assert.Equal(t, testkit.T0.Add(-time.Hour), *r.Source.LastUpdate)
	assert.True(t, r.Source.Pinged)
	assert.False(t, r.Source.Healthy)
	assert.Equal(t, "unleash: HTTP 503", r.Source.Error)
	assert.EqualValues(t, 3, r.Source.Errors)
	assert.Equal(t, "HTTP 503", r.Source.LastError)

	require.Len(t, p.Policies, 2)
	assert.Equal(t, debugpage.Policy{Name: "api", Spec: api.String(), Limits: []debugpage.Limit{
		{Name: "3/min", Spec: "3/min", Algorithm: "fixed", Max: 3, Window: "1m0s"},
		{Name: "100/h", Spec: "100/h", Algorithm: "fixed", Max: 100, Window: "1h0m0s"},
	}}, p.Policies[0])
	assert.Equal(t, debugpage.Limit{Name: "10/s gcra burst=20", Spec: "10/s gcra burst=20", Algorithm: "gcra", Max: 10,
		Window: "1s", Burst: 20}, p.Policies[1].Limits[0])

	td := p.TopDenied
	assert.Equal(t, debugpage.DefaultTopK, td.K)
	assert.Equal(t, testkit.T0, td.Since)
	assert.EqualValues(t, 20+10+5+1+1+5+1, td.Denials)
	assert.Equal(t, map[string]uint64{"denied": 39, "cached": 4, "local_denied": 0}, td.ByOutcome)
	assert.Equal(t, 7, td.Tracked)
	assert.Equal(t, []debugpage.Denied{ // exact: fewer identifiers than counters
		{Policy: "api", Identifier: "abuser", Count: 20},
		{Policy: "api", Identifier: "pest", Count: 10},
		{Policy: "api", Identifier: "nuisance", Count: 5},
		{Policy: "search", Identifier: "scraper", Count: 5},
		{Policy: "api", Identifier: "<b>x</b>", Count: 1},
		{Policy: "uploads", Identifier: "bulk", Count: 1},
		{Policy: "api", Identifier: "once", Count: 1},
	}, td.Heaviest)

	resp, body = get(t, srv, "/")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/html; charset=utf-8", resp.Header.Get("Content-Type"))
	for _, s := range []string{"<h2>Backends</h2>", "<h2>Circuit breakers</h2>", "<h2>Rollouts</h2>", "<h2>Policies</h2>",
		"<h2>Heaviest denied identifiers</h2>", "*memorybackend.Backend", "unreachable: " + errRefused.Error(),
		"10.0.0.1:11211", "30% new (group sessions-2030)", "off: 0% new (kill switch)", "(1m30s ago)", "last: HTTP 503",
		"10/s gcra burst=20", "<td>abuser</td><td class=\"num\">20</td>", "&lt;b&gt;x&lt;/b&gt;", "cached 4"} {
		assert.Contains(t, body, s)
	}
	assert.NotContains(t, body, "<b>x</b>", "identifiers are escaped")
	assert.NotContains(t, body, "alice", "an identifier never denied is not shown")
	assert.NotContains(t, body, "victim", "a degraded denial is not counted")

	page.ResetDenied()
	clock.Advance(time.Minute)
	snap := page.Snapshot(ctx)
	assert.Empty(t, snap.TopDenied.Heaviest)
	assert.Zero(t, snap.TopDenied.Denials)
	assert.Equal(t, testkit.T0, snap.TopDenied.Since, "reset at the clock's reading then")
	assert.Equal(t, "1m0s", snap.Uptime)
}

// TestJSONSchema: the field names the package documents, and [] rather
// than null for empty lists.
func TestJSONSchema(t *testing.T) {
	page, err := debugpage.New()
	require.NoError(t, err)
	srv := httptest.NewServer(page)
	defer srv.Close()
	_, body := get(t, srv, "/?format=json")
	var raw map[string]json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(body), &raw))
	assert.Equal(t, []string{"backends", "breakers", "generated_at", "policies", "rollouts", "top_denied", "uptime"}, keys(raw))
	for _, k := range []string{"backends", "breakers", "policies", "rollouts"} {
		assert.Equal(t, "[]", string(raw[k]), k)
	}
	var top map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(raw["top_denied"], &top))
	assert.Equal(t, []string{"by_outcome", "denials", "heaviest", "k", "since", "tracked"}, keys(top))
	assert.Equal(t, "[]", string(top["heaviest"]))

	b, err := json.Marshal(debugpage.Rollout{Name: "x", Source: debugpage.Source{}, Stats: debugpage.RolloutStats{}})
	require.NoError(t, err)
	var rr map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(b, &rr))
	assert.Equal(t, []string{"has_split", "killed", "mode", "name", "percent_new", "source", "split", "stats"}, keys(rr))
	var stats map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(rr["stats"], &stats))
	assert.Equal(t, []string{"default_routed", "mirror_diverged", "mirror_shortfall_units", "mirror_shortfalls", "mirrored", "mismatches_by_kind",
		"secondary_errors", "seed_checks", "seeded", "shadow_compared", "shadow_mismatches"}, keys(stats))
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// hung is a backend whose ping ignores its context until released.
type hung struct{ release chan struct{} }

func (hung) Decide(context.Context, driver.Request) (driver.Outcome, error) {
	return driver.Outcome{}, nil
}
func (h hung) Ping(context.Context) error { <-h.release; return nil }

// panicky is a backend whose ping panics.
type panicky struct{}

func (panicky) Decide(context.Context, driver.Request) (driver.Outcome, error) {
	return driver.Outcome{}, nil
}
func (panicky) Ping(context.Context) error { panic("boom") }

// TestPingTimeout: a ping that ignores its context does not hold the page
// beyond the ping timeout, and a ping that panics is an error, not a crash.
func TestPingTimeout(t *testing.T) {
	h := hung{make(chan struct{})}
	defer close(h.release)
	page, err := debugpage.New(
		debugpage.WithBackend("hung", h),
		debugpage.WithBackend("panicky", panicky{}),
		debugpage.WithBackend("memory", memorybackend.New()),
		debugpage.WithPingTimeout(50*time.Millisecond))
	require.NoError(t, err)
	start := time.Now()
	p := page.Snapshot(context.Background())
	assert.Less(t, time.Since(start), 2*time.Second)
	require.Len(t, p.Backends, 3)
	assert.False(t, p.Backends[0].Healthy)
	assert.Contains(t, p.Backends[0].Error, "no answer to ping within 50ms")
	assert.Equal(t, "timeout", p.Backends[0].ErrorKind)
	assert.GreaterOrEqual(t, p.Backends[0].PingMs, 50.0)
	assert.False(t, p.Backends[1].Healthy)
	assert.Contains(t, p.Backends[1].Error, "ping panicked: boom")
	assert.True(t, p.Backends[2].Healthy)
}

// TestRequests: methods and formats.
func TestRequests(t *testing.T) {
	page, err := debugpage.New()
	require.NoError(t, err)
	srv := httptest.NewServer(page)
	defer srv.Close()
	resp, _ := get(t, srv, "/?format=xml")
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	resp, body := get(t, srv, "/?format=html")
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, body, "no denials yet")
	resp, err = http.Post(srv.URL, "text/plain", strings.NewReader("x"))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	assert.Equal(t, "GET, HEAD", resp.Header.Get("Allow"))
	resp, err = http.Head(srv.URL)
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}

func TestBadOptions(t *testing.T) {
	for name, opt := range map[string]debugpage.Option{
		"nil backend":          debugpage.WithBackend("x", nil),
		"typed nil backend":    debugpage.WithBackend("x", (*memorybackend.Backend)(nil)),
		"unnamed backend":      debugpage.WithBackend("", memorybackend.New()),
		"nil rollout":          debugpage.WithRollout("x", nil),
		"nil policy":           debugpage.WithPolicies(nil),
		"zero policy":          debugpage.WithPolicies(&throttler.Policy{}),
		"top 0":                debugpage.WithTopK(0),
		"top too many":         debugpage.WithTopK(debugpage.MaxTopK + 1),
		"ping timeout 0":       debugpage.WithPingTimeout(0),
		"nil breakers":         debugpage.WithBreakers("x", nil),
		"nil breaker set":      debugpage.WithBreakerSet("x", nil),
		"nil status":           debugpage.WithSourceStatus("x", nil),
		"status of no rollout": debugpage.WithSourceStatus("x", func() debugpage.SourceStatus { return debugpage.SourceStatus{} }),
		"nil clock":            debugpage.WithClock(nil),
		"nil option":           nil,
	} {
		h, err := debugpage.New(opt)
		assert.ErrorIs(t, err, throttler.ErrInvalidOption, name)
		assert.Nil(t, h, name)
	}
}

// TestMisuse: a zero breaker.Backend, a nil context and a Handler not made
// by New give a page, not a panic.
func TestMisuse(t *testing.T) {
	page, err := debugpage.New(debugpage.WithBackend("zero", &breaker.Backend{}))
	require.NoError(t, err)
	//lint:ignore SA1012 a nil context is the point
	p := page.Snapshot(nil)
	require.Len(t, p.Backends, 1)
	assert.False(t, p.Backends[0].Healthy)
	require.Len(t, p.Breakers, 1)
	assert.Equal(t, "unknown", p.Breakers[0].State)

	var zero *debugpage.Handler
	assert.Empty(t, zero.Snapshot(context.Background()).Backends)
	zero.Observer().Observe(context.Background(), throttler.Event{Op: "allow", Result: throttler.Result{At: testkit.T0}})
	zero.ResetDenied()
	rec := httptest.NewRecorder()
	zero.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/?format=json", nil))
	assert.Equal(t, http.StatusOK, rec.Code)
	assert.Contains(t, rec.Body.String(), `"heaviest": []`)
	(&debugpage.Handler{}).Observer().Observe(context.Background(), throttler.Event{Op: "allow", Result: throttler.Result{At: testkit.T0}})
}
