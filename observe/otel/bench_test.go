package otelobserver_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
	otelobserver "github.com/throttlekit/throttlekit/observe/otel"
	"github.com/throttlekit/throttlekit/throttler"
)

// BenchmarkObserve measures what the Observer adds to a decision: the bare
// throttler over the memory backend beside the same throttler observed
// with the SDK's MeterProvider (metrics), and with spans as well under a
// sampled caller's span (spans), serially and from 64 goroutines, on
// 10,000 identifiers under a limit they do not reach. Compare ns/op and
// allocs/op with bare.
func BenchmarkObserve(b *testing.B) {
	ids := make([]string, 10000)
	for i := range ids {
		ids[i] = "user:" + strconv.Itoa(i)
	}
	p := testkit.Policy(b, "api", "1000000/min")
	for _, bc := range []string{"bare", "metrics", "spans"} {
		opts := []throttler.Option{throttler.WithLogger(nil)}
		ctx := context.Background()
		if bc != "bare" {
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
			oo := []otelobserver.Option{otelobserver.WithMeterProvider(mp)}
			if bc == "spans" {
				// A recorder that keeps nothing, so that memory stays flat.
				tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(discard{}))
				oo = append(oo, otelobserver.WithTracerProvider(tp))
				var parent trace.Span
				ctx, parent = tp.Tracer("bench").Start(ctx, "request")
				defer parent.End()
			}
			o, err := otelobserver.New(oo...)
			if err != nil {
				b.Fatal(err)
			}
			opts = append(opts, throttler.WithObserver(o))
		}
		b.Run(bc+"/serial", func(b *testing.B) {
			th := testkit.Throttler(b, memorybackend.New(), opts...)
			b.ReportAllocs()
			for i := 0; b.Loop(); i++ {
				if _, err := th.Allow(ctx, p, ids[i%len(ids)]); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(bc+"/parallel64", func(b *testing.B) {
			th := testkit.Throttler(b, memorybackend.New(), opts...)
			b.ReportAllocs()
			b.SetParallelism(32) // 64 goroutines on 2 CPUs
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					if _, err := th.Allow(ctx, p, ids[i%len(ids)]); err != nil {
						b.Error(err)
						return
					}
					i += 7
				}
			})
		})
	}
}

// BenchmarkObserveOnly measures Observe alone, on a decision's event, with
// the SDK's MeterProvider.
func BenchmarkObserveOnly(b *testing.B) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	o, err := otelobserver.New(otelobserver.WithMeterProvider(mp))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	e := throttler.Event{Op: "allow", Policy: "api", Identifier: "alice", Backend: "memory", Latency: 30 * time.Microsecond,
		Result: throttler.Result{Allowed: true, Limit: 100, Remaining: 50, Binding: "100/min", At: testkit.T0}}
	b.ReportAllocs()
	for b.Loop() {
		o.Observe(ctx, e)
	}
}

// discard is a span processor that drops every span.
type discard struct{}

func (discard) OnStart(context.Context, sdktrace.ReadWriteSpan) {}
func (discard) OnEnd(sdktrace.ReadOnlySpan)                     {}
func (discard) Shutdown(context.Context) error                  { return nil }
func (discard) ForceFlush(context.Context) error                { return nil }
