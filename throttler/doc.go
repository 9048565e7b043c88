// Package throttler is the portable part of throttlekit: policies, limits,
// the clock, results, failure modes and the arithmetic of every algorithm.
// It imports no client SDK. Storage lives behind the small Backend
// interface; backend/memory, backend/redis, backend/memcached,
// backend/sharded and rollout implement it.
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
// Time is a parameter. The throttler's Clock (the wall clock unless
// WithClock says otherwise) supplies now, and now travels with every
// Request to the backend. No backend reads a clock of its own, and stored
// expiry is garbage collection only.
//
// # Algorithms
//
// Every stored time is an integer: Unix milliseconds for fixed windows,
// Unix microseconds for GCRA.
//
// FixedWindow (the default) opens a window at the first request that finds
// none open, ending Window later. AlignedWindow's windows end at the
// multiples of Window since the Unix epoch. Both store Used and the window
// end; a window is open while now < end, and a window whose end has passed
// is ignored, whatever the store still holds. A request is allowed iff
// used + cost <= Max. ResetAt is the stored end, so every result of one
// window carries the identical ResetAt, from every process and backend.
// Remaining = Max - Used. RetryAfter = ResetAt - now when denied.
//
// GCRA keeps a theoretical arrival time TAT. With T = ceil(Window/Max)
// microseconds and B = Burst (Max unless set):
//
//	newTAT    = max(TAT, now) + cost*T
//	allowed   iff newTAT - B*T <= now; then TAT = newTAT
//	Remaining = floor((now - (TAT - B*T)) / T), clamped to [0, B]
//	Used      = B - Remaining;  Limit = B
//	ResetAt   = max(TAT, now), when the bucket is full again
//	RetryAfter (denied) = newTAT - B*T - now
//
// Decide, Refund and Evaluate are these rules as pure functions; the memory
// backend calls them under a lock and the Redis scripts mirror them.
//
// # Results
//
// A Result's top-level fields describe the binding limit: on allow the one
// with the smallest Remaining (ties: latest ResetAt), on deny the denying
// one with the largest RetryAfter. Limits has every limit's figures.
//
// A cost above a limit's capacity can never be allowed. Such a request is
// denied without touching state, the Result has NeverAllowed set and
// RetryAfter = Never, and AllowN returns ErrCostExceedsLimit.
//
// # Failures
//
// A denial is not an error. A backend failure is not a decision either: each
// backend call is bounded by the caller's context and a per-call timeout
// (DefaultTimeout, 100 ms), and on failure the policy's FailureMode decides
// (FailOpen by default, FailClosed on request), the Result is marked
// Degraded with the failure in Err, and the Observer is told. Invalid input
// is returned as an error that errors.Is matches against ErrInvalidPolicy,
// ErrInvalidLimit, ErrInvalidIdentifier or ErrInvalidCost. No input makes
// the package panic.
//
// # Backends
//
// A Backend implements Decide. Optional capabilities are separate
// interfaces found by type assertion, each documenting the fallback when it
// is missing: Peeker (answer peeks from a replica), Refunder, Resetter and
// Pinger. Backends that wrap backends (sharded, rollout) are backends too.
// The conformance package checks any backend against this contract.
package throttler
