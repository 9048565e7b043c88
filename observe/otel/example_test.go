package otelobserver_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	otelobserver "github.com/throttlekit/throttlekit/observe/otel"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// An Observer recording a throttler's decisions with the SDK's
// MeterProvider. A program gives the provider a periodic reader and an
// OTLP exporter; here a ManualReader collects once and the counters are
// printed.
func Example() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	obs, err := otelobserver.New(otelobserver.WithMeterProvider(mp))
	if err != nil {
		panic(err)
	}

	clock := throttlertest.NewManualClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	t, err := throttler.New(memorybackend.New(), throttler.WithClock(clock), throttler.WithObserver(obs))
	if err != nil {
		panic(err)
	}
	p, err := throttler.ParsePolicy("api", "5/min")
	if err != nil {
		panic(err)
	}
	for range 7 {
		if _, err := t.Allow(context.Background(), p, "alice"); err != nil {
			panic(err)
		}
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		panic(err)
	}
	var lines []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch data := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range data.DataPoints {
					var attrs []string
					for _, kv := range dp.Attributes.ToSlice() {
						attrs = append(attrs, fmt.Sprintf("%s=%s", kv.Key, kv.Value.Emit()))
					}
					lines = append(lines, fmt.Sprintf("%s{%s} %d", m.Name, strings.Join(attrs, ","), dp.Value))
				}
			case metricdata.Histogram[float64]:
				for _, dp := range data.DataPoints {
					lines = append(lines, fmt.Sprintf("%s [%s] count %d", m.Name, m.Unit, dp.Count))
				}
			}
		}
	}
	sort.Strings(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
	// Output:
	// throttlekit.backend.call.duration [s] count 7
	// throttlekit.decisions{throttlekit.limit=5/min,throttlekit.outcome=allowed,throttlekit.policy=api} 5
	// throttlekit.decisions{throttlekit.limit=5/min,throttlekit.outcome=denied,throttlekit.policy=api} 2
	// throttlekit.near_limit{throttlekit.limit=5/min,throttlekit.policy=api} 1
}
