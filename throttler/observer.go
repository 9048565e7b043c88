package throttler

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"
)

// Event describes one throttler operation for an Observer. It is passed by
// value, so that observing costs the request path no allocation; an
// observer may keep one beyond Observe.
type Event struct {
	// Op is the operation: "allow" (AllowN, Allow and each subject of
	// AllowAll), "peek", "refund" or "reset"; for concurrency limits
	// "acquire" (Acquire), "renew" (Lease.Renew) or "release"
	// (Lease.Release).
	Op string
	// Policy is the policy's name, or the concurrency limit's.
	Policy string
	// Identifier is the identifier the operation was for. Observers that
	// feed metrics must not use it as a label: it is unbounded.
	Identifier string
	// Backend names the throttler's backend kind: the last element of the
	// backend's package path, such as "redis", "memcached" or "rollout".
	Backend string
	// Result is the decision, for allow, peek and refund; the zero Result
	// for reset and when the operation failed (HasResult reports which).
	// For acquire and renew it describes the lease: Allowed is whether it
	// is held, Limit the limit's Max, Used the leases in flight, Window the
	// lease TTL, ResetAt when the lease expires or, when refused, when the
	// earliest lease does, and RetryAfter the wait until then. Release
	// carries no Result.
	Result Result
	// Err is the backend failure, or nil. A degraded Result carries it too.
	Err error
	// Latency is how long the backend call took; 0 for a decision the
	// throttler answered without one (the deny cache, a cost above a
	// limit's capacity answered from a failed peek).
	Latency time.Duration
}

// HasResult reports whether e carries a Result.
func (e *Event) HasResult() bool { return !e.Result.At.IsZero() }

// Observer receives an Event after every operation, with the caller's
// context, so that logs and spans join the request's trace. It is how
// decisions and failures reach metrics. Observe runs on the request path:
// it must be fast and safe for concurrent use.
type Observer interface {
	Observe(ctx context.Context, e Event)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(ctx context.Context, e Event)

// Observe calls f(ctx, e).
func (f ObserverFunc) Observe(ctx context.Context, e Event) { f(ctx, e) }

// outageLogEvery is how often the throttler logs a count of the failures
// of a backend that keeps failing.
const outageLogEvery = 10 * time.Second

// outageQuiet is how long a backend must go without a failure, once it
// answers again, before the throttler logs that it recovered. A backend that
// fails some calls and serves others (one shard of several down) is still
// failing.
const outageQuiet = time.Second

// outageLog logs a backend's outage once, not once per request: a line at
// the first failure, a line every outageLogEvery with the failures counted
// since the last line, and a line when calls succeed again after
// outageQuiet without a failure. It costs a successful call one atomic
// load.
type outageLog struct {
	logger *slog.Logger
	every  time.Duration // outageLogEvery but in tests
	quiet  time.Duration // outageQuiet but in tests

	failing     atomic.Bool
	started     atomic.Int64  // unix ns of the outage's first failure
	lastFailure atomic.Int64  // unix ns of the latest failure
	lastLine    atomic.Int64  // unix ns of the latest line
	count       atomic.Uint64 // failures since the latest line
	total       atomic.Uint64 // failures since the outage began
}

// failure records a failed operation and logs if a line is due.
func (o *outageLog) failure(ctx context.Context, e Event) {
	now := time.Now().UnixNano()
	o.lastFailure.Store(now)
	o.total.Add(1)
	if !o.failing.Load() && o.failing.CompareAndSwap(false, true) {
		o.started.Store(now)
		o.lastLine.Store(now)
		o.count.Store(0)
		o.logger.LogAttrs(ctx, slog.LevelWarn, "throttlekit: backend failing; decisions follow the failure mode",
			slog.String("op", e.Op), slog.String("policy", e.Policy),
			slog.Duration("latency", e.Latency), slog.Any("error", e.Err))
		return
	}
	o.count.Add(1)
	last := o.lastLine.Load()
	if now-last < int64(o.every) || !o.lastLine.CompareAndSwap(last, now) {
		return
	}
	o.logger.LogAttrs(ctx, slog.LevelWarn, "throttlekit: backend still failing",
		slog.Uint64("failures", o.count.Swap(0)),
		slog.Duration("interval", time.Duration(now-last).Round(time.Millisecond)),
		slog.Duration("outage", time.Duration(now-o.started.Load()).Round(time.Millisecond)),
		slog.String("op", e.Op), slog.String("policy", e.Policy), slog.Any("error", e.Err))
}

// success records a successful operation; after an outage, once no call
// has failed for outageQuiet, it logs the recovery.
func (o *outageLog) success(ctx context.Context) {
	if !o.failing.Load() {
		return
	}
	now := time.Now().UnixNano()
	if now-o.lastFailure.Load() < int64(o.quiet) || !o.failing.CompareAndSwap(true, false) {
		return
	}
	o.lastLine.Store(now)
	o.logger.LogAttrs(ctx, slog.LevelInfo, "throttlekit: backend recovered",
		slog.Duration("outage", time.Duration(o.lastFailure.Load()-o.started.Load()).Round(time.Millisecond)),
		slog.Uint64("failures", o.total.Swap(0)))
	o.count.Store(0)
}
