package throttler

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// ErrWaitExceedsDeadline reports a Wait that returned at once because the
// context's deadline comes before the earliest moment the request could be
// allowed. It also matches context.DeadlineExceeded.
var ErrWaitExceedsDeadline = errors.New("throttlekit: the wait would exceed the context's deadline")

// maxWaitJitter bounds the random delay Wait adds to each sleep.
const maxWaitJitter = 25 * time.Millisecond

// Wait blocks until a request of cost 1 is allowed or ctx ends. It is
// shorthand for WaitN(ctx, p, id, 1).
func (t *Throttler) Wait(ctx context.Context, p *Policy, id string) (Result, error) {
	return t.WaitN(ctx, p, id, 1)
}

// WaitN blocks until a request of cost units for id under p is allowed,
// and returns that allowed result; it is how a worker takes its turn under
// a shared quota instead of failing. After each denial it sleeps the
// RetryAfter the backend reported plus a random jitter of up to a tenth of
// it, at most 25 ms, so that a fleet of workers denied together does not
// wake together; then it asks again, since others may have taken the
// units meanwhile. It sleeps on the throttler's clock when that clock has
// an After method, as throttlertest.ManualClock does, and on the wall
// clock otherwise.
//
// It returns at once:
//   - with ErrWaitExceedsDeadline (which also matches
//     context.DeadlineExceeded) when ctx's deadline, read on the wall clock,
//     comes before the earliest allowance, as x/time/rate's Wait does;
//   - with ErrCostExceedsLimit when cost can never fit;
//   - with the degraded result and an error wrapping ErrBackend when the
//     backend failed and the failure mode denied (a fail-open result is
//     allowed and returned as such);
//   - with ctx's error when ctx ends while it sleeps;
//   - with the errors of AllowN for invalid input.
func (t *Throttler) WaitN(ctx context.Context, p *Policy, id string, cost int64) (Result, error) {
	for {
		r, err := t.AllowN(ctx, p, id, cost)
		switch {
		case err != nil:
			return r, err
		case r.Allowed:
			return r, nil
		case r.Degraded:
			return r, driver.Errorf("WaitN: denied by the failure mode: %w", r.Err)
		}
		d := r.RetryAfter
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < d {
			return r, driver.Errorf("%w (%w): %q under %q can be allowed in %v, the deadline is in %v",
				ErrWaitExceedsDeadline, context.DeadlineExceeded, id, p.compiled.Name, d, time.Until(deadline).Round(time.Millisecond))
		}
		if j := min(d/10, maxWaitJitter); j > 0 {
			d += rand.N(j)
		}
		if err := t.sleep(ctx, d); err != nil {
			return r, err
		}
	}
}

// sleep waits d on the throttler's clock, or until ctx ends.
func (t *Throttler) sleep(ctx context.Context, d time.Duration) error {
	if c, ok := t.clock.(interface {
		After(time.Duration) <-chan time.Time
	}); ok {
		select {
		case <-c.After(d):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
