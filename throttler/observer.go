package throttler

import (
	"context"
	"log/slog"
	"time"
)

// Event describes one throttler operation for an Observer.
type Event struct {
	// Op is the operation: "allow" (AllowN, Allow and each subject of
	// AllowAll), "peek", "refund" or "reset".
	Op string
	// Policy is the policy's name.
	Policy string
	// Result is the decision, for allow, peek and refund; nil otherwise and
	// when the operation failed.
	Result *Result
	// Err is the backend failure, or nil. A degraded Result carries it too.
	Err error
	// Latency is how long the backend call took.
	Latency time.Duration
}

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

// logFailure logs a backend failure at Warn level, with the caller's
// context.
func logFailure(ctx context.Context, l *slog.Logger, e Event) {
	l.LogAttrs(ctx, slog.LevelWarn, "throttlekit: backend failure",
		slog.String("op", e.Op), slog.String("policy", e.Policy),
		slog.Duration("latency", e.Latency), slog.Any("error", e.Err))
}
