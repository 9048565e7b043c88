// Package legacybackend (import path
// github.com/throttlekit/throttlekit/backend/legacy) reads the counters of
// the hand-written limiters throttlekit replaces, so that a migration
// carries their open windows into the new store instead of restarting
// them. By default its backends are read-only: they answer a peek with the
// legacy counter as a fixed window, and refuse to decide. A Memcached or a
// Redis built with Deciding also decides and takes states in the legacy
// format, which is how new code serves beside old code during a rolling
// deploy.
//
// # The way in
//
// During a rolling deploy old and new processes serve the same
// identifiers for as long as the deploy takes. If the new code decided in
// the new store meanwhile, a window rolling over would be opened twice,
// once in each store, and clients would see its reset time flip. So while
// any old process may still count, the new code counts in the legacy
// counters, with the old code's semantics, and writes the new store
// alongside (a mirror rollout at 0 %); once no old process remains, the
// new store decides (100 %, the legacy counters still written) and, a
// window later, serves alone:
//
//	const legacyWindow = time.Minute // the hand-written limiter's window
//	old, err := legacybackend.NewMemcached(mc, legacyWindow, legacybackend.Deciding(),
//		legacybackend.WithKeyFunc(func(policy, id string) string { return "rl:" + id }))
//	src, err := rollout.NewStaticSource(0) // 100 once no old process remains
//	rb, err := rollout.New(old, newStore, src, rollout.WithMode(rollout.MirrorMode))
//	th, err := throttler.New(rb)
//
// From a Redis INCR+EXPIRE limiter the old side is a Redis built by
// NewRedis with Deciding and WithWindow instead ("Deciding on Redis").
// From memcached code that writes now.Unix() + window, add
// WithResetRounding(RoundDown) ("Rounding").
//
// docs/MIGRATION.md gives the whole procedure and what was measured. A
// read-only backend is the old side of a split rollout at 100 % instead
// (the rollout package's defaults): each identifier's first decision
// within its policy's horizon peeks the legacy store and seeds the new one
// with what it finds; old processes still running then count apart from
// new ones until the deploy ends.
//
// # Layouts
//
// NewMemcached reads the classic layout of GitHub's old limiter: a counter
// key holding a decimal count, raised with INCR, and the key
// "<counter key>:reset_at" (ResetSuffix) holding the end of its window in
// Unix seconds (WithResetMillis: milliseconds). NewRedis reads a counter
// key raised with INCR and given a TTL with EXPIRE: its window ends when
// the key expires, read as the request's now plus the key's PTTL, in whole
// milliseconds (with Deciding: the key's PEXPIRETIME, an absolute time). A
// Redis key with no TTL is absent (WithNoTTLWindow reads it as a window of
// the given length from now).
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
// Without Deciding, Decide with cost 0 is Peek. Any other cost returns an
// error wrapping errors.ErrUnsupported and no verdict: the legacy store is
// written only by the legacy code. So route no identifier to it: run the
// rollout at 100 % in split mode, and keep the old deployment, not a
// rollout to this backend, as the way back. Seed returns an error wrapping
// errors.ErrUnsupported. Neither backend implements Refunder, Resetter or
// Leaser; the throttler and the rollout fall back as their documentation
// says. Neither closes the client it was given.
//
// # Deciding
//
// A Memcached built with Deciding decides as the hand-written limiter of
// the classic layout does, in its keys:
//
//   - a window is open while the counter exists and the reset time lies
//     after the request's now; a request then raises the counter by its
//     cost with INCR, denied or not (the old code counts denied requests,
//     so the counter reads the same to it), and is allowed when the count
//     after it is at most Max;
//   - otherwise it opens a window: the counter set to the cost, then the
//     reset key set to now plus the window rounded as WithResetRounding
//     says (up to a whole second unless set; down with RoundDown; to the
//     millisecond with Millis or WithResetMillis), both expiring a few
//     seconds after the window, as the old code writes them; so a window
//     the new code opens has the end the old code would have written.
//
// Of several new processes finding the same window ended, one opens the
// next and the others count in it: an opener first adds a short-lived
// lock key (the counter key, OpeningSuffix and the ended window's end),
// and a process that finds it taken reads again until the reset key
// shows the new window (at most 200 ms, then it opens the window itself);
// the counter write is conditional too (add when the counter is missing,
// CAS against the counter read otherwise), so a write of the old code in
// between wins. What stays as racy as the old code:
// its own opening is two plain sets after a read, so an old and a new
// process opening the same identifier's window at the same instant can
// both write it (one count lost, and the reset time rewritten if the two
// straddle a second), exactly as two old processes can today. A client
// whose requests do not overlap never races itself.
//
// Seed (driver.Seeder) reads the legacy window, merges the given states
// into it by driver.Merge's rule and writes the result in the same
// format: a larger count of the same window by CAS on the counter,
// another window as Decide opens one. The reset key holds whole seconds,
// so the end of a window the new store opened (in milliseconds) is
// written rounded up there, for the old code, whatever the rounding
// setting, and exactly under the
// counter key plus EndSuffix, which this backend reads back while the
// reset key still stands for it: moves between the stores keep the exact
// end. Then the cost is decided as above. None of these steps is atomic
// against the old code: each is a round trip, retried from a fresh read
// when another writer raced it (Stats.Contended).
//
// A Deciding backend decides only a policy the legacy counter holds
// whole: one FixedWindow limit, of the legacy window. Any other policy
// gives an error wrapping errors.ErrUnsupported: its other limits could
// not be counted while old processes, which never count them, serve
// beside the new ones. Add them in a deploy after the way in. The same
// holds for a Deciding Redis.
//
// # Rounding
//
// Hand-written memcached limiters compute a window's end in one of three
// ways: now plus the window rounded up to a second, rounded down to it
// (now.Unix() + window, the most common line), or in milliseconds. A
// Deciding Memcached must open its windows with the old code's end:
// otherwise a window the new code opens lasts a second longer (or
// shorter) than the old code's, and when an old and a new process open
// the same window at once they write ends a second apart, which its
// clients see as a moving reset. WithResetRounding (RoundUp, RoundDown or
// Millis) says which; RoundUp is the default.
//
// A Deciding Memcached checks the setting against the windows it reads,
// at no extra round trip. It remembers, per counter (up to 16,384
// counters), the end of the last window it read or opened there. When it
// reads a window with another end R, the old one's end E a whole second,
// the window was opened by a request whose now o was at or after E (the
// old code, like this backend, opens a window only once the previous one
// has ended, by its own clock) and no later than when this read was
// served. If the read was served before E plus one second, less 100 ms
// for the clocks of old and new processes to disagree, o lay within the
// second after E, where now plus a window of whole seconds W ends at
// exactly E+W rounded down and at E+W+1s rounded up. So R = E+W shows
// RoundDown, R = E+W+1s shows RoundUp, and anything else shows nothing.
// Windows a Deciding Memcached opened are left out (the read finds the
// opening lock it took, OpeningSuffix and E), as are windows given with
// an exact end (EndSuffix) and windows not of whole seconds. With Millis,
// an open window whose reset value, read as Unix seconds, would end within
// a window and a second of now shows old code writing seconds. Each
// window that shows a rounding is counted in Stats.RoundingChecked, and in
// Stats.RoundingMismatched when it is not the configured one; the first
// mismatch is logged as a warning. In a rolling deploy the new processes
// read most windows the old code opens within a second of their start
// (each identifier's requests spread over old and new processes), so a
// wrong setting shows at once. What can mislead it: a request whose now
// is exactly E, to the nanosecond (rounding up then ends its window at
// E+W too: a synthetic clock, not a real one); clocks further apart than
// 100 ms; and a counter evicted in the second before its window's end,
// then reopened early. Each counts one window; a wrong setting counts
// nearly every window the old code opens.
//
// # Deciding on Redis
//
// A Redis built with Deciding (and WithWindow, the TTL the old code gives
// a new counter) decides as the hand-written INCR+EXPIRE limiter does, in
// its keys, in one script per decision (Redis 7.0 or later: it reads
// PEXPIRETIME):
//
//   - INCRBY of the cost, denied or not (the old code counts denied
//     requests), allowed when the count after it is at most Max;
//   - when that INCRBY created the counter (the window opens, as when the
//     old code's INCR returns 1), PEXPIRE of the window;
//   - the window's end is the counter's PEXPIRETIME, an absolute time
//     set once when the window opened: every decision and peek of a new
//     process reports that end, to the millisecond, however late in the
//     window it reads it. The old code's own reset (now plus a TTL read
//     anew, often in whole seconds) wobbles around it; the old processes
//     keep that behaviour, the new ones never move.
//
// A counter with no TTL (the old code's EXPIRE lost, or not sent yet) is
// given one when the new code counts in it: WithNoTTLWindow's length, or
// the window's. A counter whose expiry is at or before the request's now
// (the process's clock ahead of the server's) is an ended window: it is
// deleted and the next one opened, rather than counted in and reported
// closed. Both clocks count: the server's says when a key expires, the
// process's which windows have ended; keep them in step, as the old code
// needs too.
//
// Seed merges the given state into the counter by driver.Merge's rule in
// the same script, then counts the cost: a larger count of the window the
// counter holds is written with its TTL kept (SET ... KEEPTTL); a given
// window open at the request's now, when the counter holds none, is
// written with its end exactly (SET ... PXAT); a closed given window is
// ignored, and so is an empty one unless a cost is counted in it. The
// cost is then counted as Decide counts it, denied or not. What stays
// racy is the old code's own: its INCR and EXPIRE are two round trips, so
// a new process counting in between gives the counter its TTL and the
// old code's EXPIRE then sets it again, a moment later. A client whose
// requests do not overlap never races itself.
//
// # Unmatched policies
//
// A policy none of whose FixedWindow limits the matcher accepts reads
// nothing: its identifiers start afresh in the new store. That is right
// for a policy the legacy limiter never counted, and wrong when the
// legacy window given to the backend is not the legacy limiter's (an hour
// for a per-minute limiter). Such calls are counted in Stats.Unmatched,
// and the first per policy is logged as a warning (WithLogger, or the
// throttler's logger through SetLogger, or slog.Default()). Watch it
// during the way in: it must stay 0 for the legacy limiter's policy.
//
// # Calls
//
// A peek is one round trip: a multi-get of the two memcached keys (three
// with Deciding), or one MULTI of GET and PTTL on Redis. A deciding call
// is a multi-get then an INCR, or a conditional write and a set when it
// opens a window. A deciding call or a Seed on Redis is one script (and a
// second round trip, with the script's text, on a server that had not
// loaded it); a peek of a Deciding Redis is one MULTI of GET and
// PEXPIRETIME. A policy the matcher picks no limit of, or a key
// function returning "", costs none. A call returns once its context is
// done, leaving the round trip under way to end by the client's own
// timeouts. Stats counts reads, legacy windows found, malformed values and
// unmatched calls, and for a Deciding backend its decisions, the windows
// it opened, its seeds, its raced attempts and the rounding check's
// findings: when Found stops growing
// for a horizon, the legacy store is no longer needed.
//
// # envoy ratelimit
//
// NewEnvoyRedis reads, and with Deciding writes, the counters of envoy
// ratelimit's Redis backend, so that throttlekit can take over from it
// without restarting a window. envoy keeps one string per descriptor and
// window of the descriptor's unit:
//
//	<CACHE_KEY_PREFIX><domain>_<key1>_<value1>_..._<keyN>_<valueN>_<window start>
//
// where the window start is the request's Unix second rounded down to a
// multiple of the unit (1 for a second, 60, 3600, 86400, 604800, 2592000
// for envoy's 30-day month, 31536000 for its 365-day year). Every hit runs
// INCRBY of the hits and EXPIRE of the unit (plus a random jitter), so a
// window ends exactly at its start plus the unit, whatever the TTL says.
// The identifier this backend is given is that key with the prefix
// (WithEnvoyPrefix) and the trailing "_<window start>" taken off: the
// domain and each entry's key and value joined by "_". It is used as is,
// never escaped nor hashed, since envoy's keys are raw.
//
// The limits fed are the policy's AlignedWindow limits whose window is
// one of those units: throttlekit's aligned window of that length is
// then envoy's window, same start, same end. Each reads the key of its
// own unit's window holding the request's now, as State{Used: count, End:
// (start + unit) in Unix milliseconds}, Used at most the limit's Max
// (envoy counts denied hits, so a count beyond Max is common; the
// remaining reads 0 either way, as envoy reports it). Every other limit,
// anchored or sliding windows and GCRA included, gets the zero State. Two
// units whose windows start at the same second (a minute and an hour at
// the top of an hour) name the same key; it then counts the requests
// since that second, which is what both limits count, and both read it.
// A policy none of whose limits is fed reads nothing, is counted in
// Stats.Unmatched and is logged once.
//
// Read-only, the backend serves the way in of a deploy that replaces envoy
// ratelimit outright: the old side of a split rollout at 100 %, whose
// first decision per identifier peeks envoy's keys and seeds the new
// store. Envoy processes still serving count apart until they are gone.
//
// With Deciding it counts as envoy does, in envoy's keys, so that during a
// rolling deploy envoy processes and throttlekit processes share every
// window (the old side of a mirror rollout at 0 %, as above): a decision
// runs INCRBY of the cost and EXPIRE of the unit on the key of each fed
// limit, allowed or not, and is allowed when every count after it is at
// most its limit's Max. A shared key is raised once and expires with the
// longer unit. Only a policy all of whose limits are fed can be decided:
// any other gives an error wrapping errors.ErrUnsupported, since envoy
// processes would not count its other limits. Seed raises each key to the
// given state's count when that state is the same window (same End, in
// force at the request's now) with a script that sets the larger of the
// two counts, then counts the cost in the same script; a given window of
// another end is left out, as envoy's key can only hold the window now
// falls in. After a denial the states are the counts after it, as envoy
// keeps them, not the counts before as driver.Decide would leave them.
//
// What stays as envoy has it: a decision's keys are raised one by one,
// never together, and a count is not undone when another limit of the
// same policy denies; a key is given its TTL after it is raised, so a
// failure in between leaves a key without one, as envoy would. What
// differs: envoy's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT and its local
// over-limit cache stop envoy from counting some denied hits, which this
// backend counts; counts then read higher, never lower, and no quota is
// granted twice. envoy's REDIS_PERSECOND setting keeps the keys of
// second units in a Redis of their own: this backend reads one client, so
// give it that Redis for policies of one second limit and the main one for
// the others, through two backends. Both sides read their own clocks: a
// request within a clock skew of a window's end may count in either
// window, as between two envoy hosts.
//
// Calls: a peek is one pipeline of a GET per key; a decision one pipeline
// of INCRBY and EXPIRE per key; a seed one pipeline of a script per key
// (and a second one, with the script's text, on a server that had not
// loaded it). With a Cluster client the keys of one identifier usually lie
// in different slots, which no MGET, MULTI or script could span: the
// pipeline is split by go-redis into one batch per primary, each command
// touching one key, so nothing needs the keys of a call in one slot.
package legacybackend
