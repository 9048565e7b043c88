package otelobserver

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/throttlekit/throttlekit/observe"
	"github.com/throttlekit/throttlekit/throttler"
)

// spanName names an operation's span; the set is fixed so that span names
// stay few.
func spanName(op string) string {
	switch op {
	case "allow":
		return "throttlekit.allow"
	case "peek":
		return "throttlekit.peek"
	case "refund":
		return "throttlekit.refund"
	case "reset":
		return "throttlekit.reset"
	}
	return "throttlekit.operation"
}

// span records e as a child span of the caller's span, back-dated by the
// backend call's latency. It makes none outside a trace.
func (o *Observer) span(ctx context.Context, e *throttler.Event) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	end := time.Now()
	_, sp := o.tracer.Start(ctx, spanName(e.Op), trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithTimestamp(end.Add(-e.Latency)))
	if !sp.IsRecording() {
		sp.End(trace.WithTimestamp(end))
		return
	}
	attrs := make([]attribute.KeyValue, 0, 12)
	attrs = append(attrs, PolicyKey.String(e.Policy), BackendKey.String(e.Backend))
	if o.withID && e.Identifier != "" {
		attrs = append(attrs, IdentifierKey.String(e.Identifier))
	}
	if e.HasResult() {
		r := &e.Result
		if e.Op == "allow" {
			attrs = append(attrs, OutcomeKey.String(observe.Outcome(r)))
		}
		attrs = append(attrs, LimitKey.String(r.Binding), QuotaKey.Int64(r.Limit), RemainingKey.Int64(r.Remaining))
		switch {
		case r.Allowed:
		case r.RetryAfter == throttler.Never || r.NeverAllowed:
			attrs = append(attrs, NeverAllowedKey.Bool(true))
		default:
			attrs = append(attrs, RetryAfterKey.Float64(r.RetryAfter.Seconds()))
		}
	}
	if e.Err != nil {
		kind := observe.ErrorKind(e.Err)
		attrs = append(attrs, ErrorTypeKey.String(kind))
		// The error's text is left out: a store's error may quote a key,
		// and keys hold identifiers.
		sp.SetStatus(codes.Error, "backend "+kind)
	}
	sp.SetAttributes(attrs...)
	sp.End(trace.WithTimestamp(end))
}
