// Package memorybackend (import path
// github.com/throttlekit/throttlekit/backend/memory) is throttlekit's in-process backend: the reference
// implementation that every other backend is compared with, and the embedded
// default for a single process.
//
// # Guarantees
//
// Every decision calls driver.Decide (and every refund driver.Refund)
// on the identifier's states under one lock, so the backend is exact under
// any concurrency: with cost 1, exactly Max requests are allowed per fixed
// window, and GCRA never allows more than its formula. Identifiers are
// spread over 64 locks by a seeded hash, so unrelated identifiers rarely
// contend.
//
// # Memory
//
// State is held per (policy name, identifier) pair, one state per limit
// key, so a policy redefined under the same name keeps the state of every
// limit, including those the new definition drops. A pair whose every
// window has closed (and every GCRA bucket refilled) is swept 30 seconds
// later, the grace every backend keeps for clocks that differ between
// hosts. That lifetime is measured in request time when the state is
// stored (its window's end minus the request's now) and then counted on
// the sweep clock, the wall clock unless WithSweepClock says otherwise, the
// way a server counts a TTL: a request whose clock runs far ahead of the
// others can never sweep their live state. The backend has no goroutine of
// its own; sweeps run as inserts accumulate, in amortised constant time per
// insert.
//
// WithMaxIdentifiers bounds the number of pairs. At the bound, a request
// that needs a new pair first sweeps every shard (at most once per second of
// the sweep clock); if nothing was closed, it fails with ErrFull, and the
// throttler applies the policy's failure mode (fail open by default) and
// reports the error. Pairs already held are never evicted: a flood of new
// identifiers degrades only the newcomers and never resets an existing
// count, which is the failure an evicting cache would have.
//
// Peeks, denials and refunds of absent state store nothing.
//
// # Concurrency leases
//
// The backend implements driver.Leaser: each (concurrency limit,
// identifier) pair holds a map of lease IDs to expiries, and Acquire and
// Release call driver.AcquireLease and driver.ReleaseLease on it under the
// identifier's lock, so the count is exact under any concurrency. Both cost
// one pass over the identifier's leases, which number at most the limit's
// Max. A set is swept like any other state, 30 seconds after its latest
// lease's expiry, whether its leases were released or expired (a crashed
// holder), and counts against WithMaxIdentifiers until then.
package memorybackend
