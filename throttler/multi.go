package throttler

import (
	"context"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// Subject is one identifier under one policy, such as the client IP under
// the anonymous policy and the user under the authenticated one.
type Subject struct {
	Policy     *Policy
	Identifier string
}

// AllowAll decides one request of cost units that names several subjects:
// it is allowed only if every subject allows it. Subjects are decided in the
// order given; at the first denial the units the earlier subjects consumed
// for this request are refunded, so a denied request costs nothing
// anywhere, and the remaining subjects are not consulted.
//
// This is not one atomic step: subjects may live on different shards or
// stores. A refund gives units back within the current window and leaves
// the window itself in place, so a denied request can leave an earlier
// subject's fixed window anchored at this moment (with nothing spent); that
// subject's next request then finds the window open rather than opening its
// own. Peeking every subject first would avoid that at the price of a
// second round trip per subject on every request; this method does not.
// Between an earlier subject's consumption and its refund, a concurrent
// request may see those units spent and be denied. When the
// backend does not implement Refunder, every subject is peeked first and
// nothing is consumed if a peek already denies; a race can then still leave
// units spent on earlier subjects. A refund that fails is reported to the
// observer.
//
// The returned Result is the binding subject's (on allow, the smallest
// Remaining, ties to the latest ResetAt; on deny, the denying subject), with
// Subjects holding the result of each subject decided, in order. Errors are
// as for AllowN.
func (t *Throttler) AllowAll(ctx context.Context, cost int64, subjects ...Subject) (Result, error) {
	if len(subjects) == 0 {
		return Result{}, driver.Errorf("%w: AllowAll needs at least one subject", ErrInvalidPolicy)
	}
	for _, s := range subjects {
		if err := t.check(s.Policy, s.Identifier, cost); err != nil {
			return Result{}, err
		}
	}
	// A cost some subject can never hold is answered before anything is
	// spent, the same way AllowN answers it.
	for _, s := range subjects {
		if cost > s.Policy.compiled.Capacity {
			now, err := t.now()
			if err != nil {
				return Result{}, err
			}
			r, err := t.neverAllowed(ctx, s.Policy, driver.Request{Policy: s.Policy.compiled, Identifier: s.Identifier, Cost: cost, Now: now})
			return combine([]Result{r}), err
		}
	}
	if _, ok := t.backend.(driver.Refunder); !ok && cost > 0 {
		for i, s := range subjects {
			r, err := t.Peek(ctx, s.Policy, s.Identifier)
			if err != nil {
				return Result{}, err
			}
			if r.Degraded {
				continue
			}
			if would := t.wouldAllow(s, cost, r); !would.Allowed {
				return combine(append(make([]Result, 0, i+1), would)), nil
			}
		}
	}
	results := make([]Result, 0, len(subjects))
	for _, s := range subjects {
		var r Result
		err := t.decide(ctx, s.Policy, s.Identifier, cost, &r)
		results = append(results, r)
		if err != nil || !r.Allowed {
			t.giveBack(ctx, cost, subjects, results[:len(results)-1])
			if err != nil {
				return combine(results), err
			}
			break
		}
	}
	return combine(results), nil
}

// wouldAllow re-evaluates a peek's figures for a request of cost units. A
// peek's per-limit figures carry the stored state exactly: a fixed window's
// Used and end, a GCRA limit's TAT (ResetAt = max(TAT, now)).
func (t *Throttler) wouldAllow(s Subject, cost int64, peek Result) Result {
	states := make([]driver.State, peek.NumLimits())
	for i := range states {
		l := peek.LimitAt(i)
		if l.Algorithm == GCRA {
			states[i] = driver.State{End: l.ResetAt.UnixMicro()}
		} else {
			states[i] = driver.State{Used: l.Used, End: l.ResetAt.UnixMilli()}
		}
	}
	now := peek.At
	probe := append([]driver.State(nil), states...)
	allowed := driver.Decide(s.Policy.compiled, now, cost, probe)
	r := evaluated(s.Policy.compiled, now, cost, allowed, states)
	r.Identifier = s.Identifier
	return r
}

// giveBack refunds cost units to every subject whose decision consumed them.
// The refunds run even when the caller has given up: the units were taken
// for a request that is not going to happen. Each is still bounded by the
// per-call timeout.
func (t *Throttler) giveBack(ctx context.Context, cost int64, subjects []Subject, decided []Result) {
	if cost == 0 {
		return
	}
	ctx = context.WithoutCancel(ctx)
	for i, r := range decided {
		if !r.Allowed || r.Degraded {
			continue
		}
		// Refund reports its own failures to the observer.
		_, _ = t.Refund(ctx, subjects[i].Policy, subjects[i].Identifier, cost)
	}
}

// combine returns the binding result of several subjects' results.
func combine(results []Result) Result {
	best := 0
	last := results[len(results)-1]
	if !last.Allowed {
		best = len(results) - 1
	} else {
		for i, r := range results {
			b := results[best]
			if r.Remaining < b.Remaining || r.Remaining == b.Remaining && r.ResetAt.After(b.ResetAt) {
				best = i
			}
		}
	}
	out := results[best]
	out.Subjects = results
	return out
}
