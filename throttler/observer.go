package throttler

import (
	"context"
	"log/slog"
	"time"
)

// Op names a throttler operation in an Event.
type Op string

// The operations a Throttler reports.
const (
	OpAllow  Op = "allow"
	OpPeek   Op = "peek"
	OpRefund Op = "refund"
	OpReset  Op = "reset"
)

// Event describes one throttler operation for an Observer.
type Event struct {
	// Op is the operation.
	Op Op
	// Policy is the policy's name.
	Policy string
	// Result is the decision, for allow and peek; nil otherwise.
	Result *Result
	// Err is the backend failure, or nil. A degraded Result carries it too.
	Err error
	// Latency is how long the backend call took.
	Latency time.Duration
}

// Observer receives an Event after every operation. It is how errors and
// decisions reach logs and metrics. Observe is called on the request path
// and must be fast and safe for concurrent use.
type Observer interface {
	Observe(Event)
}

// ObserverFunc adapts a function to Observer.
type ObserverFunc func(Event)

// Observe calls f(e).
func (f ObserverFunc) Observe(e Event) { f(e) }

// NopObserver ignores every event.
type NopObserver struct{}

// Observe does nothing.
func (NopObserver) Observe(Event) {}

// SlogObserver logs every event that carries an error at Warn level, with the
// operation, the policy and the latency. It is the throttler's default, on
// slog.Default() when Logger is nil.
type SlogObserver struct {
	Logger *slog.Logger
}

// Observe logs e if it carries an error.
func (o SlogObserver) Observe(e Event) {
	if e.Err == nil {
		return
	}
	l := o.Logger
	if l == nil {
		l = slog.Default()
	}
	l.LogAttrs(context.Background(), slog.LevelWarn, "throttler: backend failure",
		slog.String("op", string(e.Op)), slog.String("policy", e.Policy),
		slog.Duration("latency", e.Latency), slog.Any("error", e.Err))
}

// MultiObserver sends every event to each of its observers in turn.
type MultiObserver []Observer

// Observe passes e to every observer.
func (m MultiObserver) Observe(e Event) {
	for _, o := range m {
		o.Observe(e)
	}
}
