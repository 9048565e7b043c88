package conformance_test

import (
	"context"
	"testing"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/conformance"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// memoryHarness shares one memory backend between the backends it makes.
type memoryHarness struct{ b *memorybackend.Backend }

func (h memoryHarness) MakeBackend(context.Context) (driver.Backend, error) { return h.b, nil }
func (h memoryHarness) Close()                                              {}

// TestStateDifferentialMemory runs the state-level differential on the
// memory backend, whose Decide, Take, Refund and Seed call the driver
// functions under its shard locks.
func TestStateDifferentialMemory(t *testing.T) {
	conformance.RunStateDifferential(t, func(context.Context, testing.TB) (conformance.Harness, error) {
		return memoryHarness{memorybackend.New()}, nil
	})
}
