package otelobserver_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// failing is a backend whose store is always down, with err.
type failing struct{ err error }

func (f failing) Decide(context.Context, driver.Request) (driver.Outcome, error) {
	return driver.Outcome{}, f.err
}

// metrics collects reader's metrics by instrument name.
func metrics(t testing.TB, reader *sdkmetric.ManualReader) map[string]metricdata.Metrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// matches reports whether set holds every key and value of kv.
func matches(set attribute.Set, kv []string) bool {
	for i := 0; i+1 < len(kv); i += 2 {
		v, ok := set.Value(attribute.Key(kv[i]))
		if !ok || v.Emit() != kv[i+1] {
			return false
		}
	}
	return true
}

// point returns the value of the data point of m whose attributes include
// kv (key, value, key, value...), as a float64, and whether there is one.
// A histogram's value is its count.
func point(m metricdata.Metrics, kv ...string) (float64, bool) {
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			if matches(p.Attributes, kv) {
				return float64(p.Value), true
			}
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			if matches(p.Attributes, kv) {
				return float64(p.Value), true
			}
		}
	case metricdata.Gauge[float64]:
		for _, p := range d.DataPoints {
			if matches(p.Attributes, kv) {
				return p.Value, true
			}
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			if matches(p.Attributes, kv) {
				return float64(p.Count), true
			}
		}
	}
	return 0, false
}

// attributeSets returns every data point's attributes of m.
func attributeSets(m metricdata.Metrics) []attribute.Set {
	var out []attribute.Set
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			out = append(out, p.Attributes)
		}
	}
	return out
}
