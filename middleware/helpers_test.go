package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/middleware"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// t0 has a fractional second so that every rounding rule shows.
var t0 = time.UnixMilli(1_700_000_000_250)

// decisions records every allow decision the throttler makes, so a test
// can check each response against the decision that produced it.
type decisions struct {
	mu      sync.Mutex
	results []throttler.Result
}

func (d *decisions) Observe(_ context.Context, e throttler.Event) {
	if e.Op != "allow" || !e.HasResult() {
		return
	}
	d.mu.Lock()
	d.results = append(d.results, e.Result)
	d.mu.Unlock()
}

func (d *decisions) last(t *testing.T) throttler.Result {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	require.NotEmpty(t, d.results, "no decision was made")
	return d.results[len(d.results)-1]
}

// rig is one throttler on the memory backend with a manual clock.
type rig struct {
	clock     *throttlertest.ManualClock
	backend   driver.Backend
	th        *throttler.Throttler
	decisions *decisions
}

func newRig(t *testing.T, b driver.Backend) *rig {
	t.Helper()
	if b == nil {
		b = memorybackend.New()
	}
	r := &rig{clock: throttlertest.NewManualClock(t0), backend: b, decisions: &decisions{}}
	r.th = testkit.Throttler(t, b, throttler.WithClock(r.clock), throttler.WithObserver(r.decisions))
	return r
}

func policy(t *testing.T, name, limits string, opts ...throttler.Option) *throttler.Policy {
	t.Helper()
	p, err := throttler.ParsePolicy(name, limits, opts...)
	require.NoError(t, err)
	return p
}

// statusHandler answers the status named by the "status" query parameter
// (200 by default) and echoes the identifier that let the request in.
var statusHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	code := http.StatusOK
	if s := r.URL.Query().Get("status"); s != "" {
		code, _ = strconv.Atoi(s)
	}
	w.WriteHeader(code)
	if res, ok := middleware.ResultFromContext(r.Context()); ok && code != http.StatusNotModified {
		fmt.Fprint(w, res.Identifier)
	}
})

// serve starts a loopback server running lim around h.
func serve(t *testing.T, lim *middleware.Limiter, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(lim.Handler(h))
	t.Cleanup(srv.Close)
	return srv
}

// serveHandler starts a loopback server running h.
func serveHandler(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

type reply struct {
	status int
	header http.Header
	body   string
}

// get sends one request and reads the whole reply; extra holds header
// name/value pairs.
func get(t *testing.T, srv *httptest.Server, path string, extra ...string) reply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+path, nil)
	require.NoError(t, err)
	for i := 0; i+1 < len(extra); i += 2 {
		req.Header.Add(extra[i], extra[i+1])
	}
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return reply{status: resp.StatusCode, header: resp.Header, body: string(body)}
}

// rateLimitItem is one parsed member of the IETF RateLimit field.
type rateLimitItem struct {
	name       string
	remaining  int64
	reset      int64
	hasReset   bool
	wellFormed bool
}

var rateLimitRE = regexp.MustCompile(`^"((?:[^"\\]|\\.)*)";r=(\d{1,15})(?:;t=(\d{1,15}))?$`)

// parseRateLimit reads a RateLimit field of exactly one member, as the
// Limiter sends it.
func parseRateLimit(v string) rateLimitItem {
	m := rateLimitRE.FindStringSubmatch(v)
	if m == nil {
		return rateLimitItem{}
	}
	it := rateLimitItem{name: m[1], wellFormed: true}
	it.remaining, _ = strconv.ParseInt(m[2], 10, 64)
	if m[3] != "" {
		it.reset, _ = strconv.ParseInt(m[3], 10, 64)
		it.hasReset = true
	}
	return it
}

func headerInt(t *testing.T, h http.Header, name string) int64 {
	t.Helper()
	v := h.Get(name)
	require.NotEmpty(t, v, "header %s missing", name)
	n, err := strconv.ParseInt(v, 10, 64)
	require.NoError(t, err, "header %s = %q", name, v)
	return n
}

// failingBackend fails every call, as an unreachable store does: the one
// fault a test cannot get from the memory backend on demand.
type failingBackend struct{}

var errStoreDown = errors.New("store unreachable")

func (failingBackend) Decide(context.Context, driver.Request) (driver.Outcome, error) {
	return driver.Outcome{}, errStoreDown
}
