// Package memcachedbackend (import path
// github.com/throttlekit/throttlekit/backend/memcached) is a throttlekit
// backend over memcached, through
// github.com/bradfitz/gomemcache. It keeps the old limiter's idea, a count
// plus a stored window end, and meets the same contract as every other
// backend (docs/SPEC.md), including under concurrency, evictions and lost
// servers. Where memcached cannot give the exactness of one atomic script,
// this page says precisely what can happen.
//
//	client, err := memcachedbackend.NewClient(100*time.Millisecond, "10.0.0.1:11211", "10.0.0.2:11211")
//	backend, err := memcachedbackend.New(client, memcachedbackend.WithPrefix("api"))
//	th, err := throttler.New(backend)
//
// docs/DESIGN.md gives the window protocol below as a numbered argument.
//
// Backend implements driver.Backend, Peeker, Refunder, Resetter, Pinger
// and Seeder (see Seeding). It does not implement driver.Leaser: concurrency limits
// (throttler.Throttler.Acquire) are unsupported, and Acquire over this backend
// returns an error wrapping errors.ErrUnsupported that says so (see
// Concurrency limits below).
//
// # Items
//
// Memcached offers atomic operations on one item only: add (store if
// absent), cas (store if unchanged since read), incr and decr. The design
// gives every operation one item to be atomic on. For limit i of one
// identifier under one policy:
//
//   - The window item W holds "end token": the end of the open window, in
//     Unix milliseconds, and a random 64-bit token naming this incarnation
//     of the window. Only add (no item) or cas (over the item read) writes
//     it, so of several requests that find no open window exactly one
//     opens it.
//   - The counter C(end, token) holds the units used in that incarnation
//     and is named after it. It is created by add, with the opener's cost,
//     before W points to it; afterwards only incr and decr touch it, but
//     for the one compare-and-swap that retracts it (see "Concurrency") or
//     forwards it to the window a Seed replaced it with (see "Seeding").
//     It is never created again: a window that loses its counter is
//     reopened under a new token instead.
//   - A GCRA limit has one item G holding the theoretical arrival time in
//     Unix microseconds, written by add or cas.
//
// Because a counter's name carries its window, no result can pair one
// window's count with another window's end, whatever was evicted.
//
// # Keys
//
// Every key is route "|" kind ":" limit, where
//
//	route = prefix ":" policy ":" identifier   (each part driver.EscapeKey'd)
//	limit = driver.Policy.Limits[i].Key           (key layout 2, below)
//	kind  = "w" window item, "c" counter (then ":" end ":" token),
//	        "g" GCRA item, "s" sliding-window item
//
// The limit part is [escaped name] ":" algorithm ":" window in
// milliseconds, then ":" burst for a GCRA limit whose burst was set
// explicitly; the name is empty for an unnamed limit. Max is no part of
// it, so raising or lowering a limit's Max keeps its open window. The
// window item of an unnamed "10/s" for identifier "user 7" under policy
// "api" with prefix "tk" is "tk:api:user%207|w::fixed:1000"; the same
// limit named "burst" is under "tk:api:user%207|w:burst:fixed:1000", and
// "50/h gcra burst=9" under "...|g::gcra:3600000:9" (ItemKeys lists an
// identifier's items). Items written under key layout 1, whose unnamed
// limits held their notation with Max ("10%2Fs:fixed:1000"), are not read
// by a Backend alone: a deployment upgraded with live windows wraps it in
// rollout.UpgradeKeys, which reads the layout-1 items (through
// rollout.KeyLayoutV1) and seeds their windows into the layout-2 keys (see
// Seeding), so that no window restarts. That is for a deploy after the last
// process of the old release stopped; while one may still decide, it
// counts in the layout-1 items only, and the new processes decide there
// too: a mirror-mode rollout at 0 % from rollout.KeyLayoutV1(b) to b, then
// at 100 % (docs/MIGRATION.md, "Upgrading throttlekit").
//
// EscapeKey leaves only letters, digits, '-', '.', '_' and "%XX", so keys
// hold no space or control byte and the separators ':' and '|' cannot come
// from the parts: distinct (prefix, policy, identifier, limit) tuples never
// share a key. A route longer than 120 bytes (a 1024-byte identifier
// escapes to up to 3072) is replaced by "#" and the hex SHA-256 of the
// plain route, and so is a limit part longer than 65 bytes. '#' never
// appears in an escaped part, so a hashed part cannot equal a plain one,
// and two hashed ones differ unless SHA-256 collides. The longest key is
// 120 + 3 + 65 + 1 + 20 + 1 + 16 = 226 bytes, under memcached's 250. The
// prefix (WithPrefix) is escaped too and limited to MaxPrefixLen bytes.
//
// # Deciding
//
// Decide with cost n at now (from the request, never from a clock of the
// backend or the server) runs:
//
//  1. One multi-get of every W and G item of the policy. A window whose
//     end is at or before now is closed, whatever the item still holds.
//  2. When a window must be opened, a GCRA limit already denies on what was
//     read, or n exceeds a limit's capacity: one multi-get of the open
//     windows' counters, then driver.Decide on that snapshot. A denial
//     here writes nothing.
//  3. Units are taken limit by limit, in three ranks, each in policy
//     order: (a) fixed windows that did not start at now: windows opened
//     at an earlier reading, and aligned windows whose slot began before
//     now; (b) GCRA limits; (c) fixed windows that start at now: windows
//     opened at this very reading and every anchored window still to open.
//     An open window: incr C by n; the new value is allowed iff it is at
//     most Max. No open window: add a new counter C(end, new token)
//     holding n, then publish it with add (no W) or cas (over the closed W
//     read); on losing, delete the unpublished counter, reread W and incr
//     the winner's counter, at the same place in the order. A GCRA limit:
//     compute the new TAT from the item read with the reference
//     arithmetic; denied stops; allowed writes it by cas (add when absent);
//     a lost race rereads and recomputes, at most WithCASRetries times,
//     then fails with ErrRetriesExhausted. A counter found evicted or
//     retracted makes its window one to open again; when that window
//     would start at now the opening moves to rank (c).
//  4. On a denial or a failure in 3, every unit taken is given back,
//     newest first: decr on counters, a refund by cas on GCRA items; each
//     window the request opened and nobody else counts in is retracted
//     (see "Concurrency"). On a denial the counters of limits not reached
//     are read (one round trip) so that the result names the right binding
//     limit.
//
// Round trips, counted by Stats (TestRoundTrips pins them): an allowed
// decision in open windows takes 1 + one per limit (2 for a one-limit
// policy, 4 for three). Opening a window takes two instead of that
// limit's incr (add the counter, publish it), plus the read of step 2 when
// other windows are open. A denial by a one-limit fixed window takes 3
// (get, incr, decr); a denial a GCRA limit makes on the first read takes 1;
// a denied request that retracts a window it opened takes two more (read
// the counter, swap it). Peek takes 2, or 1 when no window is open. A
// counter a Seed forwarded costs one more read per marker followed, and a
// request that follows one also points the window item past it (one more).
// The contract's one round trip per decision is for stores with
// server-side scripts; memcached has none.
//
// # Concurrency
//
// Every interleaving below was considered; the tests reproduce the
// interesting ones against a real server (with hooks between round trips).
// "One clock reading" means requests that decide with the same now, as
// those of one burst through one throttler's clock do.
//
// Two requests find no window, or the same closed one. Each adds a counter
// of its own (distinct tokens), both try to publish; add, or cas against
// the same CAS id, lets exactly one win. The loser's counter was never
// published, so its units were never visible; it deletes it and incrs the
// winner's. No count is lost or doubled, and every result of the window
// carries the winner's end. If the loser's delete fails, the orphan is
// read by nobody (its token is published nowhere) and expires.
//
// A request reads an open window, and before its incr another request (a
// later clock reading) finds it closed and opens the next. The first
// request counts in the window open at its own reading, and its result
// carries that window's end with that window's count.
//
// A reader never finds W pointing at a counter that does not exist yet:
// the counter is created before W is published. So a missing counter
// means eviction (see below), and a retracted one, a window closed again
// by its opener (below): either way the window counts as absent.
//
// One order. At one clock reading and without eviction, every request
// puts every limit in the same rank of step 3, whatever it read: a window
// that started before now is open for everyone, and a window that starts
// at now has that start whether a request finds it open (opened at this
// reading) or closed (it would open it). So all requests take their units
// in one global order; both arguments below rest on it. (Ordering by
// "open first, openings last" alone would not: two requests that read a
// window before and after its opening would take two limits in opposite
// orders, and could each hold the last unit of one limit while being
// denied by the other.)
//
// Cost 1 is exact: an incr returns the count including every unit added
// before it, so no request is allowed beyond Max. A counter exceeds Max
// only by units of requests about to be denied, which give them back.
// A request denied at limit j because of units held by requests that are
// denied later in the order leads, step by step, to the last limit, where
// the first denial sees only units of allowed requests: that limit is
// full, and no more requests could have been allowed. So with cost 1, one
// clock reading and no eviction, exactly as many requests are allowed as
// fit in the tightest limit, as the conformance suite and
// TestConcurrentCostOneMatchesSerialDecisions check. A retraction (below)
// happens only on a counter holding zero, and whoever finds it reopens the
// window in the same rank, so it changes neither count nor order.
//
// A denied request opens nothing. Anchored windows are opened in rank
// (c), after every older window and every GCRA limit has taken the
// request's units, so a request that has opened window j can then be
// denied only at a later window k of rank (c). At one clock reading that
// happens in one way only ("two openings"): it found k closed too, lost
// k's publish to a racing opener, and the winner's window was full after
// its incr (with k of Max 1, one racing request suffices). Whatever the
// reason, a denied or failed request gives its units back, newest first,
// and retracts each window it opened that nobody else counts in: it reads
// the counter with its CAS id and, if it holds zero, swaps in a marker
// (retractedValue) by cas. Every incr changes the CAS id, so the swap
// fails exactly when someone counted in between, and nobody can count in
// a retracted counter: an incr that finds the marker counts nowhere and
// reopens the window, as after an eviction. A call whose publish timed out
// without saying whether it was stored retracts alike. Aligned windows
// whose slot began before now are opened in rank (a) and retracted alike;
// an empty aligned window would anyway be indistinguishable from none
// (same end, counting from zero).
//
// At one clock reading and without eviction, no opening by a denied
// request survives, for any cost. Every unit in k's new window belongs to
// a request that went through j before k, and j's only window at this
// reading is the one the denied request opened (whoever reached j before
// would have published j instead), so each of them counts in it. The
// first request that k's new window denied found in it units of requests
// that had passed k; each of those is allowed, or denied at a later full
// window of rank (c), and the same step repeated ends at the last window
// of rank (c), whose passers are all allowed. So an allowed request goes
// through j: j keeps its units and is exactly the window it would have
// opened itself (same now, same end), or, if j was retracted before it got
// there, it reopens j with that same end. TestDeniedRequestOpensNothing
// runs this race.
//
// At different clock readings one corner remains, for any cost, cost 1
// included; it is this backend's documented limitation. A request S at an
// earlier reading may still count in the previous window of j (open at
// its reading) while R, at a later one, opens the next j, then loses k to
// S and is denied. Nobody counts in R's j, and the retraction closes it
// (TestDeniedRequestOpensNothing shows this too). R's j survives only if
// another request T counted in it between R's publish and R's check of the
// counter (T may be S itself, had S read j after R's publish). If T is
// allowed, j holds T's units but ends at R's reading + Window rather than
// T's. If T is denied too and gives its units back only after R's check,
// j stays open and empty until R's reading + Window: a window opened by
// denied requests. That takes requests at different readings across the
// end of a window, two windows to open in one request, and another
// request within one round trip of its check;
// TestDeniedOpeningResidualAcrossReadings reproduces it. A retraction
// that fails (a server error, counted in RollbackFailures) leaves the
// window open the same way. None of this ever admits more than Max in a
// window.
//
// The cost-1 argument holds for any cost that is the same for every
// request. Mixed costs are weaker, and this is the backend's documented
// limitation (declared to the conformance suite through its Limitations
// interface as CostAboveOneInexactUnderConcurrency). A request of cost n
// that does not fit holds its n units in the counter between its incr and
// its decr, one round trip. A smaller request that would fit and incrs in
// between sees them and is denied: a spurious denial. It is never an
// over-admission: every allowed unit is counted before it is allowed, and
// once the give-backs are done the counter holds exactly the allowed
// units. TestCostAboveOneMayDenySpuriouslyNeverOverAdmits shows both.
// With several limits and mixed costs it happens at every limit: units
// taken at earlier limits are held until a later limit's denial gives them
// back.
//
// GCRA writes never hold units they do not keep: a cas either commits the
// new TAT or fails. Within one Backend, the calls that write a GCRA or
// sliding-window item take turns per identifier and policy, one at a time
// in the order they asked (docs/BACKENDS.md, "Compare-and-swap stores"):
// a call reads its items, and once they leave it something to write, it
// waits for the calls of its Backend that asked before it, and reads again
// if one of them ended its turn meanwhile. A call denied on what it read
// waits for nobody, and policies of fixed windows alone, counted by incr,
// take no turns. So the callers of one process never lose a race to each
// other, only to other processes; after a lost race a caller waits a
// random time (up to 50 µs, doubling with each attempt, at most 5 ms) so
// that the racing writers spread out. At one clock reading a GCRA item
// changes at most Burst times before every request is denied without
// writing, so a request loses at most Burst races. DefaultCASRetries is
// above common bursts, and the call's context bounds the time anyway, the
// wait for a turn included (its error then says so).
//
// On one identifier decided by 64 goroutines (TestHotIdentifierContention:
// one memcached, two shared cores, GCRA, sliding window and a fixed window
// beside a GCRA limit), the turns took the retries from 1.2-3.3 per
// decision to none in one process and to 0.2-0.6 over two, the p99 of a
// decision from 50-140 ms to 23-54 ms, the longest from 125-370 ms to
// 27-80 ms, and the retries exhausted (each a degraded decision) from up
// to 4 in 6,400 to none. The median rose from 0.5-7 ms to 8-26 ms: every
// caller waits its turn instead of the lucky ones passing first. That
// identifier's writes within a process are serial, two round trips each
// (the read under the turn and the write): on a quiet machine its
// throughput fell from 4,500-5,600 decisions a second to 2,500-3,900; on a
// loaded one (load average 10) it was the same or better, the retries no
// longer competing for the CPU. Other identifiers never wait.
// Exhausting the retries is an error wrapping ErrRetriesExhausted: the
// throttler applies the policy's failure mode and passes the error to its
// Observer (Event.Err, matchable with errors.Is), and Stats counts it in
// RetriesExhausted, with every lost race in CASConflicts. Under FailOpen
// such a request is let through: where contention must never admit more,
// use FailClosed or more retries.
//
// The give-back runs on a budget of its own, one client Timeout from its
// start, not on the call's context: a call whose context ends mid-way (a
// cancelled caller, the throttler's per-call timeout, a fail-closed
// denial after a timeout) still gives back what it took. The call waits
// for the give-back only while its context lasts; after that the
// give-back finishes in the background, within its budget. Only a
// give-back that fails (a server error, a server silent for that whole
// budget) leaves its units counted until their window closes, which can
// deny, never over-admit. Stats counts these in RollbackFailures.
//
// # Seeding
//
// Backend implements driver.Seeder, by which a rollout carries an
// identifier's windows over from another store (mirror and split modes, a
// key-layout upgrade, a hand-written limiter's counters). Seed merges the
// given states into the stored ones as driver.Merge does and then, for a
// cost above zero, decides that cost as Decide does. memcached offers
// atomic operations on one item only, so Seed is not the one atomic step
// driver.Seeder describes: each limit's merge is atomic on its own, one
// compare-and-swap on one item, and the decision is an ordinary Decide
// made after the last merge. Per limit:
//
//   - GCRA and sliding window: the item as read (the snapshot), merged,
//     written back by cas (add when absent); a lost race rereads and
//     merges again.
//   - Fixed window, and the merge changes nothing (the given state counts
//     nothing at now, or the open window already holds as many units of
//     the same window): nothing is written.
//   - Fixed window, none open (no item, a closed window, a counter evicted
//     or retracted): the given window is opened as a request opens one, a
//     counter under a new token holding the given count, then W written
//     to name it by add or by cas over the W read. A lost publish rereads
//     W and merges again.
//   - Fixed window, one open and the merge changes it (a larger count,
//     given for the same window or for another open one: Merge keeps the
//     open window's End and takes the larger count): the window is
//     replaced by itself with the larger count. A counter C' under a new
//     token is created for the same End with the merged count; then the open window's counter C is swapped, by
//     cas over its read, for the forward marker "fwd end token" naming C';
//     then W is pointed at C' by cas over the W read. The swap is the
//     merge's atomic step: every incr and decr changes C's CAS id, so the
//     swap fails, and the merge starts again from W, if anyone counted in
//     between; after it, memcached refuses every incr and decr on C (its
//     value is no number), so nobody counts in the old window any more.
//
// Lost races are retried at most WithCASRetries times, with the backoff
// of GCRA writes, and then fail with ErrRetriesExhausted
// (TestSeedRetriesLostRaces).
//
// Everyone follows the marker. A request whose incr on C is refused reads
// C, follows the markers to the counter that holds a number, counts there,
// and points W at it by cas over the W it read, so a Seed that stopped
// between its swap and its write of W (a crash, a timeout) costs later
// requests nothing once one of them has passed. Counter reads (Peek,
// Decide's check, a denial's figures, Seed itself) follow markers without
// writing, one round trip each, at most 64 in a row (ErrRetriesExhausted
// beyond: each Seed adds one and then points W past it, so chains stay as
// short as the replacements racing each other). A marker to a window
// already closed at now, or to a counter evicted, reads as no window, as
// an evicted counter does. A marker lives as long as either window it
// joins.
//
// What a concurrent observer can see:
//
//   - One limit's merge is linearizable: a request that counted in the
//     window before the swap is in the count the merge read, one that
//     counts after it counts in the new window on top of the merged count.
//     Neither a request nor another Seed can undo a merge: two Seeds of one
//     window end holding the larger count, in either order, and no unit is
//     ever admitted twice (TestConcurrentSeedsKeepTheMax,
//     TestSeedRacingDecideNeverOverAdmits). A window is never taken back
//     other than as Merge itself says (a given window that differs from an
//     open one replaces it).
//   - Between the merges of two limits of one policy, a request sees the
//     first merged and the second not yet.
//   - With a cost, another request may count between the last merge and
//     the decision, which then sees its units as any later Decide would.
//     Outcome.Prior holds each limit's state just before its own merge;
//     Outcome.States the states the decision left (the merged ones for
//     cost 0).
//   - A fixed-window count above Max reads as Max in Outcome.Prior and in
//     the merge's result (units above Max belong to requests about to give
//     them back, or to a Max lowered since, which deny alike), while the
//     decision to write compares the given count with the count as stored,
//     so a Seed never writes a count below the stored one.
//   - Units a request holds between its incr and its decr before it is
//     denied (see "Concurrency"). A Seed that replaces the window writes
//     the merged count without them, and the request's decr, refused by
//     the marker, gives back nothing: exact. A Seed whose given count lies
//     above the count without those units but not above the count with
//     them writes nothing, and once they are given back the window holds
//     fewer units than were given, by at most that request's cost
//     (TestSeedMeetsUnitsAboutToBeGivenBack shows both). Such units exist
//     below Max only when a policy has several limits or requests cost
//     more than 1, the cases already documented as inexact. It never lets
//     one store admit more than Max in a window by its own count; over the
//     given store's count and this one's together it can admit up to that
//     cost more.
//
// The arguments of "Concurrency" are about requests alone: a Seed may
// raise a count or replace a window between two requests' round trips,
// as described here.
//
// Round trips (TestSeedRoundTrips): one to read W and the GCRA and
// sliding items, one more for the counters of open windows; then, per
// limit whose merge changes it, one for a GCRA or sliding item, two to open
// a window, three to replace one. A Seed that changes nothing writes
// nothing. A cost above zero adds a Decide.
//
// # Eviction
//
// Memcached may evict any item at any moment, most of all when it is
// shared with application caches. At worst an eviction restarts a window
// as a fresh one; it never corrupts one:
//
//   - W evicted: the next request finds no window and opens a fresh one
//     (anchored: ending at now + Window; aligned: at the same aligned end)
//     with a new token and a new counter from zero. Requests that read the
//     old W before the eviction finish in the old counter and report the
//     old end with the old count. Nobody reads the old counter again; it
//     expires.
//   - C evicted while W is open: the next incr finds no counter. The
//     request reopens the window by cas over the W it read (one request
//     wins, the others find the new window and count in it) rather than
//     recreate the counter; an anchored window is reopened in rank (c),
//     after the request's other limits. This is why counters are never recreated: a
//     denied request's decr that arrives after the eviction gets "not
//     found" instead of taking units from a fresh count, so no incarnation
//     ever admits more than Max. Stats counts these in WindowsLost.
//   - G evicted: the bucket is forgotten, i.e. full. A cas by a request
//     that read it before fails and retries from the absent state.
//
// So a result is always either the same window counting on, or a fresh
// window with its count from the start; the end it reports never moves
// within a window, and never pairs an old count with a new end.
// TestEvictionRestartsWindowsNeverCorruptsThem checks exactly this against
// a 2 MB memcached flooded with other items.
//
// # Expiry
//
// Expirations are garbage collection only, never a decision: a window is
// closed when its end is at or before the request's now, whatever the
// item's expiry. Items expire at least 33 seconds after their state
// stops mattering (window items at their end, counters a second later, GCRA
// items at their TAT), computed from the request's now and rounded up to
// whole seconds: the contract's 30 s of grace for clocks that differ
// between hosts, plus three for memcached's own clock, which ticks once a second from a timer and lags further when that
// timer fires late on a loaded host. An item that expired before its
// window ended would make the next request open a new window, a reset time
// that wobbles without any error.
//
// A publish of a window item that times out may still have been stored, so
// its counter is then never deleted: someone may have read the item and
// counted in it since. The rollback gives its units back and retracts it
// if it then holds nothing, which is right whether or not the item was
// stored. memcached reads an expiration above 30 days as an absolute Unix
// time, so longer lifetimes (windows up to 400 days, GCRA
// spans beyond) are converted with this host's wall clock, plus a day of
// margin for clock differences between hosts; an absolute time past 2038
// (memcached's 32-bit field) becomes "never expires", left to eviction.
//
// # Servers
//
// gomemcache's default ServerList places a key by a CRC modulo the number
// of servers, which remaps about three quarters of the keys when a fourth
// server joins three. RendezvousSelector (used by NewClient) places keys by
// rendezvous hashing: a fourth server takes about a quarter of the
// identifiers, and a lost server moves only its own. It hashes only a
// key's route, the part before '|', so every item of one identifier under
// one policy lives on one server and its limits are decided there. A
// server that stops loses the state it held and nothing else; decisions
// for its identifiers fail (and the failure mode applies) until it answers
// again, state starting afresh.
//
// The backend keeps, per server, a gomemcache client of its own, with the
// Timeout, MaxIdleConns and DialContext of the client given to New (read
// when it first talks to that server), and a circuit breaker (package
// breaker), on by default: WithBreaker tunes them, WithoutBreaker turns
// them off, Breakers reports them (for observe/prometheus's WithBreakers
// and the debug page). A breaker opens once its server has failed 5 round
// trips in a row over at least 250 ms (network errors and timeouts; any
// answer, an error reply included, is a success). The calls for the
// identifiers that server holds then fail at once with an error wrapping
// breaker.ErrOpen and naming the server, which the throttler answers by
// the policy's failure mode without a round trip; every 250 ms one call
// goes through as a probe, and the first one answered closes the breaker.
// Every other server's identifiers see nothing of it: their connections,
// their breakers and their calls are their own. A failure on a dead or
// silent connection closes the idle connections to that server alone (the
// others to it most likely died with it), and so does its breaker when it
// opens and before each probe, so that the probe dials afresh.
//
// The figures (TestOneServerOfThreeLost: three servers, 64 goroutines
// deciding every 20 ms over 300 identifiers, one server hung by SIGSTOP
// for 10 s or killed and restarted, 100 ms Timeout, 10 runs of each, two
// shared cores at a load average of 3 to 7). The hung server's breaker
// opened 353-364 ms after the signal: until then each of its identifiers'
// decisions waited the Timeout (median 100.7 ms), as every one of them did
// for the whole outage without breakers; from then on the open breaker
// answered them in a median 10 µs (p99 at most 160 µs), bar one probe
// every 250 ms plus its Timeout. A killed server's breaker opened 253-262
// ms after the kill (its decisions failing at once meanwhile, connection
// refused), and answered alike. The other servers' identifiers had 0
// degraded decisions in the 20 runs, and a p99 during the outage of 1.9-10
// ms against 1.9-25 ms before it, no higher in any run. (In an earlier
// batch, two of ten kill runs had 3 and 49 such decisions degraded, calls
// that ended 100 to 400 ms after they began, some 170 ms past their
// deadline: the process itself ran late, on a machine shared with other
// test suites; the test's assertions therefore run with a Timeout of 1 s
// by default.) Decisions were normal again 10-228 ms (median 38 ms after
// SIGCONT, 138 ms after a restart) after the server was back. Healthy
// servers under load do not trip their breakers: with 64 goroutines
// deciding as fast as they can on two shared cores at a load average of
// 11 (-race), hundreds of calls out of 48,000 in 20 s timed out, as many
// as without breakers, and no breaker opened (TestBreakersStayClosedUnderLoad
// measures it again).
//
// A breaker needs to know which server holds a key. A client of NewClient
// tells it; for one built with memcache.NewFromSelector over a
// RendezvousSelector, give the selector with WithSelector. With any other
// client the backend sends every call through that client as it is, with
// no breaker (WithBreaker is then an error); breaker.Wrap puts one breaker
// in front of the whole backend, which a hung server then opens for every
// identifier.
//
// # Timeouts and contexts
//
// gomemcache takes no context and cannot be interrupted. Each round trip
// is bounded by the client's Timeout, which NewClient sets (100 ms, as
// throttler.DefaultCallTimeout, unless told otherwise): the read and write
// together, and a dial for a new connection, each within it. The backend
// checks the call's context before every round trip and starts no other
// once it is done. A stopped server fails at once (connection refused); a
// hung one costs the round trip under way its whole Timeout, until its
// breaker opens (see Servers).
//
// So a call can outlast its context, hence the throttler's per-call
// timeout, by up to one client Timeout: the round trip under way when the
// context ends cannot be interrupted and runs to its own end (up to two
// Timeouts when it also had to dial a new connection that took nearly
// one). Keep the client Timeout at or below the throttler's per-call
// timeout, and well below it where a call's worst latency matters: the
// worst case is about the per-call timeout plus one client Timeout. A
// give-back the call still owes then (see "Concurrency") does not add to
// this: it goes on in the background, within its own budget of one client
// Timeout (plus its last round trip). A round trip cut short can leave its
// write applied; an incr whose decr never happens is an over-count until
// its window closes, which can deny, never over-admit.
//
// # Peek, Refund, Reset
//
// Peek reads and never writes; it follows forward markers (see Seeding).
// Refund decrs the counters of open windows (memcached stops at zero),
// following forward markers to the live window, and moves GCRA items back
// by cas; limits are refunded one after another, not atomically, and a
// refund that reads a window just before a request at a later clock
// reading opens the next gives back in the old window, which is the
// "refund after the window closed does nothing" rule. Reset deletes the
// window items, the counters they name and those these forward to, and
// the GCRA and sliding-window items; a request racing it may still count
// in the window it read before.
//
// # Concurrency limits
//
// A concurrency limit needs a set of leases per identifier that one atomic
// step can clean of expired members, count and extend. memcached has no
// such operation: a set kept in one item would need a cas loop that
// contends on every acquisition and release of a busy identifier, and an
// evicted item would free every slot at once. The backend therefore
// declares the feature unsupported rather than offering a weaker one:
// throttler.Throttler.Acquire returns an error wrapping errors.ErrUnsupported, and
// the conformance suite skips its lease subtests. Use the memory or Redis
// backend for concurrency limits, or a rollout to Redis.
package memcachedbackend
