package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/throttlekit/throttlekit/middleware"
	"github.com/throttlekit/throttlekit/throttler"
)

// IdentifierFunc names the caller of a call to fullMethod; "" leaves the
// call unlimited.
type IdentifierFunc func(ctx context.Context, fullMethod string) string

// PeerAddress names the caller by its peer's IP address, without the port.
// Behind a proxy every call comes from the proxy: use Metadata or User
// there.
func PeerAddress() IdentifierFunc {
	return func(ctx context.Context, _ string) string {
		p, ok := peer.FromContext(ctx)
		if !ok || p.Addr == nil {
			return ""
		}
		addr := p.Addr.String()
		if host, _, err := net.SplitHostPort(addr); err == nil {
			return host
		}
		return addr
	}
}

// Metadata names the caller by the first value of a request metadata key,
// such as "x-api-key".
func Metadata(key string) IdentifierFunc {
	key = strings.ToLower(key)
	return func(ctx context.Context, _ string) string {
		if vs := metadata.ValueFromIncomingContext(ctx, key); len(vs) > 0 {
			return vs[0]
		}
		return ""
	}
}

// User names the caller by the authenticated user lookup finds in the
// context, which an authentication interceptor earlier in the chain put
// there.
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

// FirstOf names the caller with the first of fs that gives a name.
func FirstOf(fs ...IdentifierFunc) IdentifierFunc {
	return func(ctx context.Context, method string) string {
		for _, f := range fs {
			if f == nil {
				continue
			}
			if id := f(ctx, method); id != "" {
				return id
			}
		}
		return ""
	}
}

// Option configures a Limiter.
type Option func(*Limiter) error

// WithCost sets each call's cost by method; the default is 1. A cost of 0
// checks the limits and sends the metadata without spending anything.
func WithCost(cost func(ctx context.Context, fullMethod string) int64) Option {
	return func(l *Limiter) error {
		if cost == nil {
			return fmt.Errorf("%w: WithCost(nil)", throttler.ErrInvalidOption)
		}
		l.cost = cost
		return nil
	}
}

// WithMethods limits only the methods for which limited reports true (for
// example, everything but /grpc.health.v1.Health/Check); the default limits
// every method.
func WithMethods(limited func(fullMethod string) bool) Option {
	return func(l *Limiter) error {
		if limited == nil {
			return fmt.Errorf("%w: WithMethods(nil)", throttler.ErrInvalidOption)
		}
		l.limited = limited
		return nil
	}
}

// WithHeaderOptions selects which metadata families are sent, as
// middleware.HeaderOptions selects headers.
func WithHeaderOptions(o middleware.HeaderOptions) Option {
	return func(l *Limiter) error {
		l.headers = o
		return nil
	}
}

// Limiter decides gRPC calls with a throttler under one policy. Build it
// with New; it is safe for concurrent use. To limit by several policies
// (per user and per peer), chain several Limiters.
type Limiter struct {
	t        *throttler.Throttler
	policy   *throttler.Policy
	identify IdentifierFunc
	cost     func(context.Context, string) int64
	limited  func(string) bool
	headers  middleware.HeaderOptions
}

// New returns a Limiter deciding calls of the callers identify names under
// p. A nil throttler is an error wrapping throttler.ErrNotInitialized; a
// nil policy or identifier function, or a bad option, one wrapping
// throttler.ErrInvalidOption.
func New(t *throttler.Throttler, p *throttler.Policy, identify IdentifierFunc, opts ...Option) (*Limiter, error) {
	if t == nil {
		return nil, fmt.Errorf("%w: grpclimit.New: nil throttler", throttler.ErrNotInitialized)
	}
	if p == nil || identify == nil {
		return nil, fmt.Errorf("%w: grpclimit.New needs a policy and an IdentifierFunc", throttler.ErrInvalidOption)
	}
	l := &Limiter{t: t, policy: p, identify: identify,
		cost:    func(context.Context, string) int64 { return 1 },
		limited: func(string) bool { return true }}
	for _, o := range opts {
		if o == nil {
			return nil, fmt.Errorf("%w: nil Option", throttler.ErrInvalidOption)
		}
		if err := o(l); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// UnaryServerInterceptor returns the interceptor for unary calls.
func (l *Limiter) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		md, err := l.decide(ctx, info.FullMethod)
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
		return handler(ctx, req)
	}
}

// StreamServerInterceptor returns the interceptor for streams, decided
// once when they open.
func (l *Limiter) StreamServerInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		md, err := l.decide(ss.Context(), info.FullMethod)
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
		return handler(srv, ss)
	}
}

// decide decides one call and returns its metadata (nil when the call is
// not limited) and the status error that refuses it, if any.
func (l *Limiter) decide(ctx context.Context, method string) (metadata.MD, error) {
	if !l.limited(method) {
		return nil, nil
	}
	id := l.identify(ctx, method)
	if id == "" {
		return nil, nil
	}
	r, err := l.t.AllowN(ctx, l.policy, id, l.cost(ctx, method))
	if err != nil && !errors.Is(err, throttler.ErrCostExceedsLimit) {
		switch {
		case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
			return nil, status.FromContextError(err).Err()
		case errors.Is(err, throttler.ErrInvalidIdentifier) || errors.Is(err, throttler.ErrInvalidCost):
			return nil, status.Error(codes.InvalidArgument, "the call cannot be rate limited: its identifier or cost is invalid")
		}
		return nil, status.Error(codes.Internal, "the rate limiter could not decide this call")
	}
	md := l.metadata(r)
	if r.Allowed {
		return md, nil
	}
	return md, l.refusal(r)
}

// metadata returns the middleware's headers for r as gRPC metadata.
func (l *Limiter) metadata(r throttler.Result) metadata.MD {
	h := http.Header{}
	middleware.WriteHeaders(h, r, l.policy, l.headers)
	md := make(metadata.MD, len(h))
	for k, vs := range h {
		md[strings.ToLower(k)] = vs
	}
	return md
}

// refusal builds the status of a denied call.
func (l *Limiter) refusal(r throttler.Result) error {
	subject := l.policy.Name()
	if len(r.Limits) > 1 {
		subject += ":" + r.Binding
	}
	quota := &errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
		Subject:     subject,
		Description: fmt.Sprintf("quota %s: %d of %d used", r.Binding, r.Used, r.Limit),
	}}}
	var st *status.Status
	switch {
	case r.NeverAllowed:
		st = status.New(codes.ResourceExhausted, fmt.Sprintf("this call costs more than quota %s holds, so it can never be allowed", r.Binding))
		if s, err := st.WithDetails(quota); err == nil {
			st = s
		}
		return st.Err()
	case r.Degraded:
		st = status.New(codes.Unavailable, "the rate limiter's store is unavailable and its failure mode refuses calls")
	default:
		st = status.New(codes.ResourceExhausted, fmt.Sprintf("rate limit %s exceeded; retry in %v", r.Binding, r.RetryAfter))
	}
	if s, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(r.RetryAfter)}, quota); err == nil {
		st = s
	}
	return st.Err()
}
