package otelobserver_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/throttlekit/throttlekit/internal/testkit"
	otelobserver "github.com/throttlekit/throttlekit/observe/otel"
	"github.com/throttlekit/throttlekit/throttler"
)

// TestObserveAllocatesNothing: once a policy's limit and a backend's
// operation have been seen, recording a decision's metrics with the SDK's
// MeterProvider allocates nothing, for every kind of event, a failed call's
// included.
func TestObserveAllocatesNothing(t *testing.T) {
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	o, err := otelobserver.New(otelobserver.WithMeterProvider(mp))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	r := throttler.Result{Allowed: true, Limit: 10, Remaining: 1, Binding: "10/min", Policy: "api", Identifier: "alice", At: testkit.T0}
	events := []throttler.Event{
		{Op: "allow", Policy: "api", Identifier: "alice", Backend: "memory", Result: r, Latency: 40 * time.Microsecond},
		{Op: "allow", Policy: "api", Identifier: "bob", Backend: "redis", Result: throttler.Result{Limit: 10, Binding: "10/min", At: testkit.T0, RetryAfter: time.Second}, Latency: time.Millisecond},
		{Op: "allow", Policy: "api", Identifier: "carol", Backend: "redis", Result: throttler.Result{Cached: true, Binding: "10/min", At: testkit.T0}},
		{Op: "allow", Policy: "api", Identifier: "dave", Backend: "redis", Result: throttler.Result{Allowed: true, Degraded: true, Binding: "10/min", At: testkit.T0, Err: context.DeadlineExceeded}, Err: context.DeadlineExceeded, Latency: 100 * time.Millisecond},
		{Op: "peek", Policy: "api", Identifier: "erin", Backend: "memory", Result: r},
		{Op: "reset", Policy: "api", Identifier: "erin", Backend: "memory"},
	}
	for _, e := range events {
		o.Observe(ctx, e) // the first sight of each key
		if n := testing.AllocsPerRun(100, func() { o.Observe(ctx, e) }); n > 0 {
			t.Errorf("Observe(%s %s) allocates %v times, want 0", e.Op, e.Identifier, n)
		}
	}
}

// TestThrottlerLinksNoOpenTelemetry: the throttler, and a program using it
// with the memory backend, link nothing from OpenTelemetry; only importing
// this package does.
func TestThrottlerLinksNoOpenTelemetry(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	out, err := exec.Command(goTool, "list", "-deps",
		"github.com/throttlekit/throttlekit/throttler",
		"github.com/throttlekit/throttlekit/backend/memory",
		"github.com/throttlekit/throttlekit/observe").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 10 {
		t.Fatalf("go list -deps listed %d packages, too few to be real:\n%s", len(deps), out)
	}
	for _, d := range deps {
		if strings.HasPrefix(d, "go.opentelemetry.io/") {
			t.Errorf("the throttler links %s", d)
		}
	}
}
