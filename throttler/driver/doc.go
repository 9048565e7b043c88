// Package driver is what a backend author imports: the Backend interface
// and its optional capabilities, the requests and outcomes they exchange
// with the throttler, the stored State, and the algorithms as pure
// functions. An API developer imports package throttler instead and never
// needs this one.
//
// The split follows gocloud's blob and blob/driver: package throttler owns
// everything that is the same for every store (validation, the clock,
// timeouts, failure modes, observation, turning states into results), and a
// backend does storage only.
//
// # Contract
//
// The throttler calls a backend with a Request whose Policy was compiled
// once by NewPolicy: every Limit carries its storage Key, its window in
// milliseconds and its GCRA emission interval in microseconds, so a backend
// computes nothing per request but what its store needs. Now travels with
// the request; a backend never reads a clock of its own to decide, and any
// expiry it sets on stored state is garbage collection only.
//
// A backend answers with an Outcome: its verdict and the states after the
// operation. Decide, Refund, Take and Evaluate define what those must be. The
// memory backend calls Decide under a lock; the Redis scripts mirror it line
// for line, and a test runs both on the same random sequences.
//
// # Capabilities
//
// Backend has one method. Peeker, Refunder, Resetter, Pinger, Taker,
// Seeder, Nonblocking, Closer, Leaser and LoggerSetter are optional, found
// by type assertion; each documents what the throttler does when it is
// missing (PeekWith and TakeWith are Peeker's and Taker's fallbacks, for
// decorators too). A decorator implements each one its inner stores do
// and passes it on: LoggerSetter gives every store the one logger of
// throttler.WithLogger.
//
// # Moving state between stores
//
// Seeder lets a store take the states another store decided for an
// identifier, merged by Merge's rule and decided in the same step (Seed is
// the reference). A rollout uses it so that an identifier's windows move
// with it; InForce and Horizon say what still counts and for how long.
//
// # Concurrency leases
//
// Leaser holds the leases of concurrency limits (ConcurrencyLimit): per
// identifier and limit, a set of lease IDs with their expiries. The
// throttler generates each ID and sends it with the request, with Now;
// AcquireLease and ReleaseLease define what the store must do with them,
// and an expired lease counts as released whatever the store holds.
//
// # Errors
//
// A failure of the store is an error, never a verdict. The sentinel errors
// here are shared by every package of the module, so that errors.Is works
// the same whichever backend produced an error.
//
// # Proving a backend
//
// Package conformance runs the whole behaviour contract (docs/SPEC.md)
// against any backend: conformance.Run(t, newHarness).
package driver
