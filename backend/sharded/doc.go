// Package shardedbackend (import path
// github.com/throttlekit/throttlekit/backend/sharded) spreads identifiers over several groups of servers, each
// a primary with zero or more replicas: how the Redis backend grows past one
// server, the way GitHub runs its limiter. The application, not the store,
// picks for each identifier the group that holds its state.
//
// The core is generic: a Shard is a name, a primary driver.Backend and
// replicas that implement driver.Peeker, so any backend can be a shard (New).
// Package redisgroups (backend/redis/groups) builds the usual case, Redis
// primaries and replicas, from code or from one configuration string; this
// package imports no client SDK.
//
// # Routing
//
// An identifier belongs to exactly one shard, chosen by rendezvous
// (highest-random-weight) hashing over the shard names: every shard scores
// the identifier with Score, and the highest score wins (ties, which need a
// 64-bit collision, go to the smaller name). Only the identifier routes, not
// the policy: every key of one identifier, under every policy, lives on one
// shard.
//
// Score hashes the identifier and the shard name each with the 64-bit
// xxHash and scores the pair with xxHash again (see Score for the formula);
// the memcached backend's server selector routes by the same function. It
// is the same in every process, on every platform, in every version, pinned
// by golden values in the tests: it is part of the on-wire contract, like the key layout of the
// Redis backend. Every process that shares shards must use the same names
// and this same function, or they count one identifier in two places.
// Changing it reshards everything.
//
// What follows from rendezvous hashing:
//
//   - The order of the shard list does not matter.
//   - Adding a shard to N moves about 1/(N+1) of the identifiers, all of
//     them to the new shard; none moves between the old ones.
//   - Removing a shard moves only the identifiers it owned.
//   - A shard's name, not its address, decides what it owns: name shards by
//     role ("a", "eu-1") and a server can be replaced under its name
//     without moving anything.
//
// Owner and Backend.ShardFor tell which shard owns an identifier, for
// operations tools and for checking a planned change of layout.
//
// # Replicas
//
// Decisions, refunds, resets, leases and given states (driver.Seeder,
// with which a rollout carries an identifier's windows from one store to
// another) go to the shard's primary. Peeks
// (Throttler.Peek, and the throttler's look at a request that can never
// succeed) go to the shard's replicas, tried in turn from a different one
// on each peek, and to the primary when no replica answers; everything
// runs within the caller's context, and a replica may use at most half of
// the time left, so a hung replica leaves the primary time to answer.
//
// Replication is asynchronous. A replica can be behind its primary in two
// ways. It can miss recent units, so a peek may show fewer than the primary
// holds; a peek is advice, and the next decision, on the primary, is exact.
// And it can still hold windows that have closed, because TTLs on a
// replica are not what decides (GitHub's stale-replica bug). The second
// never shows: the throttler's Evaluate treats every window that ends at
// or before the request's now as absent, whatever a replica still holds,
// and the Redis backend's Peek runs a read-only script (EVALSHA_RO), which
// replicas accept, that returns the states as stored.
//
// # Failure isolation
//
// A shard that fails fails only its own identifiers. Its errors are
// *ShardError values naming the shard, which the throttler wraps in
// throttler.ErrBackend: those identifiers get their policy's failure mode
// (fail open or fail closed), their Result is marked Degraded and its Err
// names the shard; every other identifier keeps exact counts on its own
// shard. While a primary is down, peeks of its identifiers are still
// answered by its replicas. A server that comes back with nothing (Redis
// without persistence) loses the windows it held, and only those.
//
// Each call to a down or hung shard costs at most the throttler's per-call
// timeout: the clients redisgroups makes have ContextTimeoutEnabled
// set, so go-redis ends every command at its context's deadline (see
// Timeouts in package redisbackend for clients built by hand and given to New).
// Tune the clients so that a refused connection is reported sooner: go-redis
// retries commands (max_retries) and dials (DialerRetries, five attempts
// 100 ms apart by default) before it gives up.
//
// Throttler.AllowAll over identifiers on different shards is not one
// atomic step: a denial refunds what the earlier identifiers consumed, and
// a concurrent request may see those units spent in between.
//
// A Backend whose primaries and replicas are all in-process stores
// (memory backends) is driver.Nonblocking, so the throttler gives its
// decisions no call timeout; one server that may block makes it blocking.
//
// Ping pings every primary and replica at once and joins the failures,
// each naming its shard and server. The Backend owns the backends it
// shards: Close closes each of them that implements driver.Closer (those
// redisgroups made close their clients).
//
// # Resharding
//
// Adding or removing a shard moves identifiers, and their windows do not
// move with them. An identifier that moves starts a fresh window on its
// new shard, so it may get up to one extra quota in the window during which
// the change happens; its old counts stay stranded on the old shard until
// their keys expire (the window's end plus the expiry grace).
// Identifiers that stay keep counting.
//
// Where that matters, move with the rollout package, which carries each
// identifier's state to its new shard (driver.Seeder):
//
//  1. Build the new layout, preferably with a key prefix of its own
//     (redisgroups.WithBackendOptions(redisbackend.WithPrefix("app-v2:"))),
//     so that retiring the old layout is deleting a prefix. A shared prefix
//     is harmless: where both layouts place an identifier on one server,
//     the carried state is the state already there.
//  2. Serve from rollout.New(oldLayout, newLayout, source,
//     rollout.WithMode(rollout.MirrorMode)) with the source at 0 percent:
//     every decision is made on the old layout, and the new one is written
//     the same windows after each, from the first on. Then raise the
//     source to 100 percent; every move keeps its window. (Split mode, the
//     rollout's default, also keeps them, reading the old layout once per
//     moved identifier.)
//  3. At 100 percent, after the longest window of any policy, serve from
//     the new layout alone. No identifier's window resets and none gets its
//     quota twice.
//
// The tests TestReshardingStartsMovedIdentifiersAfresh and
// TestMirrorModeCarriesWindowsAcrossReshard (backend/redis/groups) show
// both, on real servers.
package shardedbackend
