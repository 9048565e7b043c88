package unleashflag

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Unleash/unleash-client-go/v4"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// testFeature is the toggle the tests' flag server serves. Its group ID is
// the feature name, as the Unleash UI fills it in.
const testFeature = "ratelimit-new-backend"

// refreshInterval is the Unleash client's refresh interval in these tests.
const refreshInterval = 50 * time.Millisecond

// t0 is the start of every manual-clock timeline.
var t0 = time.Date(2030, 1, 2, 3, 4, 0, 0, time.UTC)

// flagServer answers /api/client/features the way an Unleash server does:
// version 2 JSON with the rollout as a string, an ETag, and 304 Not Modified
// for a matching If-None-Match. It also accepts the client's registration
// and metrics.
type flagServer struct {
	srv *httptest.Server

	mu         sync.Mutex
	version    int
	present    bool
	enabled    bool
	rollout    string
	groupID    string
	stickiness string
	extra      map[string]any // merged into the strategy, e.g. constraints
	failing    bool           // answer 503 to feature fetches

	fetches     atomic.Int64 // feature requests answered 200
	notModified atomic.Int64 // feature requests answered 304
	registers   atomic.Int64
	metrics     atomic.Int64
}

func newFlagServer(t testing.TB, percent int) *flagServer {
	t.Helper()
	f := &flagServer{version: 1, present: true, enabled: true, rollout: strconv.Itoa(percent),
		groupID: testFeature, stickiness: "userId"}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serveHTTP))
	t.Cleanup(f.srv.Close)
	return f
}

// change edits the toggle under the lock and bumps the version (the ETag).
func (f *flagServer) change(edit func(f *flagServer)) {
	f.mu.Lock()
	edit(f)
	f.version++
	f.mu.Unlock()
}

func (f *flagServer) setPercent(p int) { f.change(func(f *flagServer) { f.rollout = strconv.Itoa(p) }) }

func (f *flagServer) serveHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/api/client/features":
		f.serveFeatures(w, r)
	case r.Method == http.MethodPost && r.URL.Path == "/api/client/register":
		f.registers.Add(1)
		w.WriteHeader(http.StatusAccepted)
	case r.Method == http.MethodPost && r.URL.Path == "/api/client/metrics":
		f.metrics.Add(1)
		w.WriteHeader(http.StatusAccepted)
	default:
		http.NotFound(w, r)
	}
}

func (f *flagServer) serveFeatures(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failing {
		http.Error(w, "unavailable", http.StatusServiceUnavailable)
		return
	}
	etag := fmt.Sprintf(`"v%d"`, f.version)
	if r.Header.Get("If-None-Match") == etag {
		f.notModified.Add(1)
		w.WriteHeader(http.StatusNotModified)
		return
	}
	strategy := map[string]any{
		"name":        "flexibleRollout",
		"constraints": []any{},
		"parameters": map[string]any{
			"rollout":    f.rollout,
			"stickiness": f.stickiness,
			"groupId":    f.groupID,
		},
	}
	for k, v := range f.extra {
		strategy[k] = v
	}
	features := []any{map[string]any{"name": "unrelated-toggle", "enabled": true, "strategies": []any{}}}
	if f.present {
		features = append(features, map[string]any{
			"name":       testFeature,
			"type":       "release",
			"enabled":    f.enabled,
			"strategies": []any{strategy},
		})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("ETag", etag)
	f.fetches.Add(1)
	_ = json.NewEncoder(w).Encode(map[string]any{"version": 2, "features": features})
}

// newTestSource starts a Source against f, and closes it when the test
// ends.
func newTestSource(t testing.TB, f *flagServer, opts ...Option) *Source {
	t.Helper()
	opts = append([]Option{WithServer(f.srv.URL+"/api/", "rollout-test"), WithClientOptions(
		unleash.WithInstanceId("rollout-test-1"),
		unleash.WithRefreshInterval(refreshInterval),
	)}, opts...)
	src, err := New(testFeature, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close() })
	return src
}

// waitFor polls cond until it holds or the deadline passes; the deadline is
// only there so that a broken build fails instead of hanging.
func waitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// waitPercent waits until src publishes a split of percent.
func waitPercent(t testing.TB, src rollout.FlagSource, percent int) *rollout.Split {
	t.Helper()
	var sp *rollout.Split
	waitFor(t, fmt.Sprintf("split of %d%%", percent), func() bool {
		sp = src.Split()
		return sp != nil && !sp.Killed() && sp.Percent() == percent
	})
	return sp
}

func mustPolicy(t testing.TB, name, limits string) *throttler.Policy {
	t.Helper()
	p, err := throttler.ParsePolicy(name, limits)
	require.NoError(t, err)
	return p
}

func mustRollout(t testing.TB, oldB, newB driver.Backend, src rollout.FlagSource, opts ...rollout.Option) *rollout.Backend {
	t.Helper()
	b, err := rollout.New(oldB, newB, src, opts...)
	require.NoError(t, err)
	return b
}

// view is a throttler over one backend, for reading what that backend holds.
type view struct {
	th *throttler.Throttler
	p  *throttler.Policy
}

func newView(b driver.Backend, clock throttler.Clock, p *throttler.Policy) view {
	th, err := throttler.New(b, throttler.WithClock(clock), throttler.WithLogger(nil))
	if err != nil {
		panic(err) // the tests pass valid backends and options
	}
	return view{th: th, p: p}
}

func (v view) peek(t testing.TB, id string) throttler.Result {
	t.Helper()
	r, err := v.th.Peek(context.Background(), v.p, id)
	require.NoError(t, err)
	require.False(t, r.Degraded, "peek degraded: %v", r.Err)
	return r
}

func ids(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "user:" + strconv.Itoa(i)
	}
	return out
}
