package driver

import "errors"

// Sentinel errors shared by the throttler, every backend and the decorators.
// The throttler package re-exports the ones its users match; a backend wraps
// these rather than declaring its own for the same condition, so that one
// errors.Is test works whichever backend produced the error.
var (
	// ErrInvalidLimit reports a limit that cannot be enforced: Max outside
	// 1..MaxQuota, a window outside MinWindow..MaxWindow or not in whole
	// milliseconds, an unknown algorithm, a burst on a fixed window, or a
	// notation the parser does not understand.
	ErrInvalidLimit = errors.New("throttlekit: invalid limit")

	// ErrInvalidPolicy reports a policy with no limits, an empty name,
	// duplicate limit names, or a nil or zero *Policy.
	ErrInvalidPolicy = errors.New("throttlekit: invalid policy")

	// ErrInvalidOption reports an option or configuration value that cannot
	// be used: a negative timeout, a nil client, a malformed connection
	// string, an option given where it does not apply.
	ErrInvalidOption = errors.New("throttlekit: invalid option")

	// ErrNotInitialized reports a value used without being built by its
	// constructor: a zero Throttler, a nil backend, a zero backend struct.
	// It is a programming error, never an outage, so the throttler returns
	// it instead of applying a failure mode.
	ErrNotInitialized = errors.New("throttlekit: not initialized")

	// ErrClosed reports a call on a backend after its Close.
	ErrClosed = errors.New("throttlekit: backend closed")

	// ErrBadReply reports a store's reply that a backend or the throttler
	// cannot use: a state count that does not match the policy, a value
	// another program wrote under one of our keys, a malformed script reply.
	ErrBadReply = errors.New("throttlekit: malformed backend reply")

	// ErrInvalidState reports states handed to Seeder.Seed that cannot be
	// stored: not one per limit of the policy, or a negative field.
	ErrInvalidState = errors.New("throttlekit: invalid state")
)
