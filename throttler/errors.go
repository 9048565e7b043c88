package throttler

import (
	"errors"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// Sentinel errors. Every error the package returns wraps one of these (or
// errors.ErrUnsupported, or the context's error), so callers branch with
// errors.Is and never parse messages. The invalid-input errors are the same
// values the backends and the driver package use.
var (
	// ErrInvalidIdentifier reports an identifier that is empty or longer
	// than 1024 bytes.
	ErrInvalidIdentifier = errors.New("throttlekit: invalid identifier")
	// ErrInvalidCost reports a negative cost or refund.
	ErrInvalidCost = errors.New("throttlekit: invalid cost")
	// ErrInvalidLimit reports a limit that cannot be enforced or a notation
	// ParseLimit does not understand, such as conflicting options.
	ErrInvalidLimit = driver.ErrInvalidLimit
	// ErrInvalidPolicy reports a policy without limits, with an empty name
	// or duplicate limit names, or a nil *Policy.
	ErrInvalidPolicy = driver.ErrInvalidPolicy
	// ErrInvalidOption reports an option that cannot be used, or one given
	// where it does not apply.
	ErrInvalidOption = driver.ErrInvalidOption
	// ErrNotInitialized reports a zero Throttler, a nil backend, or a
	// backend that was not built by its constructor. It is returned as an
	// error, never handed to a failure mode: it is a bug, not an outage.
	ErrNotInitialized = driver.ErrNotInitialized
	// ErrCostExceedsLimit reports a cost larger than some limit's capacity
	// (Max, or the burst for GCRA). Such a request can never be allowed,
	// however long the caller waits, so it is told apart from a denial: the
	// Result has NeverAllowed set and RetryAfter equal to Never.
	ErrCostExceedsLimit = errors.New("throttlekit: cost exceeds the limit's capacity")
	// ErrBackend wraps every failure of a backend call (network, timeout,
	// malformed reply). It is in Result.Err of a degraded result and in the
	// errors of Refund, Reset and Ping.
	ErrBackend = errors.New("throttlekit: backend failure")
	// ErrClockOutOfRange reports a clock reading before the Unix epoch or
	// after 2200-01-01; the zero time (an unset clock) is one.
	ErrClockOutOfRange = errors.New("throttlekit: clock reading out of range")
)
