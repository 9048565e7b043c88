package driver

import "log/slog"

// LoggerSetter is implemented by backends that log something of their own
// (advice about the store's configuration, a breaker opening), so that they
// log where the throttler does rather than to slog.Default().
//
// throttler.New calls SetLogger once, before the first call, when it is
// given throttler.WithLogger: with that logger, or with nil, which means
// log nothing. It calls it on the local fallback store of
// WithLocalFallback too. A decorator (sharded, rollout, ...) implements it
// by passing the logger to every backend it wraps that implements it.
// SetLogger may be called again, by a second throttler over the same
// backend: the last call wins, and it must be safe while calls run.
//
// Fallback: without LoggerSetter, the backend logs where it likes, usually
// to slog.Default(); a backend that implements it logs to slog.Default()
// until SetLogger is called.
type LoggerSetter interface {
	SetLogger(l *slog.Logger)
}

// LoggerOrDiscard returns l, or, for a nil l, a logger that writes
// nothing: what a SetLogger implementation stores, so that its log calls
// need no nil check.
func LoggerOrDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
