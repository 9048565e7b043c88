// Package rollout moves identifiers from one throttlekit backend to another
// by a percentage held in a feature flag, so that a migration (memcached to
// Redis, say) needs no deploy: raise the percentage and the new backend
// serves more identifiers; lower it, or switch the flag off, to go back.
//
// A Backend wraps an old and a new driver.Backend and is itself a
// driver.Backend, so a throttler.Throttler uses it like any store:
//
//	flag, err := rollout.NewStaticSource(10) // or unleashflag.New, an Unleash toggle
//	backend, err := rollout.New(memcachedBackend, redisBackend, flag, rollout.WithMode(rollout.MirrorMode))
//	th, err := throttler.New(backend)
//
// The Unleash flag source lives in package unleashflag (rollout/unleashflag),
// so that a program with a static percentage links no Unleash client.
//
// # Stickiness and monotonicity
//
// Each identifier hashes into one of 100 buckets (Bucket): the 32-bit
// murmur3 hash of groupID + ":" + identifier, modulo 100, plus one, which is
// Unleash's normalisation for gradual rollouts. At percentage p the new
// backend serves exactly the identifiers whose bucket is at most p.
//
// Sticky: an identifier's bucket depends on nothing but the identifier and
// the group ID, so at a fixed percentage it is always served by the same
// backend, in every process. Monotone: the set {bucket <= p} only grows as
// p grows, so raising the percentage moves identifiers only from the old
// backend to the new one, and lowering it only moves them back. Both hold
// only while the group ID stays fixed, which is why the Unleash source pins
// it and rejects a toggle whose group ID changed.
//
// # Modes
//
// Whatever the mode, a move keeps the client's view: an identifier's
// state moves with it, so its reset time does not jump and its quota is
// not granted twice (docs/SPEC.md, Rollout between two backends). The
// capability that carries state is driver.Seeder: a store takes states
// another store decided, merged by a fixed rule (driver.Merge) and, in
// the same atomic step, decides the request. Every backend of this module
// implements it.
//
// SplitMode (the default) sends an identifier's requests to its backend
// only. Before it decides for an identifier that may have been served by
// the other backend lately, it reads the identifier's states there and has
// its serving backend decide with Seed, which merges them first: one extra
// round trip, once per identifier and policy per horizon (the policy's
// longest window, twice that for a sliding window) at most. "May have been
// served there" is known from the splits this Backend has seen: a split in
// force during the last horizon that sent the identifier to the other side,
// or a Backend that has not watched its source for a horizon yet (a process
// that just started cannot know what its peers did). An identifier that has
// stayed on one side for a whole horizon costs nothing extra, and the
// Backend remembers the identifiers it has carried over (WithSeedMemory
// bounds how many; one forgotten is only read again). Moves in either
// direction keep their windows: ramping down reads the new backend and
// merges into the old one. WithSeeding(false) turns seeding off, and a
// moved identifier then starts afresh.
//
// What split mode cannot keep exact: processes that hold different
// percentages during a flag change route an identifier between the two to
// different stores, each of which counts only its own requests, so that
// identifier may be granted up to twice its quota in the windows that
// overlap the disagreement. An anchored fixed window that rolls over
// meanwhile is opened on each store at its own first request, so clients
// see the two stores' resets in turn until the disagreement ends; then
// the serving store keeps its window (driver.Merge never moves an open
// window's End) and later windows are exact. MirrorMode keeps the reset
// while its stores are reachable, except when two processes that disagree
// open an identifier's next window on different stores within one
// mirrored write of each other: each store then keeps its own until the
// disagreement ends, counted in MirrorDiverged. It narrows the over-grant
// to about the requests in flight on both stores as a window fills, since
// a mirrored write merges (keeps the larger count) rather than adds
// (docs/SPEC.md, Rollout 7): keep disagreements short by changing every
// process's percentage at once, with a flag rather than a deploy.
//
// MirrorMode decides on the serving backend and then writes the states it
// decided to the other backend, with a Seed of cost 0, after every decision
// of cost > 0, allowed or denied. The other backend therefore holds the same
// windows (same end, same count; same GCRA arrival time) from the first
// mirrored decision on, whenever mirroring began, even in the middle of
// open windows, but for one case: a fixed window the other backend
// already held open with another end keeps its end until it closes (it
// takes the larger count), and the next window is the serving backend's.
// A later write never moves an open window's end nor lowers its count (a
// write from a concurrent process may arrive late). Stats counts in
// MirrorDiverged the decisions whose secondary was apart before the write:
// it rises once per identifier when mirroring begins (once per decision
// into a window of another end), then falls to zero, which is how a
// dashboard shows the stores have converged. A
// secondary that is no driver.Seeder gets the allowed units replayed with
// an ordinary Decide instead (the behaviour before Seeder): what it cannot
// hold is counted as a shortfall. Mirror mode also seeds before deciding,
// as split mode does, so that a rollout deployed at a percentage above 0,
// before the new backend holds anything, keeps the windows of the
// identifiers that backend serves first.
//
// ShadowMode decides on the serving backend, runs the same decision on the
// other one, and compares the two evaluated outcomes limit by limit: the
// verdict (allowed against denied, in either direction), Remaining, and
// ResetAt. Stats counts each kind; WithMismatchHandler receives each
// mismatch. The shadow backend consumes as its own decision says, so it
// sees the real load. Shadow mode is how a new backend is checked before
// it serves anything; mirror then shadow is how to check that mirroring
// keeps the stores in step.
//
// # Upgrading the key layout
//
// Stored keys follow driver.KeyLayout. A store written by a release before
// layout 2 (an unnamed limit was keyed by its notation, Max included) is
// upgraded in place with UpgradeKeys: a split rollout at 100 % from
// KeyLayoutV1(store) (from the store's Layout2 view on Redis, whose own
// layout changed too) to the store itself, so that each identifier's first
// decision reads its layout-1 state and carries it into its layout-2 keys;
// no window restarts. After the longest horizon of the deployment's
// policies the old keys count for nothing, and the store can be used alone.
// That is the deploy once every process of the old release has stopped:
// while one may still decide, it counts in the old keys only, and the new
// processes must count there too (docs/MIGRATION.md, "Upgrading
// throttlekit": a mirror rollout at 0 % from KeyLayoutV1(store), or on
// Redis the backend's Layout2Beside).
//
// In MirrorMode and ShadowMode the secondary call follows the primary one
// within the same context and deadline, so a decision costs both round
// trips. A failing or slow secondary never changes the primary's decision:
// its errors (wrapping ErrSecondary) are counted in Stats and passed to
// WithSecondaryErrorHandler. When the primary fails, nothing is sent to the
// secondary and the throttler applies the policy's failure mode as usual.
//
// # Optional interfaces
//
// Backend implements every optional interface of throttler/driver:
//
//   - Peek asks the serving backend only, through its Peek, or Decide with
//     cost 0 when it has none.
//   - Refund goes to the serving backend; in MirrorMode and ShadowMode to
//     the other one too, because it recorded the units as well. A serving
//     backend without Refunder gives errors.ErrUnsupported; a secondary
//     without one is skipped.
//   - Reset resets both backends, whichever serves the identifier, so a
//     later move finds nothing stale; the error joins either failure.
//   - Ping pings both, since the split can send any identifier to either at
//     any moment; a backend without Pinger counts as reachable.
//   - Acquire (concurrency leases) goes to the serving backend; in
//     MirrorMode and ShadowMode a lease it acquired is taken on the other
//     one too, best effort, so a move keeps the requests in flight counted
//     (a refusal there is a mirror shortfall, and shadow mode compares
//     nothing). Release goes to the serving backend, and to the other one
//     in MirrorMode and ShadowMode, or in SplitMode when the serving one did
//     not hold the lease (it was taken before the identifier moved). In
//     SplitMode a move therefore starts the identifier's count afresh on
//     its new backend, as for windows: up to twice Max may be in flight
//     until the old requests end. A serving backend without Leaser gives
//     errors.ErrUnsupported.
//
// # Flag sources
//
// A FlagSource publishes Split values. unleashflag.Source follows a toggle on an
// Unleash server through the official Go client: its flexibleRollout
// percentage, with the identifier as the value stickiness hashes (see
// unleashflag.Source for the toggles it accepts). StaticSource holds a
// percentage set in the program, changeable at run time with Set. Give a
// StaticSource the Unleash toggle's group ID (WithStaticGroupID) to switch
// between the two without moving anyone.
//
// # Kill switch
//
// A toggle that is disabled, or missing from the server's answer, puts
// every identifier on the old backend, whatever its percentage; enabling
// it again restores the percentage. For a StaticSource, Set(0) is the kill
// switch. Identifiers moved back keep their windows: in SplitMode the old
// backend is seeded from the new one, in MirrorMode it has them already.
//
// # When the flag server is unreachable
//
// The Unleash client keeps the toggles it last fetched when a fetch fails
// (it backs off on 429 and 5xx answers), and the source keeps the split it
// last published, so the split in force stays as it was. Before the first
// successful fetch, the source has no answer: Split returns nil and the
// Backend sends every identifier to its default side, SideOld unless
// WithDefaultSide says otherwise; Stats counts those decisions. A
// percentage changed on the server is in force after the next fetch, within
// one refresh interval of the client (two if a fetch was in flight at the
// change).
//
// # Hot path
//
// Routing a decision is one atomic pointer load of the published Split and
// one murmur3 hash of the identifier (in a stack buffer for identifiers of
// up to about 190 bytes): no lock, no channel, no allocation
// (BenchmarkSide). The Unleash client is never asked per decision. Its IsEnabled would take the repository's read lock and copy
// the toggle, send on an unbuffered metrics channel unless metrics are
// disabled, and, with default stickiness and no userId in the context,
// hash a random number, which would spread one identifier's counts over
// both backends. Instead the source installs its own unleash.Storage:
// after each successful fetch the client hands it the toggles, the source
// reads the toggle into a Split, and publishes it. The tests check that
// this evaluation agrees with the client's own IsEnabled for thousands of
// identifiers and several stickiness settings. SplitMode keeps no
// per-decision counters, so that counting adds no shared cache line either.
package rollout
