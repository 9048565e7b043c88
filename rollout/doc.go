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
// SplitMode (the default) sends an identifier's requests to its backend
// only. Moving an identifier starts it afresh on the other backend: one
// window's quota may be granted twice, once per backend. That is often
// acceptable for a gradual migration; when it is not, use MirrorMode.
//
// MirrorMode decides on the serving backend, and when it allows a request,
// records the same units on the other backend. Consumed units go to both;
// a denial consumes nothing on either; a peek touches only the serving one.
// Both backends therefore hold the same windows (the secondary replays
// exactly the decisions the primary allowed, at the same now), and an
// identifier moved mid-window keeps its Used and ResetAt: it neither starts
// a new window nor gets its quota twice. The secondary records units with
// an ordinary Decide; if it holds less room than the primary (it held state
// from before mirroring began), it takes as many units as it can hold, so
// that it is never emptier than its limits allow, and the rest is counted
// as a shortfall in Stats. The two writes are not one atomic step: a
// concurrent decision served by the other backend (another process with a
// different split during a change) may interleave.
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
// switch. In SplitMode, identifiers moved back start afresh on the old
// backend; in MirrorMode the old backend has their windows.
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
