// Command migrate-demo moves an HTTP API's rate limiting from memcached to
// sharded Redis while the API is under load, with windows already open in
// the old store, and checks that no client notices: no reset time changes
// and no quota is granted twice, across every move, in mirror mode and in
// split mode.
//
//	make demo            # go run ./cmd/migrate-demo, on real servers (installs them when missing)
//	make demo-embedded   # the same on in-memory backends
//	go run ./cmd/migrate-demo -short   # about 40 s
//
// # What runs
//
// The demo starts, on free loopback ports, one memcached and two Redis
// groups of one primary and one replica each (internal/localserver; the
// binaries come from PATH, or from $MEMCACHED and $REDIS_SERVER), unless
// -memcached or -redis-shards name servers that already run. The old store
// is backend/memcached; the new one is backend/sharded over the two Redis
// groups, built from the same configuration string -redis-shards takes.
//
// The run goes through each mode of -mode, mirror and then split by
// default, on the same servers but on keys of its own (a prefix unique to
// the run and the mode), so that no mode inherits another's counts. Each
// mode tells the whole story of a migration:
//
//  1. Before the deploy (the warm-up, one window of the policy's shortest
//     limit unless -warmup says otherwise), the API runs on the old store
//     alone: half of the clients (-legacy) are limited by a hand-written
//     limiter of the kind throttlekit replaces, counting in memcached in
//     the classic layout (INCR on a counter key, its window's end in Unix
//     seconds under "<key>:reset_at"); the others by a plain
//     throttler.Throttler over backend/memcached. Clients are calling, so
//     both hold live windows when the deploy comes.
//  2. The deploy swaps, in one step, the API's limiter for a throttler over
//     a rollout.Backend in the mode under test, from the old store to the
//     new one. Its old side is itself a split rollout at 100 % from
//     backend/legacy (a read-only view of the hand-written limiter's
//     counters) to backend/memcached: each legacy client's first decision
//     carries its open window into memcached before deciding, as the way
//     in from a hand-written limiter (docs/MIGRATION.md) does it.
//  3. The rollout ramps -ramp, 0% → 10% → 50% → 100% and back down to 50%
//     and 0%, one phase of 5 s per step, by a static percentage, or by
//     whatever an Unleash toggle says when -unleash-url is given (the demo
//     then sets nothing and prints the toggle's percentage per phase).
//     Both hash identifiers with the toggle's name as group ID, so a
//     static ramp and the toggle move the same identifiers at the same
//     percentage.
//
// Clients keep calling through every phase, and the deploy and every step
// fall in the middle of open windows: clients start one after another
// over most of the warm-up, and a window (10 s) is longer than a phase, so
// that windows open and close out of step.
//
// After the modes, on the servers (not with -embedded or
// -rolling-deploy=false), the rolling deploy from the hand-written limiter
// (issue 27, items 3 and 7; docs/MIGRATION.md, Step 0), on keys of its
// own. The API runs as three processes behind a round-robin, each request
// going to the next, and every client starts on the hand-written limiter.
// Its policy is the one limit the hand-written limiter counts (the
// policy's shortest fixed window) and nothing else, as Step 0 says, at a
// window of at most 5 s with the same rate ("15/5s" for "30/10s"), so that
// windows roll over while old and new code serve together; the summary
// names it. Four phases:
//
//	old only     one window: the three processes run the hand-written limiter
//	overlap      three windows: a rolling deploy replaces one process at the
//	             start, one halfway and the last at the end by new code, a
//	             throttler over a mirror rollout at 0 % from backend/legacy
//	             with Deciding (counting in the hand-written limiter's keys, as
//	             the old code does) to the Redis groups, written alongside
//	100% mirror  no old process left: each new process goes to 100 %, a tenth
//	             of a window apart (the Redis groups decide, the legacy keys
//	             are still written), for a window and more
//	Redis alone  one window: a second rolling deploy puts a throttler over the
//	             Redis groups alone in their place
//
// Responses the new processes decided in the legacy keys name the store
// "legacy/deciding": the same store as the hand-written limiter's
// ("legacy"), so that a client served by old and new processes in turn
// makes no move; its move to Redis comes at 100 %.
//
// Then, on the servers the demo started (not with -embedded,
// -redis-shards or -stall=false), the stalled Redis group: the API decides
// on the two Redis groups alone through a throttler and backends with
// their default options (call timeout 100 ms, batching on), twice as many
// clients call it (400), and group a's primary is stopped with SIGSTOP for
// 250 ms at the start of every second, for one phase of three ramp phases
// (15 s; 3.75 s with -short). Calls to the stopped group time out and the
// middleware marks their responses degraded, which is allowed; every other
// response must be the store's own verdict.
//
// The modes replace the API's one process in one step (deployAtOnce); the
// rolling deploy replaces its three one at a time (rollingDeploy).
//
// Mirror mode decides on the store that serves an identifier and writes
// the states it decided to the other store (driver.Seeder), so both hold
// the same windows from each identifier's first decision after the deploy
// on: a move then keeps its count and its reset time. It needs the ramp to
// begin at 0% (the old store must decide each identifier once before it
// moves). Split mode sends each identifier to one store only and, when it
// may have moved, seeds the serving store from the other one before
// deciding. -seeding=false shows what happens without it: moved
// identifiers start afresh, and the verdict fails.
//
// A load generator drives 200 clients over loopback HTTP, one goroutine
// and one API token each ("Authorization: token demo-0042"; the API limits
// the token's SHA-256, and so does the hand-written limiter). A tenth of
// them are abusive: they send four times what the policy "30/10s, 600/h"
// allows. Every client sends its requests one after another and checks
// each response against what it saw before.
//
// The first SIGINT or SIGTERM stops the load and shuts the API and the
// servers down; a second one kills the process. Servers are started with a
// parent-death signal on Linux, so not even SIGKILL leaves them behind.
//
// # Flags
//
//	-embedded            in-memory backends: memory for the old side, sharded over two
//	                     memory shards for the new; no hand-written limiter (it needs
//	                     memcached); for machines without the servers
//	-short               quick profile: policy "6/2s, 600/h", phases of 1.25 s, normal
//	                     clients at 1.5 req/s, abusive ones at 8 req/s
//	-mode list           rollout modes, run one after another (mirror,split); one
//	                     mode runs that mode alone; shadow compares and never moves
//	                     state, so its verdict fails once identifiers move
//	-seeding b           split mode seeds a moved identifier's store (true)
//	-warmup d            time on the old store alone before the deploy (one window of
//	                     the policy's shortest limit)
//	-duration d          length of each ramp phase (5s; 1.25s with -short)
//	-ramp list           percentages on the new backend, one per phase (0,10,50,100,50,0)
//	-identifiers n       clients, one token each (200)
//	-abusive f           fraction of abusive clients (0.10)
//	-legacy f            fraction of clients on the hand-written limiter before the
//	                     deploy (0.5; none with -embedded)
//	-rate r              requests per second of a normal client (2; 1.5 with -short)
//	-abusive-rate r      requests per second of an abusive client (12; 8 with -short)
//	-policy s            the limits, in throttler.ParsePolicy's notation; fixed
//	                     windows only (the hand-written limiter counts the first)
//	-memcached addr      a running memcached; env MIGRATE_DEMO_MEMCACHED
//	-redis-shards cfg    running Redis shards, "a=redis://h:p?replica=redis://h:p,b=...";
//	                     env MIGRATE_DEMO_REDIS_SHARDS
//	-unleash-url url     Unleash API, e.g. https://unleash.example.com/api/;
//	                     env MIGRATE_DEMO_UNLEASH_URL
//	-unleash-token tok   its client token; env MIGRATE_DEMO_UNLEASH_TOKEN
//	-unleash-feature f   the toggle (throttlekit.redis-rollout): a flexibleRollout whose
//	                     groupId is the toggle's name; env MIGRATE_DEMO_UNLEASH_FEATURE
//	-tolerance p         allowed gap between measured and target share, in points (5)
//	-call-timeout d      bound of each backend call (500ms; see Timeouts)
//	-progress d          interval of the progress line, 0 for none (1s; 500ms with -short)
//	-v                   print the full log (every phase's table) as the run goes
//	-report path         the HTML report; the full log goes beside it as .log (a file named
//	                     after the run's start in the system's temporary directory)
//	-rolling-deploy b    run the rolling deploy from the hand-written limiter after the
//	                     modes (true; not with -embedded)
//	-stall b             run the stalled Redis group at the end (true)
//
// When a server binary the run needs is missing and -embedded is not given,
// the demo says which one and how to get it, and exits with status 2.
//
// # What the clients check
//
// X-RateLimit-Reset is the binding limit's window end rounded up to a
// second, R: the window ends within (R-1, R]. Every client follows, per
// limit (the RateLimit field's member name), the window its responses
// showed last, named by R, and judges each response against it:
//
//	ResetAt change  a response showing another R although it was received
//	                before R-1 (the window was certainly open, so the same
//	                window must have decided it), or an R that goes back
//	double grant    a response of the same window (same R) that gives a
//	                quota twice: allowed beyond the limit (more allowed
//	                responses in the window than X-RateLimit-Limit, or a Used
//	                above it), allowed without spending a unit (Used not
//	                above an earlier Used of the window), or any response
//	                whose Used is below an earlier one (units given back,
//	                to be granted again); a client is the only one spending
//	                its token's quota, one request at a time, so each
//	                allowed request must raise Used
//	429+quota       a denial that claims quota: X-RateLimit-Remaining > 0 or
//	                RateLimit r > 0, or the throttler's own Remaining > 0.
//	                The middleware forces the two headers to 0 on every
//	                denial, so the API also sends the throttler's figures on
//	                a 429 (X-Demo-Result-Remaining, X-Demo-Result-Used), and a
//	                store that denies while it still holds quota shows here;
//	                Used on a 429 is the throttler's too
//
//	contradicting   a result that contradicts the store: a response between
//	                two of the same window (same R, which the store then held
//	                throughout, a fixed window never coming back once ended)
//	                that shows another R, or a Used outside theirs; several
//	                in a row count each (see trail). A made-up window is also a
//	                ResetAt change, and often a double grant, but counts once
//	                here
//
// The hand-written limiter writes the same headers for the limit it
// counts, under the same RateLimit member name, so the deploy itself is a
// move the clients check. A response received from R-1 on may come from a
// new window: that is no change. Nothing is compared across limits.
//
// # Reading the output
//
// The screen shows a line per leg while it runs (and a progress line,
// rewritten in place, on a terminal), then the summary: the VERDICT line
// first, a line per leg, and a table with one row per phase of every leg:
// the share of identifiers on the new side and its target, responses,
// allowed, denied, moves, ResetAt changes, double grants, contradicting
// results, degraded responses, failed requests, and the p50 and p99 of the
// time clients waited. Its last line names the HTML report and the log.
//
// The report is one self-contained HTML file (inline CSS and SVG, no
// script, nothing fetched) that any browser opens from disk: the verdict,
// the summary's table, and per leg five charts: each store's share of the
// decisions per phase; responses per second over time by deciding store,
// degraded in red, with the phases marked; grants (allowed, denied,
// degraded) per phase; moves, ResetAt changes, double grants and
// contradicting results per phase; and latency p50 and p99 per phase.
// Hovering a bar shows its figure. The full log closes it.
//
// The full log, which -v prints as the run goes, has at each phase's end a
// table with one row per side, the stores below it (the hand-written
// limiter beside memcached during the warm-up, the shards of the new
// side), and a total:
//
//	ids            identifiers whose last response in the phase came from this
//	               side (the API names the deciding store in X-Demo-Side and
//	               X-Demo-Store)
//	share          ids as a share of the identifiers seen in the phase
//	target         the share the flag asked for at the phase's end
//	allowed        200 responses; denied: 429 responses
//	moved in       responses decided by this side where the previous response
//	               for the same identifier came from another store (the other
//	               side, or the hand-written limiter)
//	checked        moves received while the binding limit's window was
//	               certainly open, so that its Reset and Used had to carry over
//	reset changes  ResetAt changes, on a move or not (see above)
//	double grants  see above
//	contradicting  see above
//	429+quota      see above
//	degraded       responses with X-RateLimit-Degraded: 1 (a store failed and
//	               the policy's failure mode decided)
//	errors         requests without a usable response: transport errors,
//	               statuses other than 200 and 429, missing headers
//
// Below the table, the latency and the rollout's own counters for the
// phase: in mirror mode the decisions written to the other store, how many
// of them found it apart (rollout.Stats.MirrorDiverged: one per identifier
// in the first phase after the deploy, then none) and the other store's
// errors; in split mode the identifiers looked up on the other store,
// those seeded from it, and lookups the serving store could not take; in
// shadow mode the decisions compared and the mismatches by kind. Then how
// many identifiers were looked up in the legacy counters and how many
// windows were carried from them. Each mode ends with a summary, one row
// per phase, and the first examples of every broken invariant.
//
// # Verdict
//
// The summary's first line is the verdict, "VERDICT: PASS (...)" only
// when every leg passed, else "VERDICT: FAIL: ..." naming each broken
// invariant with its leg and the phases it broke in. A mode passes when,
// in every phase, warm-up included: no ResetAt change, no double grant, no
// result contradicting the store, no denial claiming quota, the measured share on the new side within
// -tolerance points of the target, some requests allowed and some denied,
// no degraded response and no failed request; in mirror mode no error on
// the other store, no shortfall (a store without driver.Seeder is mirrored
// by replaying decisions, which can fall short), and no write that found
// the other store apart after the rollout's first phase; in split mode
// with seeding, no lookup the serving store could not take and no failed
// read of the other store; no failed or refused read of the legacy
// counters, and, when clients started on the hand-written limiter, at
// least one legacy window carried over; when moves happened, at least one
// checked; and every phase ran. The rolling deploy passes with, in every
// phase, no ResetAt change, no double grant, no result contradicting the
// store, no denial claiming quota, no degraded response and no failed
// request; some allowed and some denied; during the overlap, responses
// from both old and new processes and windows rolling over; at 100 %,
// moves to Redis, some checked in an open window; in the last phase Redis
// alone; no mirror write lost and no call the legacy backend could not
// match to its window. The stalled group passes with no ResetAt
// change, no double grant, no result contradicting the store, no denial
// claiming quota and no failed request, some allowed and some denied, and
// the stall seen by the clients (at least one burst, some degraded
// responses). The exit status is 0 for a pass, 1 for a
// fail (or an interrupted run), 2 when the demo could not run, 64 for bad
// flags.
//
// The shares are measured over a fixed set of tokens, so they are the same
// from run to run: with the default 200 identifiers and toggle name, 15
// (7.5%) hash at or below 10% and 98 (49%) at or below 50%. Hashing 200
// identifiers spreads them by about 2 points around 10% and 3.5 around 50%
// (binomial), hence the default tolerance of 5.
//
// # Timeouts
//
// Each backend call is bounded by -call-timeout, 500 ms, where the
// throttler's default is 100 ms: the demo often shares a laptop or a CI
// runner with other work, and a stall there would show as degraded
// responses (the policy fails open) and fail the verdict for reasons that
// have nothing to do with the migration. A mirrored decision makes two
// calls, and a seeded one a read of the other store first (and of the
// legacy counters, once per identifier); each decision's calls share that
// one bound.
package main
