package slogobserver

import (
	"context"
	"log/slog"

	"github.com/throttlekit/throttlekit/observe"
	"github.com/throttlekit/throttlekit/throttler"
)

// Levels are the levels an Observer logs at.
type Levels struct {
	// Denied is the level of denials; Info by default.
	Denied slog.Level
	// Allowed is the level of allowed decisions, peeks, refunds and
	// resets; Debug by default.
	Allowed slog.Level
	// Degraded is the level of degraded decisions and failed calls; Debug
	// by default (see the package doc).
	Degraded slog.Level
}

// DefaultLevels are the levels New uses.
var DefaultLevels = Levels{Denied: slog.LevelInfo, Allowed: slog.LevelDebug, Degraded: slog.LevelDebug}

// Option configures an Observer (New). The options of this package cannot
// fail, so that New needs no error.
type Option interface {
	apply(*Observer) error
}

// optionFunc adapts a function to Option.
type optionFunc func(*Observer) error

func (f optionFunc) apply(o *Observer) error { return f(o) }

// WithLevels sets the levels lines are logged at.
func WithLevels(l Levels) Option {
	return optionFunc(func(o *Observer) error { o.levels = l; return nil })
}

// WithoutIdentifier leaves the identifier out of every line.
func WithoutIdentifier() Option {
	return optionFunc(func(o *Observer) error { o.noID = true; return nil })
}

// Observer is a throttler.Observer that logs to a slog.Logger. It is safe
// for concurrent use.
type Observer struct {
	logger *slog.Logger
	levels Levels
	noID   bool
}

// New returns an Observer logging to logger; a nil logger means
// slog.Default().
func New(logger *slog.Logger, opts ...Option) *Observer {
	if logger == nil {
		logger = slog.Default()
	}
	o := &Observer{logger: logger, levels: DefaultLevels}
	for _, opt := range opts {
		if opt != nil {
			_ = opt.apply(o) // cannot fail: see Option
		}
	}
	return o
}

// Observe implements throttler.Observer: it logs e with ctx.
func (o *Observer) Observe(ctx context.Context, e throttler.Event) {
	r := &e.Result
	level, msg := o.levels.Allowed, "throttlekit: "+e.Op
	switch {
	case e.Err != nil || r.Degraded:
		level, msg = o.levels.Degraded, "throttlekit: "+e.Op+" failed"
	case e.Op == "allow" && e.HasResult() && !r.Allowed:
		level, msg = o.levels.Denied, "throttlekit: denied"
	}
	if !o.logger.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, 10)
	attrs = append(attrs, slog.String("policy", e.Policy))
	if !o.noID && e.Identifier != "" {
		attrs = append(attrs, slog.String("identifier", e.Identifier))
	}
	if e.HasResult() {
		if e.Op == "allow" {
			attrs = append(attrs, slog.String("outcome", observe.Outcome(r)))
		}
		attrs = append(attrs, slog.String("limit", r.Binding), slog.Int64("quota", r.Limit),
			slog.Int64("remaining", r.Remaining), slog.Time("reset_at", r.ResetAt))
		if !r.Allowed {
			attrs = append(attrs, slog.Duration("retry_after", r.RetryAfter))
		}
	}
	attrs = append(attrs, slog.String("backend", e.Backend))
	if e.Latency > 0 {
		attrs = append(attrs, slog.Duration("latency", e.Latency))
	}
	if e.Err != nil {
		attrs = append(attrs, slog.String("error_kind", observe.ErrorKind(e.Err)), slog.Any("error", e.Err))
	}
	o.logger.LogAttrs(ctx, level, msg, attrs...)
}
