package conformance

import "time"

// SetTimeouts shortens the subtest timeout and the watchdog's grace for the
// package's own tests of the watchdog.
func SetTimeouts(timeout, grace time.Duration) {
	subtestTimeout, watchdogGrace = timeout, grace
}
