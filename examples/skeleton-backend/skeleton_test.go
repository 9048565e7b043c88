package skeleton_test

import (
	"context"
	"testing"

	"github.com/throttlekit/throttlekit/conformance"
	skeleton "github.com/throttlekit/throttlekit/examples/skeleton-backend"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// harness shares one Store between every backend it makes, as processes
// share one server; a fresh Store per subtest keeps subtests apart.
type harness struct{ store *skeleton.Store }

func (h harness) MakeBackend(context.Context) (driver.Backend, error) { return h.store, nil }
func (h harness) Close()                                              { _ = h.store.Close() }

func newHarness(context.Context, testing.TB) (conformance.Harness, error) {
	return harness{skeleton.New()}, nil
}

// TestConformance runs the whole contract on the skeleton.
func TestConformance(t *testing.T) { conformance.Run(t, newHarness) }

// TestStates compares the skeleton's stored states with package driver's
// on random sequences that start from seeded states.
func TestStates(t *testing.T) { conformance.RunStateDifferential(t, newHarness) }
