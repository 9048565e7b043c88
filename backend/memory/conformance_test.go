package memorybackend_test

import (
	"context"
	"testing"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/conformance"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// harness shares one memory backend between every backend it makes, as
// processes share one store.
type harness struct{ b *memorybackend.Backend }

func (h harness) MakeBackend(context.Context) (driver.Backend, error) { return h.b, nil }
func (h harness) Close()                                              {}

func newHarness(context.Context, testing.TB) (conformance.Harness, error) {
	return harness{memorybackend.New()}, nil
}

func TestConformance(t *testing.T) { conformance.Run(t, newHarness) }

func BenchmarkConformance(b *testing.B) { conformance.RunBenchmarks(b, newHarness) }
