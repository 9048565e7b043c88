// Package redisbackend (import path
// github.com/throttlekit/throttlekit/backend/redis) is throttlekit's Redis
// backend: one Lua script call decides
// one identifier's whole policy, every limit at once, atomically and all or
// nothing, in one network round trip. Redis runs each script alone, so
// decisions are exact under any concurrency and for any cost: with cost 1,
// exactly Max requests are allowed per fixed window, from any number of
// hosts. It needs Redis 7.0 or later (script flags and EVALSHA_RO) and works
// through any go-redis v9 client.
//
// # Clients
//
// New takes any go-redis client; the backend needs only Client, a small
// part of each. A standalone server:
//
//	rdb := redis.NewClient(&redis.Options{
//		Addr: "localhost:6379", ContextTimeoutEnabled: true})
//	backend, err := redisbackend.New(rdb)
//
// A Redis Cluster (an identifier's keys share one slot, see Key):
//
//	rdb := redis.NewClusterClient(&redis.ClusterOptions{
//		Addrs: addrs, ContextTimeoutEnabled: true})
//	backend, err := redisbackend.New(rdb)
//
// Sentinel (a failover client is a *redis.Client that follows the
// primary Sentinel names; decisions survive the failover, see Scripts):
//
//	rdb := redis.NewFailoverClient(&redis.FailoverOptions{
//		MasterName: "throttle", SentinelAddrs: sentinels,
//		ContextTimeoutEnabled: true})
//	backend, err := redisbackend.New(rdb)
//
// Concurrent decisions are batched by default (see Batching): nothing to
// configure for throughput under load.
//
// # Timeouts
//
// Every call returns by its context's deadline, which the throttler sets
// from its per-call timeout (throttler.DefaultCallTimeout, 100 ms), so a
// stopped or hung server costs a caller at most that timeout, on every
// client. How the backend keeps that promise depends on the client.
//
// A *redis.Client, *redis.ClusterClient or *redis.Ring with
// ContextTimeoutEnabled set takes its socket deadlines from the context,
// and the backend runs each command on the caller's goroutine. That is the
// recommended setting: it costs nothing per call.
//
//	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
//
// Without it, go-redis ignores the context's deadline once a command is on
// the wire and waits for the reply up to its ReadTimeout (5 s by default);
// the auto-pipeliner runs queued commands on a context of its own; and a
// client of any other type is not known to do better. For all of those the
// backend runs each command on a goroutine of its own and returns the
// context's error at the deadline. The abandoned command finishes in the
// background, and its goroutine ends when go-redis gives up on it by its own
// timeouts: ReadTimeout once the command is sent (a paused or hung server),
// DialTimeout per attempt while it connects, PoolTimeout per attempt while
// abandoned commands hold every pooled connection. Keep these finite on
// such a client: with a ReadTimeout of -1, a command on a hung server, and
// its goroutine, wait for as long as the server does. Either way an
// abandoned command may still run on the server later, as a command on a
// connection that timed out may.
//
// go-redis watches deadlines, not cancellation, while a command is on the
// wire. A context that can be cancelled but has no deadline (a Backend
// called directly, or a throttler whose timeout is zero) therefore takes
// the goroutine path on every client; and with ContextTimeoutEnabled, a
// context cancelled before its deadline is noticed at that deadline (or at
// ReadTimeout, if sooner), not at once.
//
// # Replica reads
//
// Peeks (Throttler.Peek, and the read behind a request that can never be
// allowed) run peek.lua, a read-only script, with EVALSHA_RO, which a
// replica accepts. WithReadClient sends them to a client of their own:
//
//	// A standalone replica, or a Sentinel client with ReplicaOnly set:
//	backend, err := redisbackend.New(primary, redisbackend.WithReadClient(replica))
//
//	// The replicas of a cluster:
//	reads := redis.NewClusterClient(&redis.ClusterOptions{
//		Addrs: addrs, ReadOnly: true})
//	backend, err := redisbackend.New(rdb, redisbackend.WithReadClient(reads))
//
// A replica may lag and may still hold a window that has closed. Peeks never
// trust that: a window counts only while the throttler's now is before its
// stored end, so a peek after the window's end reports a fresh window,
// whatever the replica holds. (go-redis routes read-only commands only to
// the replicas CLUSTER SLOTS lists; Redis leaves out a replica whose
// primary has not replicated anything yet.) Decisions, refunds and resets
// always go to the primary.
//
// # Keys
//
// An identifier's state under a policy is one hash, whatever the number of
// limits (stored layout 3, see Layout):
//
//	<prefix>v3:{<escaped identifier>}:<policy key>
//	throttlekit:v3:{user%3A42}:api
//
// with, for each limit of key K (driver.Limit.Key), the fields eK, the
// window's end in Unix milliseconds (the theoretical arrival time in Unix
// microseconds for GCRA), uK, the units used in that window (not for GCRA,
// whose count is its TAT), and for a sliding window pK, the count of the
// window before. Every value is a decimal integer. The field x holds the
// Unix millisecond, by the writing host's clock, until which the key's
// expiry was last set (see Scripts). For 5000/h unnamed, 5000/h named
// "hourly" and 10/s GCRA with burst 20:
//
//	e:fixed:3600000  u:fixed:3600000
//	ehourly:fixed:3600000  uhourly:fixed:3600000
//	e:gcra:1000:20
//
// One HMGET reads every limit and one HSET writes them: a policy of three
// limits costs about what one does, and it lives in one key, so a Cluster
// slot migration moves it whole. Fields writes the fields of a limit.
//
// The prefix is DefaultPrefix unless WithPrefix says otherwise, and holds no
// brace. The identifier is escaped with driver.EscapeKey, whose output
// holds only letters, digits, '-', '.', '_' and '%XX' escapes, so the braces
// around it are the key's hash tag: an identifier's keys (its leases'
// included) land in one cluster slot, whatever bytes it holds, and no
// identifier can move its keys to another slot with braces of its own.
// Escaping is injective, so distinct identifiers never share a key. The
// policy key and the limit keys are the compiled driver.Policy's Key and
// driver.Limit's Key (key layout 2): the limit's name when it was given one
// (empty otherwise), its algorithm and window in milliseconds, and a GCRA
// burst set explicitly. Max is never part of it, so raising or lowering Max
// keeps the open window for every algorithm, named or not, and two limits of
// a policy never share a counter (NewPolicy refuses two limits with the same
// key). A limit that a redefined policy dropped keeps its fields, untouched,
// and the key's expiry never moves back, so they live as long as they were
// set to.
//
// A key of another type, or a field that is not an integer this backend
// could have written, is reported as ErrForeignValue and changes nothing.
//
// Releases before layout 3 kept one string per limit, "used:end"
// ("used:end:prev" for a sliding window), under
// <prefix>{<escaped identifier>}:<policy key>:<limit key> (Layout2Keys),
// with the limit keys of key layout 2, or before that of layout 1
// (driver.KeyV1: an unnamed limit's notation, Max included): releases up
// to 7016ead wrote key layout 1, abf6070 key layout 2. Layout 3 never
// reads the old keys on its own, so an upgrade from those releases is
// deployed with one of the views below (docs/MIGRATION.md, "Upgrading
// throttlekit", has the steps and the figures).
//
// When every process of the old release stops before the first new one
// starts, deploy, for the longest window of the policies (twice it for a
// sliding window),
//
//	store, err := rollout.Upgrade(backend.Layout2(), backend)              // from key layout 2
//	store, err := rollout.Upgrade(rollout.KeyLayoutV1(backend.Layout2()), backend) // from key layout 1
//	store, err := rollout.UpgradeKeys(backend)                             // the same, from key layout 1
//
// which reads each identifier's old strings once, on its first decision,
// and carries them into its hash in the same step as that decision (see
// Seeding; TestLayoutUpgradeOnRealRedis: 300 clients calling through the
// upgrade, 0 ResetAt changes, 0 double grants), then the backend alone.
//
// When old and new processes serve together (a rolling deploy), the old
// ones keep counting in their strings, and Upgrade alone would count in
// the hash beside them: each version would grant its own quota. Deploy
// first
//
//	store, err := backend.Layout2Beside(2) // 1 from key layout 1
//
// which decides on both layouts in one script call and writes both, then,
// once no old process runs, the Upgrade above, and the backend alone a
// horizon later (TestUpgradeFromEarlierReleases builds 7016ead and abf6070
// from their source and overlaps them with this code for 12 s: 0 ResetAt
// changes, 0 grants over quota, standalone, groups and Cluster).
//
// # Scripts
//
// There is one script per operation: decide.lua, peek.lua, refund.lua,
// take.lua and seed.lua, embedded in the binary, each with the helpers they
// share (common.lua) spliced in after its shebang line (and acquire.lua
// and release.lua for leases, which need none of them: see Concurrency
// leases; peek_layout2.lua, which reads the strings of earlier releases;
// and decide_layout2.lua, which decides on those strings and the hash
// together for Layout2Beside). Each gets the identifier's key in KEYS, and in ARGV the
// throttler's now (in milliseconds and microseconds), the cost, the expiry
// grace, and each limit's algorithm, Max, window, capacity, emission
// interval and key. Each returns integers: the verdict and every limit's
// state, as many of its fields as the algorithm keeps (Used and End for a
// fixed window, End alone for GCRA, Used, End and Prev for a sliding
// window; the others are always 0). The throttler computes every figure of
// the result from those with driver.Evaluate.
//
// decide.lua, refund.lua, take.lua and seed.lua mirror driver.Decide,
// driver.Refund, driver.Take and driver.Seed line for line, as the helpers in common.lua mirror the functions they
// call, with the same names and order and comments naming each Go function;
// a test runs both on the same random sequences and requires identical
// states and verdicts.
//
// A decision, though, runs a script written for its policy's shape, the
// algorithms of its limits in order: decide_shape.lua.tmpl, rendered once
// per shape the program decides under (up to 64 shapes of up to 6 limits;
// past that, decide.lua itself), as a lone script and a batch script. It
// decides exactly as decide.lua and decide_many.lua do, with the same keys,
// writes, replies and errors, but without their generic machinery: no loop
// over limits, no table per limit or request, no function per step, each
// limit's constants in locals. The lone script takes decide.lua's
// arguments; the batch script takes decide_many.lua's up to the number of
// decisions, then a form, and for each decision only what the form says
// it needs (now in ms and the key always; the policy's index, now in µs
// and the cost when the call needs them), three values in most round
// trips where decide_many.lua takes five. The script's own work is about
// 0.7× the generic one's batched and 0.6× lone (BenchmarkScriptBody;
// bench/BENCHMARKS.md has the Redis time beside the peers').
// TestShapeScriptsMirrorGenericRaw runs the four (lone and batch, shaped
// and generic) on the same random requests of up to six limits with odd
// stored values, and compares every reply, error text and stored field;
// TestScriptsMirrorGo compares the shape scripts with driver.Decide. Every read and
// check comes before the first write, and the scripts carry a shebang, so
// Redis refuses them up front when out of memory: a decision is all or
// nothing. Lua numbers are doubles, exact below 2^53: driver.MaxQuota
// and the window bounds keep every count far below that, and a request
// whose now lies outside the years 1700 to 2240 or so, where microseconds
// would not be exact, is refused with ErrTimeOutOfRange.
//
// Time is the throttler's: now travels with each request, and the scripts
// never read the server's clock. The stored window end is what every result
// reports as ResetAt, identical for every decision of a window from every
// host (GitHub's fix for a wobbling reset time). Expiry is garbage
// collection only. A write whose states need the key past the moment in x
// sets the key's TTL to the latest (end - now) among the limits it wrote
// plus two expiry graces (DefaultExpiryGrace, 30 s, unless WithExpiryGrace
// says otherwise), relative, and x to now plus that TTL; any other write
// leaves both alone. The second grace is slack, so that a GCRA bucket, whose
// TAT moves with every decision, pays a PEXPIRE about once per grace rather
// than once per decision, and a fixed window once per window. x compares
// one host's clock with another's: a host whose clock is behind may leave an
// expiry that another host set up to their difference too early, which the
// grace covers as long as it exceeds that difference (see WithExpiryGrace).
//
// Scripts are run with EVALSHA, falling back to EVAL in the same call when
// the server answers NOSCRIPT, so a decision survives SCRIPT FLUSH, a
// restart and a failover to a server that never saw the script.
//
// # Seeding
//
// The backend implements driver.Seeder, by which a rollout carries an
// identifier's windows from another store (mirror and split modes, a
// key-layout upgrade, a hand-written limiter's counters). Seed runs
// seed.lua, one EVALSHA on the identifier's keys: it merges the given
// states into the stored ones as driver.Merge does (a given state that
// counts nothing at now is ignored, one the store lacks is taken as it is,
// and when both count: a fixed window keeps the End the store holds with
// the larger of the two counts, whatever End the given one has; GCRA the
// later TAT; sliding the later window), then decides the request's cost on the merged
// states as driver.Decide does (cost 0: the merge alone), all in one atomic
// step. The reply carries the verdict, the states after the step
// (Outcome.States) and the states read before it (Outcome.Prior). The
// states that changed are written, with the expiry rule of decide.lua; a
// seed that changes nothing writes nothing. TestSeedScriptMirrorsGo runs seed.lua and
// driver.Seed on the same random states and sequences, for every algorithm,
// and requires identical verdicts, states after, prior states and stored
// states.
//
// The given states are checked before any round trip: one per limit, no
// negative field (driver.CheckGiven), and no field above 2^53 - 1, which a
// script could not hold exactly; anything else is driver.ErrInvalidState.
// A key holding a foreign value is ErrForeignValue, as for a decision, and
// nothing is written. A seed is one script call on the identifier's key, so
// it works on a standalone server, through Sentinel and on a Cluster, and
// through the batcher's pipelines (on its own call, never in a batch
// call).
//
// # Concurrency leases
//
// The backend implements driver.Leaser (throttler.Throttler.Acquire): one
// identifier's leases under one concurrency limit are a sorted set of lease
// IDs scored by their expiry in Unix milliseconds,
//
//	<prefix>{<escaped identifier>}:lease:<escaped limit name>
//	throttlekit:{user%3A42}:lease:uploads
//
// in the identifier's hash slot (see LeaseKey), so leases work on a
// Cluster. Acquire runs acquire.lua and Release runs release.lua, one
// EVALSHA each: both drop the leases whose expiry is at or before the
// throttler's now (ZREMRANGEBYSCORE), then acquire.lua adds or renews the
// lease when fewer than Max remain (or the lease is already held) and sets
// the key's TTL to the latest expiry plus the expiry grace, and release.lua
// removes it. They reply the verdict, whether the lease was held, the leases
// in flight and the earliest expiry, and mirror driver.AcquireLease and
// driver.ReleaseLease (TestLeaseScriptsMirrorGo). An identifier whose last
// lease is released leaves no key; one whose holders crashed leaves a key
// that expires the grace after its latest lease. A lease key of another
// type is ErrForeignValue.
//
// # Cluster failover
//
// When a Cluster primary dies, its replica is promoted after the cluster's
// node timeout (cluster-node-timeout), but a dead node sends no MOVED, so
// a go-redis ClusterClient keeps routing its slots to the dead address until
// its periodic slot-map reload, about a minute later. The backend asks the
// client to reload its slot map whenever a call fails to reach a node, at
// most every 100 ms, so decisions for the dead primary's identifiers are
// degraded (their failure mode applies) until the promotion and decided
// normally again within one reload of it:
// TestClusterPrimaryKillRecoversAfterPromotion measured 55 ms to 90 ms.
// Nothing needs configuring for this; the promotion itself is what a lower
// cluster-node-timeout shortens. go-redis's own periodic reload
// (ClusterOptions.ClusterStateReloadInterval, 60 s by default) then only
// matters for topology changes no call notices, such as a node added
// without traffic; 10 s to 30 s is a reasonable setting where a cluster
// changes often, and the default is fine otherwise.
//
// Run a Cluster that limits with cluster-require-full-coverage no: with the
// default (yes), every node answers CLUSTERDOWN from the moment a dead
// primary is marked failed until its replica takes over (about 4 s with a
// 5 s node timeout, in the test above), so the identifiers of the live
// primaries are degraded too. With no, they are decided normally
// throughout (the test asserts 0 degraded among 270 decisions).
//
// # Resharding
//
// An identifier's state under a policy is one key, so a slot migration
// moves it whole: a decision finds it either on the source or on the
// target, and go-redis follows the ASK redirect to the target. A decision
// that still gets TRYAGAIN or an ASK go-redis could not follow is retried
// after 1 ms, then 2, 4, up to 20 ms apart, while the call's timeout
// allows. TestSlotMigrationCostsNoDecision moves a slot under a 10/s,
// 5000/h policy as redis-cli --cluster reshard does, and one key at a time
// with 30 ms pauses: about 2,000 decisions each time, 0 degraded, and every
// allowed unit counted. (Layout 2 kept a policy's limits in keys of their
// own, which a MIGRATE could leave on two nodes at once: the decisions in
// between waited on TRYAGAIN.)
//
// # Circuit breakers
//
// Each server has a circuit breaker (package breaker) by default: per node
// of a Cluster, per server of a standalone or Sentinel client, per primary
// and replica of each redisgroups group. WithBreaker configures them and
// WithoutBreaker turns them off. After 5 failures in a row
// that also last 250 ms (breaker.WithFailures, breaker.WithFailingFor), so
// that a moment when a loaded machine stalls every call in flight is not
// taken for an outage, a breaker opens and answers its server's calls at
// once with breaker.ErrOpen, and the throttler applies the failure mode: a
// decision costs about 25 µs instead of the per-call timeout (100 ms by
// default) while the server is down or hung
// (TestBreakerStoreStoppedAndRestarted). Every 250 ms it lets one probe
// through, on a fresh connection: the breaker marks the server's idle pooled
// connections stale when it opens and before each probe, so the connections
// an outage killed are not handed to the probe. Every client gets that pool
// hook, with or without breakers: a command that fails on the network marks
// the idle connections stale too. Recovery after a restart, kill -9,
// SIGSTOP, a black hole or reset connections, 10 runs each: at most 255 ms
// with breakers, 13.6 ms without (docs/DESIGN.md, Outages). The logs show
// one line when a breaker opens, one when it closes, and a count every 10 s
// while it stays open; the throttler's own log does the same for the outage
// as a whole (throttler.WithLogger).
//
// # Batching
//
// Batching is on by default wherever the client can pipeline (see
// WithBatching; WithoutBatching turns it off): the calls that arrive while
// a round trip is in flight go together in the next one, as one pipeline,
// one write and one read on the connection for many decisions. A call that
// finds nothing in flight goes out at once on its caller's goroutine, so a
// single caller sees no difference. Every call keeps its own deadline, and
// a failing call (a foreign value, a missed deadline) fails alone.
//
// On a standalone client (one server, Sentinel, or a group of package
// redisgroups) the decisions of a round trip go as one batch call per
// policy shape (see Scripts; decide_many.lua is the generic one), which
// decides them one after the other exactly as the lone script would
// (TestDecideManyMirrorsDecide) and answers in one flat array, so Redis
// pays its per-call cost once per round trip. Up to two round trips are in flight
// per server, each on a connection of the pool, so that the server runs
// one while the other's reply and the next request travel. On a Cluster,
// one per primary: the primaries run in parallel, so one round trip each
// keeps the store busy, and a second would halve every batch (about 20 %
// more decisions/s with one on the benchmark's 3-primary Cluster).
//
// On a Cluster each primary has a batcher of its own, fed by the client's
// slot map: a round trip carries the decisions of every slot that node
// serves, as one batch call per shape, and waits on no other node, so a
// node that dies or hangs delays only its own slots' decisions
// (TestClusterKillDegradesOnlyTheDeadNode: 0 degraded decisions on the
// live primaries over ten kills). The batch scripts are declared with
// allow-cross-slot-keys, which lets a script touch keys of several slots
// of its node if they are not declared: it declares its first key, for
// routing, and reads the others from its arguments. Redis still checks
// every command the script runs against the node's slots and the ACL's
// key patterns. A decision whose key the node does not serve (the client's
// slot map is behind a migration or a failover) is refused by the script
// before anything is written for it and goes again alone through the
// Cluster client, which follows the redirect; the client is asked to reload
// its slot map. Peeks go through the Cluster client unbatched, so a client
// that reads from replicas still does.
//
// # What Redis can lose
//
// The backend decides exactly as long as Redis keeps what it wrote. Three
// ways Redis does not, each measured by a test in this package:
//
//   - Eviction. Run Redis with maxmemory-policy noeviction. With any other
//     policy a full Redis evicts live windows (volatile-* policies too, since
//     every key here has an expiry), and an identifier that had spent its
//     quota is admitted again: in TestEvictionPolicy, with 2 MB and
//     allkeys-lru, 6,513 new identifiers were enough to evict a spent
//     window, which then admitted its owner. With noeviction the decisions
//     that need new memory fail instead (OOM, after about 4,100 new
//     identifiers there) and follow their failure mode, while spent quotas
//     stay spent. The first successful Ping reads the policy and logs a
//     warning unless it is noeviction; MaxmemoryPolicy returns it.
//   - Failover from a lagging replica. Replication is asynchronous: a
//     replica promoted after its primary died has only what it had
//     received. In TestLaggingReplicaFailoverLosesUnreplicatedUnits,
//     replication is cut after 100 units and the primary takes 50 more
//     before it is killed: the promoted replica counts 100 of the 150, so
//     those 50 are admitted again within their windows. WAIT or
//     min-replicas-to-write narrow the gap at a cost in latency; the
//     backend uses neither.
//   - Restart without persistence. Without RDB snapshots or an AOF, a
//     restarted server is empty and every window starts over
//     (TestRestartWithoutPersistenceResetsEveryWindow: 0 of 40 units remain
//     in 10 windows). With appendonly yes and appendfsync everysec, at most
//     about a second of decisions is lost.
//
// # Failures
//
// A network failure, a timeout, a foreign value or a reply of the wrong
// shape (ErrUnexpectedReply, as a proxy might send) is returned as an
// error, never as a verdict and never as a panic; the throttler then
// applies the policy's failure mode and marks the result degraded.
package redisbackend
