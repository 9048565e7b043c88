// Command migrate-demo moves an HTTP API's rate-limit state from memcached
// to sharded Redis while the API is under load, and checks that clients
// notice nothing.
//
//	make demo            # go run ./cmd/migrate-demo, on real servers (installs them when missing)
//	make demo-embedded   # the same on in-memory backends
//	go run ./cmd/migrate-demo -short   # about 12 s
//
// # What runs
//
// The demo starts, on free loopback ports, one memcached and two Redis
// groups of one primary and one replica each (internal/localserver; the
// binaries come from PATH, or from $MEMCACHED and $REDIS_SERVER), unless
// -memcached or -redis-shards name servers that already run. The old
// backend is backend/memcached; the new one is backend/sharded over the two
// Redis groups, built from the same configuration string -redis-shards
// takes. A rollout.Backend in mirror mode sits over both, a
// throttler.Throttler on the wall clock over it, and the middleware in
// front of a one-endpoint JSON API. Keys carry a prefix unique to the run,
// so that servers shared with earlier runs never lend it old counts.
//
// A load generator then drives 200 clients over loopback HTTP, one
// goroutine and one API token each ("Authorization: token demo-0042"; the
// API limits the token's SHA-256). A tenth of them are abusive: they send
// four times what the policy "30/10s, 600/h" allows. Every client sends its
// requests one after another, for the whole run, and checks each response
// against the one before.
//
// The rollout ramps 0% → 10% → 50% → 100% of identifiers onto Redis, one
// phase of 20 s per step, by a static percentage, or by whatever an Unleash
// toggle says when -unleash-url is given (the demo then sets nothing and
// prints the toggle's percentage per phase). Both hash identifiers with the
// toggle's name as group ID, so a static ramp and the toggle move the same
// identifiers at the same percentage. Windows of 10 s close and reopen
// within each phase. A whole run takes about 85 s.
//
// Clients start one after another over the first window, so that their
// windows, which open at each identifier's first request, do not open and
// close in step: phase boundaries then fall at every point of a window.
//
// Mirror mode sends every unit the serving store consumes to the other
// store as well, so both hold the same windows and an identifier that moves
// keeps its count and its reset time. -mode split shows what happens
// without it: moved identifiers start afresh, and the verdict fails.
//
// The first SIGINT or SIGTERM stops the load and shuts the API and the
// servers down; a second one kills the process. Servers are started with a
// parent-death signal on Linux, so not even SIGKILL leaves them behind.
//
// # Flags
//
//	-embedded            in-memory backends: memory for the old side, sharded over two
//	                     memory shards for the new; for machines without the servers
//	-short               quick profile: policy "6/2s, 600/h", phases of 2.5 s, normal
//	                     clients at 1.5 req/s, abusive ones at 8 req/s
//	-duration d          length of each phase (20s; 2.5s with -short)
//	-ramp list           percentages on the new backend, one per phase (0,10,50,100)
//	-identifiers n       clients, one token each (200)
//	-abusive f           fraction of abusive clients (0.10)
//	-rate r              requests per second of a normal client (2; 1.5 with -short)
//	-abusive-rate r      requests per second of an abusive client (12; 8 with -short)
//	-policy s            the limits, in throttler.ParsePolicy's notation
//	-mode m              rollout mode: mirror (default), split or shadow
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
//
// When a server binary the run needs is missing and -embedded is not given,
// the demo says which one and how to get it, and exits with status 2.
//
// # Reading the output
//
// While a phase runs, a progress line (rewritten in place on a terminal)
// shows the request rate and the running counts. At each phase's end a
// table has one row per side, the new side's shards below it, and a total:
//
//	ids        identifiers whose last response in the phase came from this side
//	           (the API names the deciding store in X-Demo-Side and X-Demo-Store)
//	share      ids as a share of the identifiers seen in the phase
//	target     the share the flag asked for at the phase's end
//	allowed    200 responses; denied: 429 responses
//	moved in   responses served by this side where the previous response for the
//	           same identifier came from the other side
//	checked    moves whose previous window was certainly still open: received
//	           before X-RateLimit-Reset - 1 s (Reset is the window end rounded up
//	           to a second), so the window must have carried over
//	restarts   checked moves whose window did not carry over: another
//	           X-RateLimit-Reset, or an X-RateLimit-Used lower than before; a Reset
//	           that goes back counts at any time
//	wobble     responses from the same side as the previous one whose
//	           X-RateLimit-Reset differs while the previous window was certainly
//	           open, or went back (a move is counted under restarts instead)
//	429+quota  denials that claim quota: X-RateLimit-Remaining > 0 or RateLimit
//	           r > 0, or the throttler's own Remaining > 0. The middleware
//	           forces the two headers to 0 on every denial, so the API also
//	           sends the throttler's figures on a 429 (X-Demo-Result-Remaining,
//	           X-Demo-Result-Used), and a store that denies while it still
//	           holds quota shows here; Used on a 429 is the throttler's too
//	degraded   responses with X-RateLimit-Degraded: 1 (a store failed and the
//	           policy's failure mode decided)
//	errors     requests without a usable response: transport errors, statuses
//	           other than 200 and 429, missing headers
//
// Reset and Used are compared only while the binding limit (the RateLimit
// field's member name) stays the same. Below the table, the rollout's own
// counters for the phase: in mirror mode the decisions mirrored, the
// shortfalls (the other store could not take every unit) and the other
// store's errors; in shadow mode the decisions compared and the mismatches
// by kind. The summary's mismatches column is shortfalls plus shadow
// mismatches.
//
// # Verdict
//
// The last line is "VERDICT: PASS (...)", or "VERDICT: FAIL: ..." naming
// each broken invariant and the phases it broke in. The run passes when, in
// every phase: no wobble, no denial claiming quota, no restart on a move,
// the measured share on the new side within -tolerance points of the
// target, some requests allowed and some denied, no degraded response and
// no failed request, and in mirror mode no shortfall and no error on the
// other store (each would restart a window on its next move, checked by a
// client or not); when moves happened, at least one was checked; and every
// phase ran. -policy takes fixed windows only: a GCRA limit's reset time
// moves with every request, which the wobble check would report. The exit status is 0 for a pass, 1 for a fail (or an
// interrupted run), 2 when the demo could not run, 64 for bad flags.
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
// have nothing to do with the migration. In mirror mode one decision makes
// two calls, and both share that one bound.
package main
