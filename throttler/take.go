package throttler

import (
	"context"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// AllowUpTo takes up to n units for identifier id under policy p: it grants
// the largest k <= n that every limit of p allows at once, and charges k to
// every limit in one atomic step, so that a batch never spends a minute's
// quota that the hour limit then refuses. r.Granted is k and r.Allowed is
// k > 0; the per-limit figures are those after the charge. When nothing
// fits (k = 0) the result is the denial of a single unit: its RetryAfter is
// how long until one unit fits.
//
// n may exceed the policy's capacity; at most the capacity is granted. A
// backend that can (memory, Redis, the decorators over them) takes in one
// call; on other backends (memcached) the throttler
// peeks and decides the headroom it saw, and peeks again if a concurrent
// request took it first. A backend failure follows the failure mode:
// FailOpen grants min(n, capacity), FailClosed grants nothing, FailLocal
// takes up to n from this process's share on the local store. Errors are as for AllowN; n must be at
// least 1.
func (t *Throttler) AllowUpTo(ctx context.Context, p *Policy, id string, n int64) (Result, error) {
	if err := t.check(p, id, n); err != nil {
		return Result{}, err
	}
	if n < 1 {
		return Result{}, driver.Errorf("%w: AllowUpTo(%d): want at least 1 unit", ErrInvalidCost, n)
	}
	now, err := t.now()
	if err != nil {
		return Result{}, err
	}
	req := driver.Request{Policy: p.compiled, Identifier: id, Cost: n, Now: now}
	if t.denies != nil {
		if r, ok := t.denies.lookup(p, id, 1, now); ok {
			if len(t.observers) > 0 {
				t.observe(ctx, "allow", p, req, &r, nil, 0)
			}
			return r, nil
		}
	}
	var r Result
	if err := t.run(ctx, opTake, p, req, &r); err != nil {
		return Result{}, err
	}
	if !r.Allowed {
		r.Granted = 0
		if t.denies != nil && !r.Degraded {
			t.denies.remember(p, &r, 1)
		}
	}
	return r, nil
}

// take runs one take-up-to-N on the backend (driver.TakeWith).
func (t *Throttler) take(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	return driver.TakeWith(ctx, t.backend, req)
}
