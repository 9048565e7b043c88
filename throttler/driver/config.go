package driver

import "time"

// ConfigChecker is implemented by backends whose configuration can be
// wrong in a way their constructor cannot report: a constructor without an
// error result (memorybackend.New), or a setting that only conflicts with
// the throttler's, such as a memcached client timeout longer than the call
// timeout it runs under (gomemcache takes no context, so a round trip that
// outlives the call holds it up).
//
// throttler.New calls CheckConfig once with its call timeout (0 when calls
// are bound only by the caller's context) and refuses the backend, and the
// store of WithLocalFallback, when it returns an error, which wraps
// ErrInvalidOption and names the setting. A decorator (sharded, rollout,
// breaker) implements it by asking every backend it wraps that implements
// it, and joins their errors.
//
// Fallback: without ConfigChecker, the throttler takes the backend as its
// constructor returned it.
type ConfigChecker interface {
	CheckConfig(callTimeout time.Duration) error
}

// CheckConfig returns b's CheckConfig(callTimeout) when b implements
// ConfigChecker, and nil otherwise: what a decorator calls on each backend
// it wraps.
func CheckConfig(b any, callTimeout time.Duration) error {
	if c, ok := b.(ConfigChecker); ok {
		return c.CheckConfig(callTimeout)
	}
	return nil
}
