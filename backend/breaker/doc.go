// Package breaker gives each server a backend talks to a circuit breaker,
// so that an unreachable store costs a request microseconds instead of the
// whole per-call timeout.
//
// A [Breaker] counts consecutive failed calls to one server. It opens when
// both [WithFailures] calls in a row failed (5 by default) and that run of
// failures has lasted [WithFailingFor] (250 ms by default): a store that
// answers nothing, not a loaded machine where the calls in flight during a
// pause all time out at once and the next call succeeds. Open, every call
// is answered at once with an error wrapping [ErrOpen], without touching the
// network, and the throttler applies the policy's failure mode (open,
// closed or local). After [WithOpenFor] (250 ms by default) it lets one
// probe through (half-open); a probe that succeeds closes it, one that
// fails opens it for another period. A server that comes back is therefore
// used again within about a quarter of a second, on the first request after
// the period.
//
// An outage can kill the connections idle in a client's pool without the
// client noticing (a black hole, a restart behind a NAT); a probe that
// picked one would fail and keep the returned server out for another
// period, once per dead connection. So a breaker runs its drains
// ([Breaker.AddDrain]) when it opens and again just before each probe: the
// Redis backend marks the server's pooled connections stale, and [Wrap]
// closes the idle connections of a backend that is an [IdleCloser]
// (memcached). The probe then always dials a fresh connection.
//
// What counts as a failure is the caller's choice: the Redis backend counts
// network errors and timeouts, not the server's reply errors (a NOSCRIPT or
// a MOVED proves the server is there). A call whose context the caller
// canceled counts neither way.
//
// The state machine is github.com/sony/gobreaker. This package adds what a
// rate limiter needs around it: one breaker per server created on first use
// ([Set]), a fixed error per server so a rejected call allocates nothing,
// and logs that follow the outage rather than the traffic: one line when a
// breaker opens, one when it closes (with how long it was open and how many
// calls it answered), and while it stays open a line every [WithLogEvery]
// (10 s by default) with the count of calls it rejected and probes that
// failed. Half-open probes are logged at debug level only.
//
// Backends use it in two ways:
//
//   - The Redis backend takes [Option] values through
//     redisbackend.WithBreaker and installs a breaker per server inside
//     the go-redis client: per node of a Cluster, per group of a sharded
//     layout, one for a standalone server.
//   - [Wrap] puts one breaker in front of any driver.Backend, for a backend
//     that does not break per server itself (a backend of your own; the
//     memcached backend, like Redis's, breaks per server). Every call of the wrapped backend, its optional capabilities
//     included (peeks, refunds, takes, resets, leases, pings and the states
//     a rollout gives it through driver.Seeder), goes through the breaker;
//     a capability the wrapped backend lacks gives errors.ErrUnsupported.
//     Over an in-process store the result is driver.Nonblocking, like the
//     store, so the throttler gives its calls no call timeout.
package breaker
