package conformance_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/conformance"
	"github.com/throttlekit/throttlekit/throttler"
)

// TestStateDifferential runs the state-level differential against the
// reference backend, which calls the driver functions under a lock.
func TestStateDifferential(t *testing.T) {
	conformance.RunStateDifferential(t, referenceMaker(correct, false))
}

// stateFaultEnv names the fault TestStateDifferentialChild runs against.
const stateFaultEnv = "CONFORMANCE_TEST_STATE_FAULT"

// TestStateDifferentialCatchesFaults re-runs this test binary once per
// fault a sequential state check can see, and checks that the differential
// fails against it, cleanly and with a replayable seed.
func TestStateDifferentialCatchesFaults(t *testing.T) {
	for _, f := range []fault{consumesOnDenial, slidingResetAt, closedWindowLivesOn, boundaryInclusive,
		refundUnclamped, seedOverwrites, seedIgnoresGiven, seedDecidesFirst, seedPriorAfter} {
		t.Run(string(f), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestStateDifferentialChild$", "-test.count=1", "-test.timeout=2m")
			cmd.Env = append(os.Environ(), stateFaultEnv+"="+string(f))
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || ctx.Err() != nil {
				t.Fatalf("child run: err = %v, want a non-zero exit in time; output:\n%s", err, out)
			}
			for _, want := range []string{"--- FAIL: TestStateDifferentialChild", "backend and package driver disagree", conformance.SeedEnv + "="} {
				if !strings.Contains(string(out), want) {
					t.Errorf("child output lacks %q:\n%s", want, out)
				}
			}
			if strings.Contains(string(out), "panic:") {
				t.Errorf("the child panicked instead of failing cleanly:\n%s", out)
			}
		})
	}
}

// TestStateDifferentialChild runs the differential against the broken
// backend stateFaultEnv names; it is meant to fail, so it runs only as
// TestStateDifferentialCatchesFaults's child.
func TestStateDifferentialChild(t *testing.T) {
	f := fault(os.Getenv(stateFaultEnv))
	if f == correct {
		t.Skip("runs only as TestStateDifferentialCatchesFaults's child process")
	}
	conformance.RunStateDifferential(t, referenceMaker(f, false))
}

// timeoutHarness is a reference harness that asks for a call timeout.
type timeoutHarness struct {
	referenceHarness
	timeout time.Duration
}

func (h *timeoutHarness) CallTimeout() time.Duration { return h.timeout }

// TestCallTimeoutChoice: a harness without CallTimeout gets
// DefaultCallTimeout, one with it gets what it asks for, zero included.
func TestCallTimeoutChoice(t *testing.T) {
	plain := &referenceHarness{}
	if got := conformance.CallTimeoutOf(t, plain); got != conformance.DefaultCallTimeout {
		t.Errorf("without CallTimeout: %v, want %v", got, conformance.DefaultCallTimeout)
	}
	for _, d := range []time.Duration{0, throttler.DefaultCallTimeout, time.Minute} {
		if got := conformance.CallTimeoutOf(t, &timeoutHarness{timeout: d}); got != d {
			t.Errorf("CallTimeout() = %v: the suite uses %v", d, got)
		}
	}
}
