package debugpage_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"

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

// unreachable is a backend whose store refuses connections.
type unreachable struct{}

func (unreachable) Decide(context.Context, driver.Request) (driver.Outcome, error) {
	return driver.Outcome{}, syscall.ECONNREFUSED
}

func (unreachable) Ping(context.Context) error {
	return errors.New("dial tcp 10.0.0.9:6379: connection refused")
}

func get(t *testing.T, srv *httptest.Server, query string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Get(srv.URL + query)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(body)
}

// TestPage: every section, in HTML and in JSON, after known traffic.
func TestPage(t *testing.T) {
	ctx := context.Background()
	_, clock := testkit.Clock()
	mem := memorybackend.New()
	guarded, err := breaker.Wrap(unreachable{}, "10.0.0.9:6379", breaker.WithFailures(2), breaker.WithLogger(nil))
	require.NoError(t, err)
	src, err := rollout.NewStaticSource(30, rollout.WithStaticGroupID("sessions-2030"))
	require.NoError(t, err)
	ro, err := rollout.New(memorybackend.New(), memorybackend.New(), src, rollout.WithMode(rollout.MirrorMode))
	require.NoError(t, err)
	api := testkit.Policy(t, "api", "3/min, 100/h")
	search := testkit.Policy(t, "search", "10/s gcra burst=20")

	page, err := debugpage.New(
		debugpage.WithBackend("memory", mem),
		debugpage.WithBackend("cache", guarded),
		debugpage.WithRollout("sessions", ro),
		debugpage.WithPolicies(api, search),
		debugpage.WithTopK(3))
	require.NoError(t, err)
	obs := throttler.WithObserver(page.Observer())
	th := testkit.Throttler(t, mem, clock, obs)
	broken := testkit.Throttler(t, guarded, clock, obs, throttler.WithLogger(nil))
	routed := testkit.Throttler(t, ro, clock, obs)

	// Denials: abuser 20, pest 10, nuisance 5, once 1; alice allowed only.
	for id, n := range map[string]int{"abuser": 23, "pest": 13, "nuisance": 8, "once": 4, "alice": 3} {
		for range n {
			_, err := th.Allow(ctx, api, id)
			require.NoError(t, err)
		}
	}
	for range 3 {
		_, err := broken.Allow(ctx, api, "bob") // opens the breaker after 2
		require.NoError(t, err)
	}
	for i := range 5 {
		_, err := routed.Allow(ctx, api, fmt.Sprint("user-", i))
		require.NoError(t, err)
	}

	srv := httptest.NewServer(page)
	defer srv.Close()
	resp, body := get(t, srv, "/?format=json")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	var p debugpage.Page
	require.NoError(t, json.Unmarshal([]byte(body), &p))

	require.Len(t, p.Backends, 2)
	assert.Equal(t, "memory", p.Backends[0].Name)
	assert.True(t, p.Backends[0].Healthy && p.Backends[0].Pinged)
	assert.Equal(t, "cache", p.Backends[1].Name)
	assert.False(t, p.Backends[1].Healthy)
	assert.Contains(t, p.Backends[1].Error, "circuit breaker open", "the ping met the open breaker")

	require.Len(t, p.Breakers, 1)
	assert.Equal(t, debugpage.Breaker{Source: "cache", Server: "10.0.0.9:6379", State: "open", Rejected: 2}, p.Breakers[0])

	require.Len(t, p.Rollouts, 1)
	r := p.Rollouts[0]
	assert.Equal(t, "sessions", r.Name)
	assert.Equal(t, "mirror", r.Mode)
	assert.Equal(t, 30, r.PercentNew)
	assert.Equal(t, "sessions-2030", r.GroupID)
	assert.False(t, r.Killed)
	assert.EqualValues(t, 5, r.Stats.Mirrored)
	assert.Equal(t, "ok", r.SourceHealth)
	assert.Nil(t, r.LastFetch, "a static source fetches nothing")

	require.Len(t, p.Policies, 2)
	assert.Equal(t, "api", p.Policies[0].Name)
	assert.Equal(t, []debugpage.Limit{
		{Name: "3/min", Algorithm: "fixed", Max: 3, Window: "1m0s"},
		{Name: "100/h", Algorithm: "fixed", Max: 100, Window: "1h0m0s"},
	}, p.Policies[0].Limits)
	assert.Equal(t, debugpage.Limit{Name: "10/s gcra burst=20", Algorithm: "gcra", Max: 10, Window: "1s", Burst: 20}, p.Policies[1].Limits[0])

	assert.Equal(t, 3, p.TopDenied.K)
	assert.EqualValues(t, 20+10+5+1, p.TopDenied.Denials)
	require.Len(t, p.TopDenied.Heaviest, 3)
	for i, want := range []debugpage.Denied{
		{Policy: "api", Identifier: "abuser", Count: 20},
		{Policy: "api", Identifier: "pest", Count: 10},
		{Policy: "api", Identifier: "nuisance", Count: 5},
	} {
		got := p.TopDenied.Heaviest[i]
		assert.Equal(t, want.Identifier, got.Identifier, "rank %d", i+1)
		assert.LessOrEqual(t, got.Count-got.Err, want.Count, "rank %d: the true count lies in [Count-Err, Count]", i+1)
		assert.GreaterOrEqual(t, got.Count, want.Count, "rank %d", i+1)
	}

	resp, body = get(t, srv, "/")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "text/html; charset=utf-8", resp.Header.Get("Content-Type"))
	for _, s := range []string{"<h2>Backends</h2>", "<h2>Circuit breakers</h2>", "<h2>Rollouts</h2>", "<h2>Policies</h2>",
		"<h2>Heaviest denied identifiers</h2>", "10.0.0.9:6379", "abuser", "30% new (group sessions-2030)", "10/s gcra burst=20"} {
		assert.Contains(t, body, s)
	}
	assert.NotContains(t, body, "alice", "an identifier never denied is not shown")

	resp, _ = get(t, srv, "/?format=xml")
	assert.Equal(t, http.StatusBadRequest, resp.StatusCode)
	resp, err = http.Post(srv.URL, "text/plain", strings.NewReader("x"))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
}

func TestBadOptions(t *testing.T) {
	for name, opt := range map[string]debugpage.Option{
		"nil backend":    debugpage.WithBackend("x", nil),
		"unnamed":        debugpage.WithBackend("", memorybackend.New()),
		"nil rollout":    debugpage.WithRollout("x", nil),
		"nil policy":     debugpage.WithPolicies(nil),
		"top 0":          debugpage.WithTopK(0),
		"ping timeout 0": debugpage.WithPingTimeout(0),
		"nil breakers":   debugpage.WithBreakers("x", nil),
		"nil option":     nil,
	} {
		_, err := debugpage.New(opt)
		assert.ErrorIs(t, err, throttler.ErrInvalidOption, name)
	}
}
