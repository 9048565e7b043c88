package main

import (
	"context"
	"errors"
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

// deployment is the API's processes behind a round-robin: each request
// goes to the next process in turn, as a load balancer sends it. The
// modes run one process, which the demo replaces in one step at the
// deploy; the rolling deploy runs several and replaces them one at a time,
// so that old and new code serve the same identifiers together. A request
// keeps the handler it started with; every demo client waits for its
// response before sending the next.
type deployment struct {
	processes []atomic.Pointer[http.Handler]
	turn      atomic.Uint64
}

// newDeployment runs processes processes, each serving h until replaced.
func newDeployment(processes int, h http.Handler) *deployment {
	d := &deployment{processes: make([]atomic.Pointer[http.Handler], max(processes, 1))}
	for i := range d.processes {
		d.processes[i].Store(&h)
	}
	return d
}

// replace makes process i serve h from its next request on.
func (d *deployment) replace(i int, h http.Handler) { d.processes[i].Store(&h) }

// ServeHTTP implements http.Handler: the next process in turn serves r.
func (d *deployment) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	i := (d.turn.Add(1) - 1) % uint64(len(d.processes))
	(*d.processes[i].Load()).ServeHTTP(w, r)
}

// deployer replaces the API's processes by new ones, next(i) for process
// i, while the load keeps calling. It returns once only new processes
// serve, or with ctx's error when ctx ends first.
type deployer func(ctx context.Context, dep *deployment, next func(process int) http.Handler) error

// deployAtOnce replaces every process at once: from one request to the
// next, every client is served by new code. The modes deploy this way.
func deployAtOnce(_ context.Context, dep *deployment, next func(int) http.Handler) error {
	for i := range dep.processes {
		dep.replace(i, next(i))
	}
	return nil
}

// rollingDeploy returns a deployer that replaces one process at a time,
// the first at once and each next one spread later, the way a rolling
// deploy goes: for (processes-1) × spread old and new code serve the same
// identifiers together (issue 27, items 3 and 7). The rolling deploy leg
// (runRollingDeploy) uses it.
func rollingDeploy(spread time.Duration) deployer {
	return func(ctx context.Context, dep *deployment, next func(int) http.Handler) error {
		start := time.Now()
		for i := range dep.processes {
			if err := sleepUntil(ctx, start.Add(time.Duration(i)*spread)); err != nil {
				return err
			}
			dep.replace(i, next(i))
		}
		return nil
	}
}

// sleepUntil waits until t, or until ctx ends (its error).
func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-timer.C:
		return nil
	}
}

// Both deploys plug in where a deployer is expected.
var (
	_ deployer = deployAtOnce
	_ deployer = rollingDeploy(time.Second)
)

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
