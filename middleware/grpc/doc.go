// Package grpclimit puts a throttler.Throttler in front of gRPC services:
// a unary and a stream server interceptor that decide every call before
// its handler runs, and send the figures the net/http middleware sends as
// headers, as metadata.
//
//	th, err := throttler.New(memorybackend.New())
//	policy, err := throttler.ParsePolicy("grpc", "100/min")
//	lim, err := grpclimit.New(th, policy, grpclimit.FirstOf(
//		grpclimit.User(userFromContext), grpclimit.PeerAddress()))
//	srv := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(authUnary, lim.UnaryServerInterceptor()),
//		grpc.ChainStreamInterceptor(authStream, lim.StreamServerInterceptor()))
//
// Interceptors run in the order they are chained: put the limiter after
// the authentication interceptor whose user it reads, and before the
// costly ones.
//
// # Methods and policies
//
// Every method is decided under New's policy unless WithMethods leaves it
// out or WithPolicies picks each method's policy (nil: not limited).
// WithCost sets a call's cost, by method or from its context; the default
// is 1. A Limiter decides one subject per call; to limit a call by several
// (its user and its address), chain several Limiters, each with a policy
// of its own name. ResultFromContext gives the handler the decision that
// let its call in.
//
// # Identifiers
//
// An IdentifierFunc names the caller: PeerAddress (the peer's IP, without
// its port), Metadata (the first value of a request metadata key, such as
// an API key), User (the authenticated user, as an authentication
// interceptor earlier in the chain put it in the context), and FirstOf,
// which falls back from one to the next ("user, else peer") and prefixes
// the name with the position of the function that gave it ("1:ada",
// "2:192.0.2.7"), so that a name from one source never shares a counter
// with an equal name from another. An empty identifier leaves the call
// unlimited and without rate-limit metadata, as an empty identifier skips
// a subject in the net/http middleware.
//
// # Status codes
//
//	Case                      Code                Details
//	quota spent               ResourceExhausted   RetryInfo, QuotaFailure
//	cost above the quota      ResourceExhausted   QuotaFailure (no RetryInfo)
//	store down, fail closed   Unavailable         RetryInfo
//	store down, fail open     OK: served          -
//	context ended             Canceled or DeadlineExceeded
//	identifier or cost bad    InvalidArgument
//	any other error           Internal (logged to the throttler's logger)
//
// RetryInfo's retry_delay is the Result's RetryAfter, exactly; under fail
// closed, the degraded Result's RetryAfter (1 s). QuotaFailure names the
// violated quota as the IETF fields name it, the resource (the policy's
// name) alone for a one-limit policy and "<resource>:<limit>" otherwise,
// and describes it in the policy's notation; neither the message nor the
// details ever name the identifier. A call whose cost exceeds a limit's
// whole quota (throttler.ErrCostExceedsLimit) can never be allowed, so it
// gets no RetryInfo, nothing that invites it back; it is ResourceExhausted
// rather than FailedPrecondition so that clients handle every refusal of
// the limiter by one code and tell the two apart by RetryInfo. A refused
// call never reaches its handler.
//
// A client reads the delay from the status:
//
//	_, err := client.Check(ctx, req)
//	if status.Code(err) == codes.ResourceExhausted {
//		for _, d := range status.Convert(err).Details() {
//			if ri, ok := d.(*errdetails.RetryInfo); ok {
//				wait := ri.GetRetryDelay().AsDuration()
//				_ = wait // sleep, then retry
//			}
//		}
//	}
//
// # Metadata
//
// The rate-limit figures are the net/http middleware's headers, computed
// by middleware.WriteHeaders with the same values, under lower-case keys:
//
//	x-ratelimit-limit      quota of the binding limit
//	x-ratelimit-remaining  units left (0 on a refusal)
//	x-ratelimit-used       units spent (the quota on a refusal)
//	x-ratelimit-reset      when the binding limit is whole, Unix seconds, rounded up
//	x-ratelimit-resource   the policy's name (HeaderOptions.Resource)
//	ratelimit-policy       every limit, "<name>";q=<quota>;w=<window s>
//	ratelimit              the binding limit, "<name>";r=<remaining>;t=<s>
//	retry-after            on a refusal that can succeed later, seconds, rounded up
//	x-ratelimit-degraded   "1" when the store failed and the failure mode decided
//
// An allowed call carries them in its header metadata (grpc.Header on the
// client), a refused one in its trailer metadata (grpc.Trailer), since a
// refused call sends no header of its own. WithHeaderOptions switches
// families off, as in the net/http middleware. Read with
// md.Get("x-ratelimit-remaining").
//
// # Streams
//
// A stream is decided once, when it opens, at the cost WithCost gives its
// method; the messages it then carries are not counted one by one. A
// refused stream never reaches its handler: the client sees the status on
// its first Recv.
//
// # Module
//
// This package is a module of its own, github.com/throttlekit/throttlekit/middleware/grpc,
// so that a program that does not import it never inherits gRPC in its
// go.mod: go get it beside the core. It is released and tested with the
// core at the same commit.
package grpclimit
