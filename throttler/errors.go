package throttler

import "errors"

// Sentinel errors. Every error the package returns wraps one of these, so
// callers can branch with errors.Is without parsing messages.
var (
	// ErrInvalidIdentifier reports an identifier that is empty or longer than
	// MaxIdentifierLen bytes.
	ErrInvalidIdentifier = errors.New("throttler: invalid identifier")

	// ErrInvalidLimit reports a limit that cannot be enforced: Max below 1,
	// a window outside [1ms, 400 days], a burst on a fixed window, or a
	// notation ParseLimit does not understand.
	ErrInvalidLimit = errors.New("throttler: invalid limit")

	// ErrInvalidPolicy reports a policy without limits, with duplicate limit
	// names, with an empty name, or a nil *Policy.
	ErrInvalidPolicy = errors.New("throttler: invalid policy")

	// ErrInvalidCost reports a negative cost or refund.
	ErrInvalidCost = errors.New("throttler: invalid cost")

	// ErrCostExceedsLimit reports a cost larger than some limit's capacity
	// (Max for fixed windows, Burst for GCRA). Such a request can never be
	// allowed, however long the caller waits, so it is told apart from an
	// ordinary denial: the Result has NeverAllowed set and RetryAfter equal
	// to Never.
	ErrCostExceedsLimit = errors.New("throttler: cost exceeds the limit's capacity")

	// ErrBackend wraps every failure of a backend call (network, timeout,
	// malformed reply). It appears in Result.Err of a degraded result and in
	// the errors of Refund and Reset.
	ErrBackend = errors.New("throttler: backend failure")

	// ErrBadReply reports a backend reply the throttler cannot use, such as
	// a state slice whose length does not match the policy. It is always
	// wrapped together with ErrBackend.
	ErrBadReply = errors.New("throttler: malformed backend reply")

	// ErrClockOutOfRange reports a clock reading before the Unix epoch or
	// after MaxTime. Stored times are integer Unix milliseconds and
	// microseconds that every store must hold exactly; a reading outside
	// that range is a broken clock, and deciding with it would give wrong
	// answers. The zero time (a zero ManualClock) is such a reading.
	ErrClockOutOfRange = errors.New("throttler: clock reading out of range")

	// ErrUnsupported reports an optional operation (Refund, Reset, Ping) on
	// a backend that does not implement the matching interface.
	ErrUnsupported = errors.New("throttler: operation not supported by backend")
)
