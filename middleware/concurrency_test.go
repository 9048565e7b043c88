package middleware_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/middleware"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

func concurrencyLimit(t *testing.T, name string, max int64, opts ...throttler.Option) *throttler.ConcurrencyLimit {
	t.Helper()
	l, err := throttler.NewConcurrencyLimit(name, max, time.Minute, opts...)
	require.NoError(t, err)
	return l
}

// gate is a handler that holds every request until released, and says
// when each has arrived.
type gate struct {
	arrived chan struct{}
	release chan struct{}
}

func newGate() *gate { return &gate{arrived: make(chan struct{}, 16), release: make(chan struct{})} }

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	g.arrived <- struct{}{}
	<-g.release
	w.WriteHeader(http.StatusOK)
}

// Two slow requests of one client with a limit of one in flight: the
// second is refused with 429, a Retry-After and the concurrency problem,
// and costs no rate quota; once the first has finished, the next is served.
func TestConcurrencyRefusesSecondInFlight(t *testing.T) {
	rg := newRig(t, nil)
	p := policy(t, "api", "10/h")
	ip := middleware.ClientIP(middleware.ClientIPOptions{})
	lim, err := middleware.New(rg.th, []middleware.Rule{{Policy: p, Identify: ip}},
		middleware.WithConcurrency(concurrencyLimit(t, "in-flight", 1), ip))
	require.NoError(t, err)
	g := newGate()
	srv := serve(t, lim, g)

	first := make(chan reply, 1)
	go func() { first <- get(t, srv, "/") }()
	<-g.arrived

	rp := get(t, srv, "/")
	assert.Equal(t, http.StatusTooManyRequests, rp.status)
	assert.Equal(t, "60", rp.header.Get(middleware.HeaderRetryAfter), "until the held lease expires")
	prob := decodeProblem(t, rp)
	assert.Equal(t, middleware.TypeConcurrencyExceeded, prob.Type)
	assert.Contains(t, prob.Detail, `"in-flight"`)
	assert.NotContains(t, rp.body, "127.0.0.1", "the identifier stays on the server")

	close(g.release)
	assert.Equal(t, http.StatusOK, (<-first).status)
	assert.Equal(t, http.StatusOK, get(t, srv, "/").status, "the first request's lease was released")

	r, err := rg.th.Peek(context.Background(), p, "127.0.0.1")
	require.NoError(t, err)
	assert.Equal(t, int64(2), r.Used, "the refused request's unit was given back")
}

// A handler that panics still releases its lease.
func TestConcurrencyReleasedOnPanic(t *testing.T) {
	rg := newRig(t, nil)
	lim, err := middleware.New(rg.th, nil,
		middleware.WithConcurrency(concurrencyLimit(t, "in-flight", 1), middleware.Header("X-User")))
	require.NoError(t, err)
	h := lim.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/panic" {
			panic("handler bug")
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	call := func(path string) (code int, panicked bool) {
		defer func() { panicked = recover() != nil }()
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.Header.Set("X-User", "u1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code, false
	}
	_, panicked := call("/panic")
	require.True(t, panicked)
	code, _ := call("/")
	assert.Equal(t, http.StatusNoContent, code, "the panicking request's lease was released")
}

// The handler finds its leases in the context and can renew them; a
// request no concurrency limit applies to is served without any.
func TestLeasesFromContext(t *testing.T) {
	rg := newRig(t, nil)
	lim, err := middleware.New(rg.th, nil,
		middleware.WithConcurrency(concurrencyLimit(t, "in-flight", 2), middleware.Header("X-User")))
	require.NoError(t, err)
	var mu sync.Mutex
	var seen []string
	srv := serve(t, lim, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		leases, ok := middleware.LeasesFromContext(r.Context())
		mu.Lock()
		defer mu.Unlock()
		if !ok {
			seen = append(seen, "none")
			return
		}
		held, err := leases[0].Renew(r.Context())
		if err != nil || !held {
			seen = append(seen, "renew failed")
			return
		}
		seen = append(seen, leases[0].Identifier)
	}))
	assert.Equal(t, http.StatusOK, get(t, srv, "/", "X-User", "u1").status)
	assert.Equal(t, http.StatusOK, get(t, srv, "/").status)
	assert.Equal(t, []string{"u1", "none"}, seen)
}

// failingLeaser fails every call, leases included.
type failingLeaser struct{ failingBackend }

func (failingLeaser) Acquire(context.Context, driver.LeaseRequest) (driver.LeaseOutcome, error) {
	return driver.LeaseOutcome{}, errStoreDown
}

func (failingLeaser) Release(context.Context, driver.LeaseRequest) (driver.LeaseOutcome, error) {
	return driver.LeaseOutcome{}, errStoreDown
}

// A failing store: a limit that fails open serves with X-RateLimit-Degraded,
// one that fails closed answers 503; a backend without leases is an error
// for the ErrorHandler.
func TestConcurrencyFailures(t *testing.T) {
	rg := newRig(t, failingLeaser{})
	user := middleware.Header("X-User")
	for _, c := range []struct {
		name   string
		mode   throttler.FailureMode
		status int
	}{{"open", throttler.FailOpen, http.StatusOK}, {"closed", throttler.FailClosed, http.StatusServiceUnavailable}} {
		t.Run(c.name, func(t *testing.T) {
			lim, err := middleware.New(rg.th, nil, middleware.WithConcurrency(
				concurrencyLimit(t, "in-flight", 1, throttler.WithFailureMode(c.mode)), user))
			require.NoError(t, err)
			rp := get(t, serve(t, lim, statusHandler), "/", "X-User", "u1")
			assert.Equal(t, c.status, rp.status)
			assert.Equal(t, "1", rp.header.Get(middleware.HeaderDegraded))
			if c.mode == throttler.FailClosed {
				assert.Equal(t, "1", rp.header.Get(middleware.HeaderRetryAfter))
				assert.Equal(t, middleware.TypeTemporaryReducedCapacity, decodeProblem(t, rp).Type)
				assert.NotContains(t, rp.body, errStoreDown.Error())
			}
		})
	}

	t.Run("unsupported", func(t *testing.T) {
		th := newRig(t, failingBackend{}).th
		var got error
		lim, err := middleware.New(th, nil,
			middleware.WithConcurrency(concurrencyLimit(t, "in-flight", 1), user),
			middleware.WithErrorHandler(func(w http.ResponseWriter, r *http.Request, err error) bool {
				got = err
				return middleware.DefaultErrorHandler(w, r, err)
			}))
		require.NoError(t, err)
		rp := get(t, serve(t, lim, statusHandler), "/", "X-User", "u1")
		assert.Equal(t, http.StatusInternalServerError, rp.status)
		assert.True(t, errors.Is(got, errors.ErrUnsupported), "%v", got)
	})
}

func TestConcurrencyRejectsBadConfig(t *testing.T) {
	th := newRig(t, nil).th
	user := middleware.Header("X-User")
	l := concurrencyLimit(t, "in-flight", 1)
	for name, opts := range map[string][]middleware.Option{
		"nil limit":       {middleware.WithConcurrency(nil, user)},
		"zero limit":      {middleware.WithConcurrency(&throttler.ConcurrencyLimit{}, user)},
		"nil identify":    {middleware.WithConcurrency(l, nil)},
		"same name twice": {middleware.WithConcurrency(l, user), middleware.WithConcurrency(concurrencyLimit(t, "in-flight", 2), user)},
	} {
		lim, err := middleware.New(th, nil, opts...)
		assert.Nil(t, lim, name)
		assert.True(t, errors.Is(err, driver.ErrInvalidOption), "%s: %v", name, err)
	}
}
