package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit/middleware"
	"github.com/throttlekit/throttlekit/throttler"
)

// Response headers the demo's API adds so that clients can measure the
// rollout: which side and which store decided each request. They are the
// demo's own, not part of the middleware.
const (
	headerSide  = "X-Demo-Side"  // "old" or "new"
	headerStore = "X-Demo-Store" // "memcached", "redis/a", "memory/b"...
	// The binding limit's Remaining and Used as the throttler computed them
	// from the store, sent on denials. The standard headers force both on a
	// denial (Remaining 0, Used = Limit), so only these let a client see a
	// store that denied while it still held quota.
	headerResultRemaining = "X-Demo-Result-Remaining"
	headerResultUsed      = "X-Demo-Result-Used"
)

// tokenHeader carries the API token that identifies a client, as in
// "Authorization: token demo-0042".
const tokenHeader = "Authorization"

// resourceName names the limited resource in the rate-limit headers.
const resourceName = "core"

// identify names a request by the SHA-256 of its Authorization token, the
// identifier both the middleware and the hand-written limiter limit.
var identify = middleware.Hashed(middleware.Header(tokenHeader))

// app is the API's one endpoint: a small JSON document.
var app = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	setServedHeaders(w, r)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(`{"repository":"throttlekit/throttlekit","stars":42}` + "\n"))
})

// newAPI returns the demo's HTTP API: app behind the rate-limit middleware
// over th, keyed by identify (tokens never reach the stores in the clear).
// Every response, allowed or denied, names the store that decided it.
func newAPI(th *throttler.Throttler, policy *throttler.Policy) (http.Handler, error) {
	lim, err := middleware.New(th, []middleware.Rule{{
		Policy:   policy,
		Identify: identify,
		Resource: resourceName,
	}}, middleware.WithDenyHandler(func(w http.ResponseWriter, r *http.Request, res throttler.Result, p middleware.Problem) {
		setServedHeaders(w, r)
		w.Header().Set(headerResultRemaining, strconv.FormatInt(res.Remaining, 10))
		w.Header().Set(headerResultUsed, strconv.FormatInt(res.Used, 10))
		middleware.WriteProblem(w, p)
	}))
	if err != nil {
		return nil, err
	}
	limited := lim.Handler(app)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, _ := withServed(r.Context())
		limited.ServeHTTP(w, r.WithContext(ctx))
	}), nil
}

// warmUpAPI is the API before the rollout: the tokens onLegacy picks (with
// share) are limited by the hand-written limiter, the others by plain, a
// throttler over the old store alone. Without a legacy limiter, plain
// serves everyone.
func warmUpAPI(plain http.Handler, legacy *legacyLimiter, share float64) http.Handler {
	if legacy == nil || share <= 0 {
		return plain
	}
	old := legacy.handler(identify, app)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if onLegacy(strings.TrimPrefix(r.Header.Get(tokenHeader), "token "), share) {
			old.ServeHTTP(w, r)
			return
		}
		plain.ServeHTTP(w, r)
	})
}

// deployment is the API's handler of the moment: the warm-up's until the
// demo deploys the rollout, which swaps it in one step. A request keeps the
// handler it started with; every demo client waits for its response before
// sending the next, so no client is ever served by both at once.
type deployment struct {
	current atomic.Pointer[http.Handler]
}

// newDeployment serves h until deploy is called.
func newDeployment(h http.Handler) *deployment {
	d := &deployment{}
	d.current.Store(&h)
	return d
}

// deploy makes h serve every request from now on.
func (d *deployment) deploy(h http.Handler) { d.current.Store(&h) }

// ServeHTTP implements http.Handler.
func (d *deployment) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	(*d.current.Load()).ServeHTTP(w, r)
}

// deployer moves the API from the warm-up's handler (the hand-written
// limiter and a plain throttler over the old store) to next, the rollout's,
// at the start of the rollout's first phase; the load keeps calling
// meanwhile. It returns once next serves every request.
type deployer func(ctx context.Context, dep *deployment, next http.Handler) error

// deployAtOnce replaces every process at once: from one request to the
// next, every client is served by next. This is the deploy the run does.
func deployAtOnce(_ context.Context, dep *deployment, next http.Handler) error {
	dep.deploy(next)
	return nil
}

// rollingDeploy is the hook for the legacy leg's rolling deploy (issue 27,
// items 3 and 7): old and new processes serving the same identifiers
// together for as long as a deploy takes, behind a round-robin, with
// windows rolling over meanwhile, until only new ones are left. It is
// designed with backend/legacy's way in (a legacy backend that also
// decides in the legacy format while old processes may still count), and
// is not written yet: it returns an error wrapping errors.ErrUnsupported,
// and runMode deploys at once. When it lands, runMode calls it in place of
// deployAtOnce (and the phase that contains the overlap is judged like
// every other: 0 ResetAt changes, 0 double grants).
func rollingDeploy(_ context.Context, _ *deployment, _ http.Handler) error {
	return fmt.Errorf("%w: a rolling deploy of the legacy leg is not part of the demo yet", errors.ErrUnsupported)
}

// The rolling deploy plugs in where deployAtOnce does.
var _ deployer = rollingDeploy

// setServedHeaders copies the request's served record to the response.
func setServedHeaders(w http.ResponseWriter, r *http.Request) {
	s, ok := r.Context().Value(servedKey{}).(*served)
	if !ok {
		return
	}
	if first := s.first.Load(); first != nil {
		w.Header().Set(headerSide, first.side.String())
		w.Header().Set(headerStore, first.store)
	}
}

// apiServer is the API listening on a loopback port.
type apiServer struct {
	srv  *http.Server
	addr string
	done chan error
}

// startAPI serves h on a free loopback port.
func startAPI(h http.Handler) (*apiServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &apiServer{
		srv:  &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second, IdleTimeout: time.Minute},
		addr: ln.Addr().String(),
		done: make(chan error, 1),
	}
	go func() {
		err := s.srv.Serve(ln)
		if errors.Is(err, http.ErrServerClosed) {
			err = nil
		}
		s.done <- err
	}()
	return s, nil
}

// URL returns the endpoint's address.
func (s *apiServer) URL() string { return "http://" + s.addr + "/api/repos/throttlekit/throttlekit" }

// Close shuts the server down, waiting up to two seconds for requests in
// flight.
func (s *apiServer) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	err := s.srv.Shutdown(ctx)
	if err != nil {
		_ = s.srv.Close()
	}
	return errors.Join(err, <-s.done)
}
