package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/throttlekit/throttlekit/middleware"
	"github.com/throttlekit/throttlekit/throttler"
)

// IdentifierFunc names the caller of a call to fullMethod; "" leaves the
// call unlimited, as an empty name skips a subject in the net/http
// middleware.
type IdentifierFunc func(ctx context.Context, fullMethod string) string

// PeerAddress names the caller by its peer's IP address, without the port.
// IPv4-mapped IPv6 addresses are written as IPv4 and zones are dropped, so
// that one client has one identifier; a peer address that holds no IP (a
// Unix socket) is used as it is. Behind a proxy every call comes from the
// proxy: use Metadata or User there.
func PeerAddress() IdentifierFunc {
	return func(ctx context.Context, _ string) string {
		p, ok := peer.FromContext(ctx)
		if !ok || p.Addr == nil {
			return ""
		}
		if tcp, ok := p.Addr.(*net.TCPAddr); ok {
			if a, ok := netip.AddrFromSlice(tcp.IP); ok {
				return a.Unmap().String()
			}
		}
		addr := p.Addr.String()
		host, _, err := net.SplitHostPort(addr)
		if err != nil {
			return addr
		}
		if a, err := netip.ParseAddr(host); err == nil {
			return a.Unmap().WithZone("").String()
		}
		return host
	}
}

// Metadata names the caller by the first value of a request metadata key,
// such as "x-api-key" (keys are case-insensitive). A client chooses what it
// sends: limit by a key your authentication checks, or wrap the value in a
// function of your own that validates it.
func Metadata(key string) IdentifierFunc {
	key = strings.ToLower(key)
	return func(ctx context.Context, _ string) string {
		if vs := metadata.ValueFromIncomingContext(ctx, key); len(vs) > 0 {
			return vs[0]
		}
		return ""
	}
}

// User names the caller by the authenticated user that lookup finds in the
// context, which an authentication interceptor earlier in the chain put
// there. A nil lookup names nobody.
func User(lookup func(ctx context.Context) (string, bool)) IdentifierFunc {
	return func(ctx context.Context, _ string) string {
		if lookup == nil {
			return ""
		}
		if u, ok := lookup(ctx); ok {
			return u
		}
		return ""
	}
}

// FirstOf names the caller with the first of fs that gives a name: with
// FirstOf(User(f), PeerAddress()), a signed-in caller is limited as its
// user and an anonymous one by its address ("user, else peer").
//
// The name is prefixed with the 1-based position of the function that gave
// it and a colon ("1:ada", "2:192.0.2.7"), so that names from different
// sources never share a counter: a client cannot spend another's quota by
// sending, as its API key, the other's IP address. Nil functions are
// skipped but keep their position.
func FirstOf(fs ...IdentifierFunc) IdentifierFunc {
	fs = append([]IdentifierFunc(nil), fs...)
	return func(ctx context.Context, method string) string {
		for i, f := range fs {
			if f == nil {
				continue
			}
			if id := f(ctx, method); id != "" {
				return strconv.Itoa(i+1) + ":" + id
			}
		}
		return ""
	}
}

// Option configures a Limiter (New).
type Option interface {
	apply(*Limiter) error
}

// optionFunc adapts a function to Option.
type optionFunc func(*Limiter) error

func (f optionFunc) apply(l *Limiter) error { return f(l) }

// WithCost sets each call's cost, by method or from the call's context;
// the default is 1. A cost of 0 checks the limits and sends the metadata
// without spending anything. A stream's cost is charged once, when it
// opens.
func WithCost(cost func(ctx context.Context, fullMethod string) int64) Option {
	return optionFunc(func(l *Limiter) error {
		if cost == nil {
			return fmt.Errorf("%w: WithCost(nil)", throttler.ErrInvalidOption)
		}
		l.cost = cost
		return nil
	})
}

// WithMethods limits only the methods for which limited reports true (for
// example, everything but /grpc.health.v1.Health/Check); the default limits
// every method. Full method names are "/package.Service/Method".
func WithMethods(limited func(fullMethod string) bool) Option {
	return optionFunc(func(l *Limiter) error {
		if limited == nil {
			return fmt.Errorf("%w: WithMethods(nil)", throttler.ErrInvalidOption)
		}
		l.limited = limited
		return nil
	})
}

// WithPolicies chooses the policy each method is decided under, in place
// of New's policy, which may then be nil; a method for which policyFor
// returns nil is not limited. Methods that share a policy share its
// quota; give a method a policy of its own name for a quota of its own.
// WithMethods, when also given, is asked first.
func WithPolicies(policyFor func(fullMethod string) *throttler.Policy) Option {
	return optionFunc(func(l *Limiter) error {
		if policyFor == nil {
			return fmt.Errorf("%w: WithPolicies(nil)", throttler.ErrInvalidOption)
		}
		l.policyFor = policyFor
		return nil
	})
}

// WithHeaderOptions selects which metadata families are sent, as
// middleware.HeaderOptions selects headers; its Resource replaces the
// policy's name in x-ratelimit-resource, in the IETF fields' list members
// and in QuotaFailure subjects.
func WithHeaderOptions(o middleware.HeaderOptions) Option {
	return optionFunc(func(l *Limiter) error {
		l.headers = o
		return nil
	})
}

// Limiter decides gRPC calls with a throttler, each call under the policy
// of its method. Build it with New; it is safe for concurrent use.
//
// To limit one call by several subjects (the user and the peer), chain
// several Limiters, each with a policy of its own name. Each then charges
// its own quota as it allows the call, so a call that a later Limiter
// refuses has still spent the earlier ones' units, and each adds its own
// value of every metadata key, in chain order.
type Limiter struct {
	t         *throttler.Throttler
	policy    *throttler.Policy
	policyFor func(string) *throttler.Policy
	identify  IdentifierFunc
	cost      func(context.Context, string) int64
	limited   func(string) bool
	headers   middleware.HeaderOptions
	// policyValues caches each policy's RateLimit-Policy value.
	policyValues sync.Map // *throttler.Policy -> string
	cached       atomic.Int64
}

// maxCachedPolicies bounds the RateLimit-Policy values a Limiter keeps.
const maxCachedPolicies = 1024

// New returns a Limiter deciding calls of the callers identify names under
// p. A nil throttler is an error wrapping throttler.ErrNotInitialized; no
// policy (a nil p without WithPolicies), a nil identifier function or a bad
// option, one wrapping throttler.ErrInvalidOption.
func New(t *throttler.Throttler, p *throttler.Policy, identify IdentifierFunc, opts ...Option) (*Limiter, error) {
	if t == nil {
		return nil, fmt.Errorf("%w: grpclimit.New: nil throttler", throttler.ErrNotInitialized)
	}
	if identify == nil {
		return nil, fmt.Errorf("%w: grpclimit.New: nil IdentifierFunc", throttler.ErrInvalidOption)
	}
	l := &Limiter{t: t, policy: p, identify: identify,
		cost:    func(context.Context, string) int64 { return 1 },
		limited: func(string) bool { return true }}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: grpclimit.New: nil Option", throttler.ErrInvalidOption)
		}
		if err := o.apply(l); err != nil {
			return nil, err
		}
	}
	if p == nil && l.policyFor == nil {
		return nil, fmt.Errorf("%w: grpclimit.New: no policy (pass one, or WithPolicies)", throttler.ErrInvalidOption)
	}
	if p != nil && len(p.Limits()) == 0 {
		return nil, fmt.Errorf("%w: grpclimit.New: policy has no limits (build it with throttler.NewPolicy)", throttler.ErrInvalidOption)
	}
	return l, nil
}

type resultKey struct{}

// ResultFromContext returns the decision that let the call in, when a
// Limiter decided it: handlers and later interceptors may read the
// remaining quota from it.
func ResultFromContext(ctx context.Context) (throttler.Result, bool) {
	r, ok := ctx.Value(resultKey{}).(throttler.Result)
	return r, ok
}

// UnaryServerInterceptor returns the interceptor for unary calls. An
// allowed call reaches the handler with the figures set as header
// metadata and its Result in the context; a refused one never reaches it
// and gets the figures as trailer metadata.
func (l *Limiter) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		var method string
		if info != nil {
			method = info.FullMethod
		}
		r, md, err := l.decide(ctx, method)
		if md != nil {
			if err != nil {
				_ = grpc.SetTrailer(ctx, md)
			} else {
				_ = grpc.SetHeader(ctx, md)
			}
		}
		if err != nil {
			return nil, err
		}
		if md != nil {
			ctx = context.WithValue(ctx, resultKey{}, r)
		}
		return handler(ctx, req)
	}
}

// StreamServerInterceptor returns the interceptor for streams. A stream is
// decided once, when it opens, at the cost WithCost gives its method; the
// messages it then carries are not counted. A refused stream never reaches
// the handler: the client's first Recv (or CloseAndRecv) returns the
// status.
func (l *Limiter) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		var method string
		if info != nil {
			method = info.FullMethod
		}
		r, md, err := l.decide(ss.Context(), method)
		if md != nil {
			if err != nil {
				ss.SetTrailer(md)
			} else if herr := ss.SetHeader(md); herr != nil {
				return herr
			}
		}
		if err != nil {
			return err
		}
		if md != nil {
			ss = &stream{ServerStream: ss, ctx: context.WithValue(ss.Context(), resultKey{}, r)}
		}
		return handler(srv, ss)
	}
}

// stream is a ServerStream whose context carries the Result.
type stream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *stream) Context() context.Context { return s.ctx }

// decide decides one call and returns its result, its metadata (nil when
// the call is not limited) and the status error that refuses it, if any.
func (l *Limiter) decide(ctx context.Context, method string) (throttler.Result, metadata.MD, error) {
	if !l.limited(method) {
		return throttler.Result{}, nil, nil
	}
	p := l.policy
	if l.policyFor != nil {
		p = l.policyFor(method)
	}
	if p == nil {
		return throttler.Result{}, nil, nil
	}
	id := l.identify(ctx, method)
	if id == "" {
		return throttler.Result{}, nil, nil
	}
	cost := l.cost(ctx, method)
	r, err := l.t.AllowN(ctx, p, id, cost)
	if err != nil && !errors.Is(err, throttler.ErrCostExceedsLimit) {
		return r, nil, l.failure(ctx, method, err)
	}
	md := l.metadata(r, p)
	if r.Allowed {
		return r, md, nil
	}
	return r, md, l.refusal(r, p, cost)
}

// failure turns an error of the throttler into a status, as the net/http
// middleware's DefaultErrorHandler does: the call is never served.
func (l *Limiter) failure(ctx context.Context, method string, err error) error {
	switch {
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	case errors.Is(err, throttler.ErrInvalidIdentifier) || errors.Is(err, throttler.ErrInvalidCost):
		return status.Error(codes.InvalidArgument, "the call cannot be rate limited: its identifier or cost is invalid")
	}
	if logger := l.t.Logger(); logger != nil {
		logger.LogAttrs(ctx, slog.LevelError, "throttlekit: grpclimit: rate limiter error",
			slog.String("method", method), slog.Any("error", err))
	}
	return status.Error(codes.Internal, "the rate limiter could not decide this call")
}

// metadata returns the net/http middleware's headers for r as gRPC
// metadata, under lower-case keys.
func (l *Limiter) metadata(r throttler.Result, p *throttler.Policy) metadata.MD {
	opts := l.headers
	// RateLimit-Policy depends on the policy alone: it is written once per
	// policy and then copied.
	var policyValue string
	if !opts.OmitRateLimitPolicy {
		if v, ok := l.policyValues.Load(p); ok {
			policyValue, opts.OmitRateLimitPolicy = v.(string), true
		}
	}
	h := headerPool.Get().(http.Header)
	middleware.WriteHeaders(h, r, p, opts)
	md := make(metadata.MD, len(h)+1)
	for k, vs := range h {
		key, ok := metadataKeys[k]
		if !ok {
			key = strings.ToLower(k)
		}
		md[key] = vs
	}
	clear(h)
	headerPool.Put(h)
	if policyValue != "" {
		md[policyKey] = []string{policyValue}
	} else if vs := md[policyKey]; len(vs) == 1 && l.cached.Load() < maxCachedPolicies {
		// Bounded, for a WithPolicies function that builds a new policy
		// for every call.
		if _, loaded := l.policyValues.LoadOrStore(p, vs[0]); !loaded {
			l.cached.Add(1)
		}
	}
	return md
}

// policyKey is the metadata key of RateLimit-Policy.
var policyKey = strings.ToLower(middleware.HeaderRateLimitPolicy)

// metadataKeys maps the canonical form of each header WriteHeaders sets to
// its metadata key, so that converting one costs no allocation.
var metadataKeys = func() map[string]string {
	m := make(map[string]string)
	for _, h := range []string{middleware.HeaderLimit, middleware.HeaderRemaining, middleware.HeaderUsed,
		middleware.HeaderReset, middleware.HeaderResource, middleware.HeaderRateLimitPolicy,
		middleware.HeaderRateLimit, middleware.HeaderRetryAfter, middleware.HeaderDegraded} {
		m[http.CanonicalHeaderKey(h)] = strings.ToLower(h)
	}
	return m
}()

// headerPool holds the scratch headers WriteHeaders writes to.
var headerPool = sync.Pool{New: func() any { return make(http.Header, 9) }}

// refusal builds the status of a denied call. Its message and details name
// the policy and its limits, the server's own configuration, and never the
// identifier.
func (l *Limiter) refusal(r throttler.Result, p *throttler.Policy, cost int64) error {
	resource := l.headers.Resource
	if resource == "" {
		resource = p.Name()
	}
	subject, notation := resource, r.Binding
	if r.NumLimits() > 1 {
		subject += ":" + r.Binding
	}
	for _, lim := range p.Limits() {
		if lim.Name == r.Binding {
			notation = lim.String()
		}
	}
	var st *status.Status
	var details []protoadapt.MessageV1
	switch {
	case r.NeverAllowed:
		msg := fmt.Sprintf("this call costs %d units; quota %q (%s) holds at most %d, so it can never be allowed",
			cost, subject, notation, r.Limit)
		st = status.New(codes.ResourceExhausted, msg)
		details = append(details, quotaFailure(subject, msg))
	case r.Degraded:
		st = status.New(codes.Unavailable, fmt.Sprintf("the rate limiter is unavailable; retry in %v", r.RetryAfter))
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(r.RetryAfter)})
	default:
		msg := fmt.Sprintf("quota %q (%s) is spent; retry in %v", subject, notation, r.RetryAfter)
		st = status.New(codes.ResourceExhausted, msg)
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(r.RetryAfter)},
			quotaFailure(subject, fmt.Sprintf("quota %q (%s) is spent", subject, notation)))
	}
	if s, err := st.WithDetails(details...); err == nil {
		st = s
	}
	return st.Err()
}

func quotaFailure(subject, description string) *errdetails.QuotaFailure {
	return &errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
		Subject: subject, Description: description}}}
}
