// Package middleware rate limits net/http handlers with a
// throttler.Throttler and tells clients where they stand, in GitHub's
// X-RateLimit-* headers, in the IETF draft's RateLimit-Policy and RateLimit
// fields (draft-ietf-httpapi-ratelimit-headers-10) and in Retry-After.
//
//	th, err := throttler.New(memorybackend.New())
//	anon, _ := throttler.ParsePolicy("anonymous", "60/h")
//	users, _ := throttler.ParsePolicy("users", "5000/h")
//	lim, err := middleware.New(th, []middleware.Rule{
//		{Policy: anon, Identify: middleware.Unless(middleware.ClientIP(ipOpts), userFunc)},
//		{Policy: users, Identify: userFunc},
//	})
//	http.ListenAndServe(addr, lim.Handler(api))
//
// # Rules and identifiers
//
// A Rule pairs a policy with an IdentifierFunc. Each request is decided
// for every subject whose IdentifierFunc names something; an empty name
// means "does not apply" (no user signed in, no token sent), not an error.
// One applicable subject is decided with Throttler.AllowN; several with
// Throttler.AllowAll, so the request passes only if every subject allows
// it, and a denial by one gives back what the others spent (not atomically:
// see AllowAll). A request no subject applies to passes untouched, with no
// headers. Each subject needs a policy name of its own, so that an IP
// address and a token that happen to be equal never share a counter.
//
// The identifier functions are ClientIP (the client address, see below),
// Header (an API key), User and ContextValue (the authenticated user, from
// the request context), Hashed (SHA-256 of another, to keep tokens out of
// the store) and Unless (one subject only when another is absent, as in
// GitHub's anonymous-by-IP, signed-in-by-user split).
//
// # Trusted proxies
//
// ClientIP believes a forwarding header only when the connection comes
// from a trusted proxy (ClientIPOptions.TrustedProxies, CIDR prefixes), and
// reads only the one header those proxies set: X-Forwarded-For (default)
// or RFC 7239 Forwarded. It walks the header from the right, skipping
// trusted hops; the first untrusted address is the client. A spoofed header
// from an untrusted peer is ignored, and a malformed header, an "unknown"
// or obfuscated node on the walk, or a missing header leaves the peer
// address as the identifier. Parsing never panics.
//
// # Headers
//
// The headers describe the binding result: with several subjects, the
// subject AllowAll reports (on allow the one with the least remaining, on
// deny the denying one); within a multi-limit policy, the binding limit.
// Numbers are whole; "up" means rounded up to the next whole second.
//
//	Header                 Allowed              Denied                 Never allowed   Degraded
//	X-RateLimit-Limit      quota of binding     same                   same            same
//	X-RateLimit-Remaining  remaining            0                      0               omitted
//	X-RateLimit-Used       units spent          = Limit                = Limit         omitted
//	X-RateLimit-Reset      ResetAt, Unix s, up  same                   same            omitted
//	X-RateLimit-Resource   resource name        same                   same            same
//	RateLimit-Policy       every limit          same                   same            same
//	RateLimit              r=remaining;t=reset  r=0;t=Retry-After      r=0, no t       omitted
//	Retry-After            none                 RetryAfter, s, up      none            closed: 1 s (*)
//	X-RateLimit-Degraded   none                 none                   none            1
//
// (*) A fail-closed denial asks the client to come back after 1 s, the
// throttler's fixed RetryAfter for a decision the store did not make.
//
// X-RateLimit-Reset depends on the stored window end alone, so every
// response within one fixed window carries the same value, from every
// process. For GCRA it is when the bucket is full again. RateLimit's t is
// relative: until ResetAt on allow, and on denial exactly the Retry-After
// value, so that Retry-After is never earlier than t. A denial never claims
// quota: Remaining and r are 0, even for a cost larger than what is left.
//
// RateLimit-Policy lists every limit of every subject that applied, one
// list member per limit, "<name>";q=<quota>;w=<window seconds, up>, the
// same on every response that the same subjects apply to. RateLimit has
// one member, the binding limit, under the same name. A member is named
// after the subject's Resource (its policy's name unless set) when the
// policy has one limit, and "<resource>:<limit name>" otherwise. A GCRA
// limit whose burst differs from its Max is listed as its burst over the
// time the burst takes to refill. Sub-second windows are listed as 1 s.
//
// A degraded result is one the store did not decide: its counts were made
// up by the failure mode, so the headers that report stored state are left
// out and X-RateLimit-Degraded: 1 is added. Each family can be switched
// off with WithHeaderOptions; WriteHeaders computes them for use outside
// this middleware (a handler of your own, another router).
//
// # Denials
//
// A denied request never reaches the wrapped handler. It is answered with
// an RFC 9457 application/problem+json body (type, title, status, detail,
// and the draft's violated-policies), which names policies and limits but
// never the identifier. WithDenyHandler replaces the body.
//
//	Case                 Status (option)                Problem type
//	quota spent          429 (WithDenyStatus)           TypeQuotaExceeded
//	too many in flight   429 (WithDenyStatus)           TypeConcurrencyExceeded
//	never allowed        429 (WithNeverAllowedStatus)   TypeCostExceedsLimit
//	store down, closed   503 (WithDegradedStatus)       TypeTemporaryReducedCapacity
//
// # Never allowed
//
// A request whose cost is larger than a limit's whole quota
// (throttler.ErrCostExceedsLimit) can never be allowed, however long the
// client waits. It gets no Retry-After and no RateLimit t, so nothing sends
// it back to try again, and the problem type TypeCostExceedsLimit, whose
// URI is this section.
//
// # Concurrency limits
//
// WithConcurrency holds a lease of a throttler.ConcurrencyLimit for as
// long as the wrapped handler runs, so that one identifier never has more
// than Max requests in flight:
//
//	uploads, _ := throttler.NewConcurrencyLimit("uploads", 2, time.Minute)
//	lim, err := middleware.New(th, rules, middleware.WithConcurrency(uploads, userFunc))
//
// The lease is acquired once the rate limits have allowed the request, and
// released when the handler returns, or panics, even if the client has
// gone. A request whose identifier already holds Max leases never reaches
// the handler: it gets 429, a Retry-After until the earliest lease held
// expires (an upper bound: a request in flight may end sooner) and a
// problem of type TypeConcurrencyExceeded naming the limit; the units its
// rate limits charged are given back. The rate-limit headers of the
// decision that let it that far are still sent. A lease never released (a
// crashed process) expires after the limit's lease TTL; a handler that may
// run longer renews its leases (LeasesFromContext, then Renew).
//
// Backend failures follow the limit's failure mode: fail open serves the
// request with X-RateLimit-Degraded: 1, fail closed answers 503 with
// TypeTemporaryReducedCapacity. A backend without leases (memcached) makes
// every such request an error for the ErrorHandler (errors.ErrUnsupported).
//
// # Refunds
//
// The cost is charged before the handler runs. When the handler answers a
// refund status (304 Not Modified by default; WithRefundStatuses), the cost
// is given back to every subject that spent it, after the handler has
// returned, so the next request sees the units back. The headers of the
// refunded response itself were sent before the handler ran and show the
// charge. The ResponseWriter the handler gets records the status and keeps
// http.Flusher, http.Hijacker and io.ReaderFrom working, and unwraps for
// http.ResponseController. A hijacked connection is never refunded.
//
// # Errors
//
// Backend failures are not errors here: the policy's failure mode decides
// (fail open serves the request with X-RateLimit-Degraded: 1; fail closed
// answers 503). Other errors of the throttler (an identifier longer than
// driver.MaxIdentifierLen, a negative cost, a misconfiguration, the
// request's context ending) go to the ErrorHandler. DefaultErrorHandler
// answers 400, 503 or 500 with a problem body and never serves the request,
// so no crafted input bypasses the limiter; PassThrough serves it instead.
package middleware
