package memory_test

import (
	"context"
	"testing"

	"github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/conformance"
	"github.com/throttlekit/throttlekit/throttler"
)

// harness shares one memory backend between every backend it makes, as
// processes share one store.
type harness struct{ b *memory.Backend }

func (h harness) MakeBackend(context.Context) (throttler.Backend, error) { return h.b, nil }
func (h harness) Close()                                                 {}

func newHarness(context.Context, testing.TB) (conformance.Harness, error) {
	return harness{memory.New()}, nil
}

func TestConformance(t *testing.T) { conformance.Run(t, newHarness) }

func BenchmarkConformance(b *testing.B) { conformance.RunBenchmarks(b, newHarness) }
