package middleware

import (
	"context"
	"errors"
	"fmt"
	"github.com/throttlekit/throttlekit/throttler/driver"
	"net/http"
	"strings"

	"github.com/throttlekit/throttlekit/throttler"
)

// Rule is one thing a request is limited by, under its own policy: the
// client IP under an anonymous policy, the user under an authenticated one.
type Rule struct {
	// Policy holds the limits. Every subject of a Limiter needs a policy of
	// its own name: stored state is keyed by policy name and identifier,
	// and an IP address must never share a counter with an equal-looking
	// token.
	Policy *throttler.Policy
	// Identify names the request; an empty name skips this subject.
	Identify IdentifierFunc
	// Resource names the subject in X-RateLimit-Resource and in the IETF
	// fields' list members; empty means the policy's name.
	Resource string
}

// Limiter is net/http middleware that decides every request with a
// throttler.Throttler before the wrapped handler sees it. Build it with
// New; it is safe for concurrent use.
type Limiter struct {
	throttler      *throttler.Throttler
	subjects       []Rule
	cost           func(*http.Request) int64
	headers        HeaderOptions
	denyStatus     int
	neverStatus    int
	degradedStatus int
	refundStatuses map[int]bool
	onError        ErrorHandler
	onDeny         DenyHandler
	concurrency    []concurrencyRule
}

// Option configures a Limiter (New).
type Option interface {
	apply(*Limiter) error
}

// optionFunc adapts a function to Option.
type optionFunc func(*Limiter) error

func (f optionFunc) apply(l *Limiter) error { return f(l) }

// set returns an Option that runs f, which cannot fail.
func set(f func(*Limiter)) Option {
	return optionFunc(func(l *Limiter) error { f(l); return nil })
}

// WithCost sets each request's cost; the default is 1. A cost of 0 checks
// the limits and sets the headers without spending anything.
func WithCost(cost func(*http.Request) int64) Option {
	return optionFunc(func(l *Limiter) error {
		if cost == nil {
			return driver.Errorf("%w: WithCost(nil)", driver.ErrInvalidOption)
		}
		l.cost = cost
		return nil
	})
}

// WithHeaderOptions selects which header families are sent; the default
// sends them all. Its Resource is ignored: each Rule names its own.
func WithHeaderOptions(o HeaderOptions) Option {
	return set(func(l *Limiter) { l.headers = o; l.headers.Resource = "" })
}

// WithDenyStatus sets the status of an ordinary denial; the default is 429
// Too Many Requests. GitHub answers 403 Forbidden for some limits.
func WithDenyStatus(code int) Option { return set(func(l *Limiter) { l.denyStatus = code }) }

// WithNeverAllowedStatus sets the status of a request whose cost exceeds a
// limit's whole quota; the default is 429, told apart from an ordinary
// denial by its problem type and its lack of Retry-After.
func WithNeverAllowedStatus(code int) Option { return set(func(l *Limiter) { l.neverStatus = code }) }

// WithDegradedStatus sets the status of a request denied because the
// limiter's store failed and its policy fails closed; the default is 503
// Service Unavailable: the client did nothing wrong.
func WithDegradedStatus(code int) Option { return set(func(l *Limiter) { l.degradedStatus = code }) }

// WithRefundStatuses sets the response statuses whose cost is given back
// once the handler has finished; the default is 304 Not Modified alone, so
// that a client revalidating its cache spends nothing (GitHub's rule).
// Call it with no codes to never refund.
func WithRefundStatuses(codes ...int) Option {
	return set(func(l *Limiter) {
		l.refundStatuses = make(map[int]bool, len(codes))
		for _, c := range codes {
			l.refundStatuses[c] = true
		}
	})
}

// WithErrorHandler sets what answers a request the throttler could not
// decide; the default is DefaultErrorHandler.
func WithErrorHandler(h ErrorHandler) Option {
	return optionFunc(func(l *Limiter) error {
		if h == nil {
			return driver.Errorf("%w: WithErrorHandler(nil)", driver.ErrInvalidOption)
		}
		l.onError = h
		return nil
	})
}

// WithDenyHandler sets what writes a denied request's response; the default
// writes the Problem with WriteProblem.
func WithDenyHandler(h DenyHandler) Option {
	return optionFunc(func(l *Limiter) error {
		if h == nil {
			return driver.Errorf("%w: WithDenyHandler(nil)", driver.ErrInvalidOption)
		}
		l.onDeny = h
		return nil
	})
}

// New returns a Limiter deciding requests with t for every subject that
// applies to them, and holding a lease of every concurrency limit
// (WithConcurrency) that applies. subjects may be empty when there is a
// concurrency limit. The error wraps driver.ErrInvalidOption.
func New(t *throttler.Throttler, subjects []Rule, opts ...Option) (*Limiter, error) {
	l := &Limiter{
		throttler:      t,
		subjects:       append([]Rule(nil), subjects...),
		cost:           func(*http.Request) int64 { return 1 },
		denyStatus:     http.StatusTooManyRequests,
		neverStatus:    http.StatusTooManyRequests,
		degradedStatus: http.StatusServiceUnavailable,
		refundStatuses: map[int]bool{http.StatusNotModified: true},
		onError:        DefaultErrorHandler,
		onDeny:         writeDenial,
	}
	for _, opt := range opts {
		if opt == nil {
			return nil, driver.Errorf("%w: nil Option", driver.ErrInvalidOption)
		}
		if err := opt.apply(l); err != nil {
			return nil, err
		}
	}
	if t == nil {
		return nil, driver.Errorf("%w: nil throttler", driver.ErrInvalidOption)
	}
	if len(l.subjects) == 0 && len(l.concurrency) == 0 {
		return nil, driver.Errorf("%w: no subjects and no concurrency limit", driver.ErrInvalidOption)
	}
	if err := l.checkConcurrency(); err != nil {
		return nil, driver.Errorf("%w: %w", driver.ErrInvalidOption, err)
	}
	policies := make(map[string]bool, len(l.subjects))
	resources := make(map[string]bool, len(l.subjects))
	for i, s := range l.subjects {
		if s.Policy == nil || len(s.Policy.Limits()) == 0 {
			return nil, driver.Errorf("%w: subject %d has no policy", driver.ErrInvalidOption, i)
		}
		if s.Identify == nil {
			return nil, driver.Errorf("%w: subject %d has no IdentifierFunc", driver.ErrInvalidOption, i)
		}
		if policies[s.Policy.Name()] {
			return nil, driver.Errorf("%w: two subjects use policy %q; give each its own", driver.ErrInvalidOption, s.Policy.Name())
		}
		policies[s.Policy.Name()] = true
		if s.Resource == "" {
			l.subjects[i].Resource = s.Policy.Name()
		}
		if r := l.subjects[i].Resource; resources[r] {
			return nil, driver.Errorf("%w: two subjects are named %q in headers", driver.ErrInvalidOption, r)
		}
		resources[l.subjects[i].Resource] = true
	}
	for _, code := range []int{l.denyStatus, l.neverStatus, l.degradedStatus} {
		if code < 200 || code > 999 {
			return nil, driver.Errorf("%w: status %d is not a final HTTP status", driver.ErrInvalidOption, code)
		}
	}
	if l.cost == nil || l.onError == nil || l.onDeny == nil {
		return nil, driver.Errorf("%w: nil cost function or handler", driver.ErrInvalidOption)
	}
	return l, nil
}

// Handler returns next wrapped by the limiter.
//
// For each request, every subject whose IdentifierFunc names something is
// decided: one subject with Throttler.AllowN, several with
// Throttler.AllowAll (allowed only if all allow; a denial gives back what
// the others spent). A request no subject applies to is served as it is.
// The rate-limit headers are set before next runs. A denied request is
// answered by the DenyHandler and next never runs. An allowed one then
// takes a lease of every concurrency limit that applies to it
// (WithConcurrency), held until next returns; a refused lease is answered
// by the DenyHandler too, and gives back the request's cost. The request is
// served with the Result and its leases in its context (see
// ResultFromContext and LeasesFromContext), and when next has returned
// with a refund status, its cost is given back to every subject that spent
// it.
func (l *Limiter) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l.serve(w, r, next)
	})
}

type resultKey struct{}

// ResultFromContext returns the decision that let the request in, when the
// request was served by a Limiter that applied to it.
func ResultFromContext(ctx context.Context) (throttler.Result, bool) {
	res, ok := ctx.Value(resultKey{}).(throttler.Result)
	return res, ok
}

func (l *Limiter) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	var applied []Rule
	var decided []throttler.Subject
	for _, s := range l.subjects {
		if id := s.Identify(r); id != "" {
			applied = append(applied, s)
			decided = append(decided, throttler.Subject{Policy: s.Policy, Identifier: id})
		}
	}
	cost := l.cost(r)
	var res throttler.Result
	ctx := r.Context()
	if len(decided) > 0 {
		var err error
		if len(decided) == 1 {
			res, err = l.throttler.AllowN(ctx, decided[0].Policy, decided[0].Identifier, cost)
		} else {
			res, err = l.throttler.AllowAll(ctx, cost, decided...)
		}
		if err != nil && !errors.Is(err, throttler.ErrCostExceedsLimit) {
			if l.fail(w, r, err) {
				next.ServeHTTP(w, r)
			}
			return
		}
		binding := bindingSubject(res, applied)
		l.writeHeaders(w.Header(), res, applied, binding)
		if !res.Allowed {
			l.onDeny(w, r, res, l.problem(res, applied[binding], cost))
			return
		}
		ctx = context.WithValue(ctx, resultKey{}, res)
	}
	// The client may have gone once its response was written; refunded
	// units are owed all the same.
	giveBack := func() {
		if len(decided) > 0 && cost > 0 {
			l.giveBack(context.WithoutCancel(r.Context()), res, decided, cost)
		}
	}
	if len(l.concurrency) > 0 {
		leases, ok, serve := l.acquireLeases(w, r, giveBack)
		if !ok {
			if serve {
				next.ServeHTTP(w, r)
			}
			return
		}
		if len(leases) > 0 {
			defer releaseLeases(r, leases)
			ctx = context.WithValue(ctx, leasesKey{}, leases)
		}
	}
	if ctx != r.Context() {
		r = r.WithContext(ctx)
	}
	if len(decided) == 0 {
		next.ServeHTTP(w, r)
		return
	}
	sw := &statusWriter{ResponseWriter: w}
	next.ServeHTTP(sw, r)
	if l.refundStatuses[sw.finalStatus()] {
		giveBack()
	}
}

// bindingSubject returns the index of the subject whose result res shows.
func bindingSubject(res throttler.Result, applied []Rule) int {
	for i, s := range applied {
		if s.Policy.Name() == res.Policy {
			return i
		}
	}
	return 0
}

// writeHeaders sets the headers of res. RateLimit-Policy lists the limits
// of every subject that applied, in order, so that it stays the same from
// one response to the next whichever subject binds.
func (l *Limiter) writeHeaders(h http.Header, res throttler.Result, applied []Rule, binding int) {
	opts := l.headers
	opts.Resource = applied[binding].Resource
	if !opts.OmitRateLimitPolicy {
		members := make([]string, 0, len(applied))
		for _, s := range applied {
			members = append(members, rateLimitPolicyValue(s.Policy, s.Resource))
		}
		h.Set(HeaderRateLimitPolicy, strings.Join(members, ", "))
		opts.OmitRateLimitPolicy = true
	}
	WriteHeaders(h, res, applied[binding].Policy, opts)
}

// problem builds the body of a denial. It names policies and limits, which
// are the server's own configuration, and never the identifier.
func (l *Limiter) problem(res throttler.Result, s Rule, cost int64) Problem {
	notation := res.Binding
	for _, lim := range s.Policy.Limits() {
		if lim.Name == res.Binding {
			notation = lim.String()
		}
	}
	quota := fmt.Sprintf("%q (%s)", s.Resource, notation)
	if len(s.Policy.Limits()) > 1 {
		quota = fmt.Sprintf("%q (%s)", s.Resource+":"+res.Binding, notation)
	}
	switch {
	case res.NeverAllowed:
		return Problem{Type: TypeCostExceedsLimit, Title: "Cost Exceeds Limit", Status: l.neverStatus,
			Detail: fmt.Sprintf("This request costs %d units; quota %s holds at most %d, so it can never be allowed.",
				cost, quota, res.Limit),
			ViolatedPolicies: violatedPolicies(res, s.Resource)}
	case res.Degraded:
		secs, _ := retryAfterSeconds(res)
		return Problem{Type: TypeTemporaryReducedCapacity, Title: "Temporary Reduced Capacity",
			Status: l.degradedStatus,
			Detail: fmt.Sprintf("The rate limiter is unavailable; try again in %d s.", secs)}
	default:
		secs, _ := retryAfterSeconds(res)
		return Problem{Type: TypeQuotaExceeded, Title: "Quota Exceeded", Status: l.denyStatus,
			Detail:           fmt.Sprintf("Quota %s is spent; try again in %d s.", quota, secs),
			ViolatedPolicies: violatedPolicies(res, s.Resource)}
	}
}

// giveBack refunds cost to every subject that spent it for this request.
// Failures reach the throttler's observer; a backend without Refunder
// refunds nothing.
func (l *Limiter) giveBack(ctx context.Context, res throttler.Result, decided []throttler.Subject, cost int64) {
	results := res.Subjects
	if results == nil {
		results = []throttler.Result{res}
	}
	for i, r := range results {
		if i >= len(decided) || !r.Allowed || r.Degraded {
			continue
		}
		_, _ = l.throttler.Refund(ctx, decided[i].Policy, decided[i].Identifier, cost)
	}
}
