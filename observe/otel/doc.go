// Package otelobserver records a throttler's decisions, backend calls,
// circuit breakers and rollout as OpenTelemetry metrics, and optionally as
// spans. It counts what the Prometheus collector (observe/prometheus)
// counts, under OpenTelemetry's naming conventions: dotted names, units in
// the instrument's unit rather than its name.
//
//	obs, err := otelobserver.New(otelobserver.WithSpans(true))
//	t, err := throttler.New(backend, throttler.WithObserver(obs))
//
// Metrics go to otel.GetMeterProvider() unless WithMeterProvider says
// otherwise, under the instrumentation scope ScopeName.
//
// # Metrics
//
//	throttlekit.decisions             counter    {decision}  throttlekit.policy, throttlekit.limit, throttlekit.outcome
//	throttlekit.near_limit            counter    {decision}  throttlekit.policy, throttlekit.limit
//	throttlekit.backend.call.duration histogram  s           throttlekit.backend, throttlekit.op
//	throttlekit.backend.errors        counter    {error}     throttlekit.backend, throttlekit.op, error.type
//	throttlekit.breaker.state         gauge      1           throttlekit.server, throttlekit.state
//	throttlekit.breaker.rejected      counter    {call}      throttlekit.server
//	throttlekit.rollout.new_ratio     gauge      1           throttlekit.rollout.name
//	throttlekit.rollout.killed        gauge      1           throttlekit.rollout.name
//	throttlekit.rollout.events        counter    {event}     throttlekit.rollout.name, throttlekit.rollout.event
//	throttlekit.rollout.mismatches    counter    {mismatch}  throttlekit.rollout.name, throttlekit.rollout.mismatch
//
// They match the Prometheus collector's throttlekit_decisions_total,
// throttlekit_near_limit_total, throttlekit_backend_call_duration_seconds,
// throttlekit_backend_errors_total and so on, and an OTLP-to-Prometheus
// translation gives close names. throttlekit.limit is the binding limit's
// name (the denying one for a denial, the tightest for an allowance).
// throttlekit.outcome is one of observe.Outcomes: allowed, denied, cached,
// degraded_allowed, degraded_denied, local_allowed, local_denied. A
// near-limit decision is an allowed one that left its binding limit under
// a fraction of its quota, 20% unless WithNearLimit says otherwise.
// throttlekit.op is allow, peek, refund or reset; error.type is one of
// observe.ErrorKinds. A denial answered from the deny cache made no backend
// call and adds no duration sample. The histogram's buckets are advised
// (DefaultBuckets, WithBuckets); a View may replace them.
//
// The breaker and rollout instruments exist only with WithBreakers or
// WithRollout, and are read by a callback at each collection; Close
// unregisters it.
//
// # Spans
//
// With WithSpans(true) or WithTracerProvider, each operation made under a
// caller's span becomes a child span of it: throttlekit.allow,
// throttlekit.peek, throttlekit.refund or throttlekit.reset, of kind
// Internal. An operation outside any trace makes no span, so that rate
// limit checks never start traces of their own; the caller's sampler
// decides as for any child. A span, rather than an event on the caller's
// span, is chosen because it shows how long the backend call took in the
// trace's timeline. The observer runs after the call, so the span is made
// then and back-dated by the call's latency; spans that instrumentation of
// the store itself makes (a Redis client's) are its siblings, not its
// children.
//
// A span carries throttlekit.policy, throttlekit.backend and, when the
// operation has a result, throttlekit.limit, throttlekit.quota and
// throttlekit.remaining; a decision adds throttlekit.outcome, and a denial
// throttlekit.retry_after in seconds (throttlekit.never_allowed for a cost
// above a limit's capacity). A failed call sets the span's status to Error
// and error.type to the error's kind; the error's text is left out, since
// a store's error may quote a key and keys hold identifiers. The
// identifier is added, as throttlekit.identifier, only with
// WithIdentifierAttribute.
//
// # Cardinality
//
// No metric has the identifier as an attribute, whatever the options: the
// number of identifiers is unbounded, and each attribute set is a time
// series that the SDK, the collector and the backend hold. Metric
// attributes take policy names, limit names, backend kinds, operations,
// outcomes, error kinds, breaker servers and rollout names, which a program
// fixes. A span is one record, not a series, so it may carry the
// identifier when asked.
//
// # Cost
//
// Nothing is paid when this package is not used: the throttler package
// imports nothing from OpenTelemetry, and only a program that imports
// otelobserver links it. An Observer costs each decision two lookups in
// copy-on-write maps (atomic loads, no lock) that hold precomputed
// attribute sets, and the SDK's Add and Record: with the SDK's
// MeterProvider, no allocation once a policy's limit and a backend's
// operation have been seen (TestObserveAllocatesNothing,
// BenchmarkObserve), a failed call's included. The first decision of a new policy, limit or
// operation takes a lock to compute its sets. A span
// allocates what the tracer needs to build and export it; outside a trace,
// or unsampled, it costs a check of the context.
//
// # Module
//
// This package is a module of its own, github.com/throttlekit/throttlekit/observe/otel,
// so that a program that does not import it never inherits OpenTelemetry in its
// go.mod: go get it beside the core. It is released and tested with the
// core at the same commit.
package otelobserver
