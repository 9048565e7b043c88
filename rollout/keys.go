package rollout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// KeyLayoutV1 returns a backend that stores through b under the limit keys
// of layout 1 (driver.KeyV1): an unnamed limit keyed by its notation, Max
// included, and a GCRA limit by its capacity. It is the old side of a
// key-layout upgrade (see UpgradeKeys), for a store that releases before
// layout 2 wrote: b itself is unchanged, only the keys it is handed differ.
// It forwards every optional interface b implements; one b missing gives an
// error wrapping errors.ErrUnsupported, as the throttler's fallbacks expect.
func KeyLayoutV1(b driver.Backend) driver.Backend {
	return &v1Keys{next: b}
}

// v1Keys rewrites each request's policy into a copy whose limits carry
// their layout-1 keys. The copies are made once per policy and kept, so a
// store that caches work per *driver.Policy sees one stable pointer.
type v1Keys struct {
	next     driver.Backend
	policies sync.Map // *driver.Policy -> *driver.Policy
}

func (v *v1Keys) policy(p *driver.Policy) *driver.Policy {
	if !p.Valid() {
		return p
	}
	if old, ok := v.policies.Load(p); ok {
		return old.(*driver.Policy)
	}
	cp := *p
	cp.Limits = append([]driver.Limit(nil), p.Limits...)
	for i := range cp.Limits {
		cp.Limits[i].Key = driver.KeyV1(&cp.Limits[i])
	}
	old, _ := v.policies.LoadOrStore(p, &cp)
	return old.(*driver.Policy)
}

func (v *v1Keys) rewrite(req driver.Request) driver.Request {
	req.Policy = v.policy(req.Policy)
	return req
}

func unsupported(what string) error {
	return fmt.Errorf("throttlekit: rollout: %w: the layout-1 backend cannot %s", errors.ErrUnsupported, what)
}

// SetLogger implements driver.LoggerSetter on b, when b does.
func (v *v1Keys) SetLogger(l *slog.Logger) {
	if ls, ok := v.next.(driver.LoggerSetter); ok {
		ls.SetLogger(l)
	}
}

// Decide implements driver.Backend.
func (v *v1Keys) Decide(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	return v.next.Decide(ctx, v.rewrite(req))
}

// Peek implements driver.Peeker, through Decide with cost 0 when the store
// has no Peek.
func (v *v1Keys) Peek(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	return driver.PeekWith(ctx, v.next, v.rewrite(req))
}

// Refund implements driver.Refunder.
func (v *v1Keys) Refund(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	rf, ok := v.next.(driver.Refunder)
	if !ok {
		return driver.Outcome{}, unsupported("refund")
	}
	return rf.Refund(ctx, v.rewrite(req))
}

// Take implements driver.Taker.
func (v *v1Keys) Take(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	return driver.TakeWith(ctx, v.next, v.rewrite(req))
}

// Seed implements driver.Seeder.
func (v *v1Keys) Seed(ctx context.Context, req driver.Request, given []driver.State) (driver.Outcome, error) {
	sd, ok := v.next.(driver.Seeder)
	if !ok {
		return driver.Outcome{}, unsupported("take states")
	}
	return sd.Seed(ctx, v.rewrite(req), given)
}

// Reset implements driver.Resetter.
func (v *v1Keys) Reset(ctx context.Context, p *driver.Policy, identifier string) error {
	rs, ok := v.next.(driver.Resetter)
	if !ok {
		return unsupported("reset")
	}
	return rs.Reset(ctx, v.policy(p), identifier)
}

// Ping implements driver.Pinger.
func (v *v1Keys) Ping(ctx context.Context) error {
	if pg, ok := v.next.(driver.Pinger); ok {
		return pg.Ping(ctx)
	}
	return nil
}

// Nonblocking implements driver.Nonblocking.
func (v *v1Keys) Nonblocking() bool {
	nb, ok := v.next.(driver.Nonblocking)
	return ok && nb.Nonblocking()
}

// UpgradeKeys returns the backend a deployment uses while it moves from the
// limit keys of layout 1 to those of layout 2 in one store b, once every
// process of the release that wrote layout 1 has stopped:
// Upgrade(KeyLayoutV1(b), b). For a store whose own layout changed since
// (one that has a view of its earlier layout, a Layout2 method returning a
// driver.Backend, as redisbackend.Backend has: layout 1 kept a string per
// limit, layout 3 one hash per policy), the old side is that view instead:
// Upgrade(KeyLayoutV1(b.Layout2()), b), so that the layout-1 strings are
// the ones read. Once every process has run it for the longest horizon of
// its policies (the longest window, twice that for a sliding window), the
// layout-1 keys hold nothing that counts and b can be used alone. b is
// closed once, with the returned Backend's Close: the layout-1 side has no
// Close of its own.
//
// While processes of the earlier release may still decide, they count in
// the layout-1 keys only, and so must the new processes: see
// docs/MIGRATION.md, "Upgrading throttlekit", for the deploy that runs
// beside them.
func UpgradeKeys(b driver.Backend, opts ...Option) (*Backend, error) {
	if b == nil {
		return nil, fmt.Errorf("%w: rollout: nil backend", driver.ErrInvalidOption)
	}
	from := b
	if old, ok := b.(interface{ Layout2() driver.Backend }); ok {
		from = old.Layout2()
	}
	return Upgrade(KeyLayoutV1(from), b, opts...)
}

// Upgrade returns the backend a deployment uses while it moves its state
// from one stored layout, from, to another, to, without a window restart:
// a split-mode rollout at 100 % from from to to, with seeding, so that every
// identifier's first decision within its policy's horizon reads its state
// in from and carries it into to in the same step. No open window restarts
// and no quota is granted twice; from is only read (peeked) and reset, so
// it may be a read-only view such as KeyLayoutV1 over a store, or the
// layout-2 view of the Redis backend (redisbackend.Backend.Layout2). Once
// every process has run it for the longest horizon of its policies, from
// holds nothing that counts and to can be used alone. opts are rollout
// options (say WithSeedMemory); the mode and source are set here. Reset
// forgets the state in both.
func Upgrade(from, to driver.Backend, opts ...Option) (*Backend, error) {
	if from == nil || to == nil {
		return nil, fmt.Errorf("%w: rollout: nil backend", driver.ErrInvalidOption)
	}
	all, err := NewStaticSource(100, WithStaticGroupID("throttlekit-layout-upgrade"))
	if err != nil {
		return nil, err
	}
	opts = append(opts, WithMode(SplitMode), WithSeeding(true))
	return New(from, to, all, opts...)
}
