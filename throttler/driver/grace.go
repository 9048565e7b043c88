package driver

import "time"

// Expiry grace: how long a store keeps a state after it stops mattering
// (for a fixed window its End, for GCRA its TAT, for a sliding window End +
// Window, for a lease set its latest lease's expiry). Deleting a state
// earlier is not wrong by the state's own clock, since a closed window
// counts as absent; but another throttler whose clock lags this one's
// still finds the window open, and must find it stored (docs/SPEC.md,
// Time 2). The grace is garbage collection only and never decides
// anything.
const (
	// DefaultExpiryGrace is the grace every backend of this module keeps
	// unless told otherwise: throttlers whose clocks differ by up to 30 s
	// share every window and GCRA state exactly. A new backend should use
	// it as its default.
	DefaultExpiryGrace = 30 * time.Second

	// MinExpiryGrace is the shortest grace a backend may be configured
	// with. The conformance suite steps a clock back by up to 999 ms and
	// expects to find the states it left there.
	MinExpiryGrace = time.Second
)
