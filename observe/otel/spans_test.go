package otelobserver_test

import (
	"context"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
	otelobserver "github.com/throttlekit/throttlekit/observe/otel"
	"github.com/throttlekit/throttlekit/throttler"
)

// spanAttrs returns a span's attributes by key.
func spanAttrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// traced returns a tracer provider recording every span, the recorder, and
// an observer making spans with it.
func traced(t *testing.T, opts ...otelobserver.Option) (*sdktrace.TracerProvider, *tracetest.SpanRecorder, *otelobserver.Observer) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	o, err := otelobserver.New(append([]otelobserver.Option{otelobserver.WithTracerProvider(tp)}, opts...)...)
	require.NoError(t, err)
	return tp, rec, o
}

// TestSpansUnderTheCallersSpan: each operation under a caller's span is a
// child span with the decision's attributes and no identifier; outside a
// trace there is none.
func TestSpansUnderTheCallersSpan(t *testing.T) {
	tp, rec, o := traced(t)
	_, withClock := testkit.Clock()
	th := testkit.Throttler(t, memorybackend.New(), withClock, throttler.WithObserver(o))
	down := testkit.Throttler(t, failing{err: syscall.ECONNREFUSED}, withClock, throttler.WithObserver(o),
		throttler.WithLogger(nil), throttler.WithFailureMode(throttler.FailClosed))
	p := testkit.Policy(t, "api", "2/min")

	// Outside a trace: no span.
	_, err := th.Allow(context.Background(), p, "alice")
	require.NoError(t, err)
	require.Empty(t, rec.Ended())

	ctx, parent := tp.Tracer("test").Start(context.Background(), "GET /things")
	for range 2 {
		_, err := th.Allow(ctx, p, "alice")
		require.NoError(t, err)
	}
	_, err = down.Allow(ctx, p, "alice")
	require.NoError(t, err)
	require.NoError(t, th.Reset(ctx, p, "alice"))
	parent.End()

	spans := rec.Ended()
	require.Len(t, spans, 5, "4 operations and the parent")
	parentSC := parent.SpanContext()
	for _, s := range spans[:4] {
		assert.Equal(t, parentSC.SpanID(), s.Parent().SpanID(), "%s is a child of the caller's span", s.Name())
		assert.Equal(t, parentSC.TraceID(), s.SpanContext().TraceID())
		assert.Equal(t, trace.SpanKindInternal, s.SpanKind())
		assert.False(t, s.EndTime().Before(s.StartTime()))
		assert.Equal(t, otelobserver.ScopeName, s.InstrumentationScope().Name)
		for k, v := range spanAttrs(s) {
			assert.NotEqual(t, otelobserver.IdentifierKey, k)
			assert.NotEqual(t, "alice", v.Emit(), "%s: %s holds the identifier", s.Name(), k)
		}
	}

	allowed, denied, failed, reset := spans[0], spans[1], spans[2], spans[3]
	assert.Equal(t, "throttlekit.allow", allowed.Name())
	a := spanAttrs(allowed)
	assert.Equal(t, "api", a[otelobserver.PolicyKey].AsString())
	assert.Equal(t, "memory", a[otelobserver.BackendKey].AsString())
	assert.Equal(t, "allowed", a[otelobserver.OutcomeKey].AsString())
	assert.Equal(t, "2/min", a[otelobserver.LimitKey].AsString())
	assert.Equal(t, int64(2), a[otelobserver.QuotaKey].AsInt64())
	assert.Equal(t, int64(0), a[otelobserver.RemainingKey].AsInt64())
	assert.NotContains(t, a, otelobserver.RetryAfterKey)
	assert.Equal(t, codes.Unset, allowed.Status().Code)

	d := spanAttrs(denied)
	assert.Equal(t, "denied", d[otelobserver.OutcomeKey].AsString())
	assert.InDelta(t, 60.0, d[otelobserver.RetryAfterKey].AsFloat64(), 1, "retry_after in seconds")
	assert.Equal(t, codes.Unset, denied.Status().Code, "a denial is not an error")

	f := spanAttrs(failed)
	assert.Equal(t, "degraded_denied", f[otelobserver.OutcomeKey].AsString())
	assert.Equal(t, "unreachable", f[otelobserver.ErrorTypeKey].AsString())
	assert.Equal(t, "otel_test", f[otelobserver.BackendKey].AsString())
	assert.Equal(t, codes.Error, failed.Status().Code)
	assert.Empty(t, failed.Events(), "the error's text is not recorded")

	assert.Equal(t, "throttlekit.reset", reset.Name())
	r := spanAttrs(reset)
	assert.Equal(t, "api", r[otelobserver.PolicyKey].AsString())
	assert.NotContains(t, r, otelobserver.OutcomeKey)
}

// TestSpanIdentifierWhenAsked: WithIdentifierAttribute adds the identifier
// to spans, never to metrics.
func TestSpanIdentifierWhenAsked(t *testing.T) {
	tp, rec, o := traced(t, otelobserver.WithIdentifierAttribute())
	_, withClock := testkit.Clock()
	th := testkit.Throttler(t, memorybackend.New(), withClock, throttler.WithObserver(o))
	p := testkit.Policy(t, "api", "2/min")
	ctx, parent := tp.Tracer("test").Start(context.Background(), "request")
	_, err := th.Allow(ctx, p, "alice")
	require.NoError(t, err)
	parent.End()
	spans := rec.Ended()
	require.Len(t, spans, 2)
	assert.Equal(t, "alice", spanAttrs(spans[0])[otelobserver.IdentifierKey].AsString())
}

// TestSpansOff: WithSpans(false) after WithTracerProvider turns spans off,
// and an unsampled parent gets no recorded child.
func TestSpansOff(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	o, err := otelobserver.New(otelobserver.WithTracerProvider(tp), otelobserver.WithSpans(false))
	require.NoError(t, err)
	th := testkit.Throttler(t, memorybackend.New(), throttler.WithObserver(o))
	p := testkit.Policy(t, "api", "2/min")
	ctx, parent := tp.Tracer("test").Start(context.Background(), "request")
	_, err = th.Allow(ctx, p, "alice")
	require.NoError(t, err)
	parent.End()
	assert.Len(t, rec.Ended(), 1, "the parent only")

	rec2 := tracetest.NewSpanRecorder()
	never := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec2), sdktrace.WithSampler(sdktrace.NeverSample()))
	o2, err := otelobserver.New(otelobserver.WithTracerProvider(never))
	require.NoError(t, err)
	th2 := testkit.Throttler(t, memorybackend.New(), throttler.WithObserver(o2))
	ctx, parent = never.Tracer("test").Start(context.Background(), "request")
	_, err = th2.Allow(ctx, p, "alice")
	require.NoError(t, err)
	parent.End()
	assert.Empty(t, rec2.Ended())
}
