// Package throttler is what an API developer imports to rate-limit
// requests: a Throttler, the policies it enforces, and the results it
// returns. It imports no client SDK; storage lives in a backend
// (backend/memory, backend/redis, backend/memcached, backend/sharded,
// rollout, or your own, written against package throttler/driver).
//
// # Model
//
// A Throttler decides whether a request by an identifier (a user, an IP, a
// token) may proceed under a Policy: a named, ordered set of limits decided
// together. A request has a cost, usually 1; a cost of 0 is a peek. It is
// allowed only if every limit of the policy allows it; then every limit
// consumes the cost; otherwise none does. Denied requests consume nothing,
// so raising a limit helps at once.
//
//	th, err := throttler.New(memorybackend.New())
//	policy, err := throttler.ParsePolicy("core", "10/s, 5000/h")
//	r, err := th.Allow(ctx, policy, "user:42")
//	if !r.Allowed { /* 429, Retry-After: r.RetryAfter */ }
//
// Time is a parameter. The throttler's Clock (the wall clock unless
// WithClock says otherwise) supplies now, and now travels with every
// request to the backend. No backend reads a clock of its own, and stored
// expiry is garbage collection only.
//
// # Algorithms
//
// FixedWindow (the default) opens a window at the first request that finds
// none open, ending Window later. AlignedWindow's windows end at the
// multiples of Window since the Unix epoch. Both store the count and the
// window end, so every result of one window carries the identical ResetAt,
// from every process and backend. GCRA allows a smooth rate with a burst.
// SlidingWindow weighs the previous aligned window's count by how much of
// it the last Window still covers: smooth like GCRA, with the "Max per
// Window" meaning. docs/SPEC.md gives the exact arithmetic of each.
//
// # Batches and waiting
//
// AllowUpTo grants the largest batch, up to n, that every limit of a
// policy allows, charged to all of them at once, and reports it in
// Result.Granted. Wait and WaitN block until a request is allowed, sleeping
// the RetryAfter the backend reports, and return at once with
// ErrWaitExceedsDeadline when the context's deadline comes first.
//
// # Results
//
// A Result's top-level fields describe the binding limit: on allow the one
// with the smallest Remaining (ties: latest ResetAt), on deny the denying
// one with the largest RetryAfter. Limits returns every limit's figures
// (LimitAt reads one without allocating).
//
// A cost above a limit's capacity can never be allowed. Such a request is
// denied without touching state, the Result has NeverAllowed set and
// RetryAfter = Never, and AllowN returns ErrCostExceedsLimit.
//
// # Failures
//
// A denial is not an error. A backend failure is not a decision either:
// each backend call is bounded by the caller's context and a per-call
// timeout (DefaultCallTimeout, 100 ms), and on failure the failure mode
// decides (FailOpen by default, FailClosed, or FailLocal, which decides in
// process on this process's share of the policy; throttler-wide or per
// policy), the Result is marked Degraded with the failure in Err, and the
// failure is logged and observed. WithDenyCache answers repeated denials
// without a round trip. Invalid input is an error that
// errors.Is matches against the Err variables. No input makes the package
// panic.
//
// # Concurrency limits
//
// A ConcurrencyLimit bounds the requests one identifier may have in flight
// at once, rather than per window. Acquire takes a lease, Release frees it,
// and a lease that is never released (its process crashed) expires after
// the limit's lease TTL, so a slot is never lost for longer. Renew extends
// a lease for a request that outlives the TTL.
//
//	conc, err := throttler.NewConcurrencyLimit("uploads", 4, time.Minute)
//	lease, err := th.Acquire(ctx, conc, "user:42")
//	if !lease.Acquired { /* 429, Retry-After: lease.RetryAfter */ }
//	defer lease.Release(ctx)
//
// A refusal is not an error; a backend failure follows the failure mode,
// as decisions do. The memory and Redis backends hold leases; memcached
// does not, and Acquire over it returns errors.ErrUnsupported.
//
// # HTTP
//
// Package middleware puts a Throttler in front of net/http handlers and
// writes GitHub's X-RateLimit-* and the IETF RateLimit fields; its
// WithConcurrency option holds a lease for the duration of each request.
package throttler
