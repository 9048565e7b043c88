// Package legacybackend (import path
// github.com/throttlekit/throttlekit/backend/legacy) reads the counters of
// the hand-written limiters throttlekit replaces, so that a migration
// carries their open windows into the new store instead of restarting
// them. Its backends are read-only: they answer a peek with the legacy
// counter as a fixed window, and refuse to decide.
//
// They are meant as the old side of a split rollout with seeding (the
// rollout package's defaults) at 100 %: each identifier's first decision
// within its policy's horizon peeks the legacy store and seeds the new one
// with what it finds (driver.Seeder), in the same step as the decision, so
// the first window after the deploy ends when the legacy one would have
// and counts what the legacy code counted:
//
//	old, err := legacybackend.NewMemcached(mc, time.Hour,
//		legacybackend.WithKeyFunc(func(policy, id string) string { return "rl:" + id }))
//	all, err := rollout.NewStaticSource(100)
//	rb, err := rollout.New(old, newStore, all)
//	th, err := throttler.New(rb)
//
// docs/MIGRATION.md gives the whole procedure.
//
// # Layouts
//
// NewMemcached reads the classic layout of GitHub's old limiter: a counter
// key holding a decimal count, raised with INCR, and the key
// "<counter key>:reset_at" (ResetSuffix) holding the end of its window in
// Unix seconds (WithResetMillis: milliseconds). NewRedis reads a counter
// key raised with INCR and given a TTL with EXPIRE: its window ends when
// the key expires, read as the request's now plus the key's PTTL, in whole
// milliseconds. A Redis key with no TTL is absent (WithNoTTLWindow reads
// it as a window of the given length from now).
//
// Both name the counter of a (policy, identifier) pair with a KeyFunc
// (WithKeyFunc); DefaultKey, "<policy>:<identifier>" escaped and hashed
// when long, is the default. Give the function the legacy code uses.
//
// # States
//
// The legacy counter is one window; a policy may have several limits. The
// counter's state goes to the first FixedWindow limit a Matcher accepts
// (WithMatcher; by default MatchWindow: every FixedWindow limit whose
// window is the legacy window, given to NewMemcached or with WithWindow)
// as State{Used: count, End: window end in Unix milliseconds}. Every other
// limit gets the zero State, as that one does when a key is missing, the
// count is 0 or less, or the window has ended at the request's now. A
// count above driver.MaxQuota is reported as MaxQuota, which decides
// alike. A value that is no decimal integer, a reset time after
// driver.MaxUnixMilli (often seconds read as milliseconds, or the
// reverse), or a Redis key of another type is an error wrapping
// driver.ErrBadReply. A key the function names that memcached would reject
// is an error wrapping driver.ErrInvalidOption.
//
// # Read-only
//
// Decide with cost 0 is Peek. Any other cost returns an error wrapping
// errors.ErrUnsupported and no verdict: the legacy store is written only by
// the legacy code. So route no identifier to it: run the rollout at 100 %,
// and keep the old deployment, not a rollout to this backend, as the way
// back. Use it in split mode only: a mirror or shadow rollout would replay
// every decision on it, each failing with errors.ErrUnsupported (counted
// as secondary errors). Neither backend implements Seeder, Refunder, Resetter or Leaser;
// the throttler and the rollout fall back as their documentation says.
// Neither ever writes, and neither closes the client it was given.
//
// # Calls
//
// A peek is one round trip: a multi-get of the two memcached keys, or one
// MULTI of GET and PTTL on Redis. A policy the matcher picks no limit of,
// or a key function returning "", costs none. A call returns once its
// context is done, leaving the round trip under way to end by the client's
// own timeouts. Stats counts reads, legacy windows found and malformed
// values: when Found stops growing for a horizon, the legacy store is no
// longer needed.
package legacybackend
