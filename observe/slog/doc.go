// Package slogobserver logs a throttler's decisions with log/slog, with the
// caller's context, so that a handler which reads trace and span IDs from
// the context (an OpenTelemetry bridge, a handler of your own) puts each
// line in the request's trace.
//
//	t, err := throttler.New(backend, throttler.WithObserver(slogobserver.New(logger)))
//
// Levels, each changeable with WithLevels:
//
//   - a denial: Info, with the policy, the identifier, the binding limit,
//     its quota and RetryAfter (a denial from the deny cache says so);
//   - an allowed decision, a peek, a refund and a reset: Debug;
//   - a degraded decision or a failed call: Debug as well. A backend outage
//     is the throttler's own log to report (WithLogger): one line when it
//     starts, a count every 10 s, one line when it ends. Logging each
//     failed request again here would flood the log when it matters most.
//
// A line is built only when the logger is enabled for its level, so a
// Debug line costs an Info logger one Enabled call.
//
// Unlike a metric label, a log line may name the identifier: it is one
// line per event, not a time series. WithoutIdentifier leaves it out
// where identifiers are personal data.
package slogobserver
