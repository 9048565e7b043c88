// Package grpclimit puts a throttler.Throttler in front of gRPC services:
// a unary and a stream server interceptor that decide every call before
// its handler runs, with the same figures the net/http middleware sends as
// headers.
//
//	lim, err := grpclimit.New(t, policy, grpclimit.FirstOf(
//		grpclimit.User(userFromContext), grpclimit.PeerAddress()))
//	srv := grpc.NewServer(
//		grpc.ChainUnaryInterceptor(lim.UnaryServerInterceptor()),
//		grpc.ChainStreamInterceptor(lim.StreamServerInterceptor()))
//
// # Identifiers
//
// An IdentifierFunc names the caller: PeerAddress (the peer's IP, without
// its port), Metadata (a request metadata key, such as an API key), User
// (the authenticated user, as an authentication interceptor that runs
// earlier in the chain put it in the context), and FirstOf to fall back
// from one to the next. An empty identifier leaves the call unlimited, as
// the net/http middleware does.
//
// # Status codes
//
//   - A denial is codes.ResourceExhausted with a google.rpc.RetryInfo
//     detail whose retry_delay is the Result's RetryAfter, and a
//     google.rpc.QuotaFailure naming the policy and its binding limit
//     (never the identifier). Clients read the delay with
//     status.FromError(err) and the detail's GetRetryDelay().
//   - A cost no window can ever hold is codes.ResourceExhausted with a
//     QuotaFailure and no RetryInfo: nothing invites the call back.
//   - A backend failure follows the throttler's failure mode: a call the
//     mode allows is served; one it denies is codes.Unavailable with a
//     RetryInfo of the mode's delay.
//   - A call whose context ended before the decision gets the context's
//     status (codes.Canceled or codes.DeadlineExceeded); an identifier the
//     throttler rejects, codes.InvalidArgument; any other error,
//     codes.Internal.
//
// # Metadata
//
// The rate-limit figures are the net/http middleware's headers
// (middleware.WriteHeaders), lower-cased as gRPC metadata keys:
// x-ratelimit-limit, x-ratelimit-remaining, x-ratelimit-used,
// x-ratelimit-reset (Unix seconds), x-ratelimit-resource, ratelimit-policy,
// ratelimit and, on a denial, retry-after. An allowed call carries them in
// its header metadata, a denied one in its trailer metadata.
//
// # Streams
//
// A stream is decided once, when it opens, at the cost WithCost gives for
// its method; the messages it carries are not counted one by one.
package grpclimit
