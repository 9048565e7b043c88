package conformance

import (
	"testing"
	"time"
)

// SetTimeouts shortens the subtest timeout and the watchdog's grace for the
// package's own tests of the watchdog.
func SetTimeouts(timeout, grace time.Duration) {
	subtestTimeout, watchdogGrace = timeout, grace
}

// CallTimeoutOf is the per-call timeout the suite's throttlers get over h's
// backends.
func CallTimeoutOf(tb testing.TB, h Harness) time.Duration { return callTimeoutOf(tb, h) }
