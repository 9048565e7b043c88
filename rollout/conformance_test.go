package rollout

import (
	"context"
	"fmt"
	"testing"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/conformance"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// rolloutHarness holds the two memory backends every rollout Backend of one
// harness shares, as processes share two stores: each MakeBackend returns
// a new rollout Backend (with its own static source at the same
// percentage) over the same two.
type rolloutHarness struct {
	oldB, newB *memorybackend.Backend
	percent    int
	mode       Mode
}

func (h *rolloutHarness) MakeBackend(context.Context) (driver.Backend, error) {
	src, err := NewStaticSource(h.percent)
	if err != nil {
		return nil, err
	}
	return New(h.oldB, h.newB, src, WithMode(h.mode))
}

func (h *rolloutHarness) Close() {}

// TestConformance runs the conformance suite through rollout Backends over
// two memory backends at 0%, 50% and 100%, in every mode.
func TestConformance(t *testing.T) {
	for _, mode := range []Mode{SplitMode, MirrorMode, ShadowMode} {
		for _, percent := range []int{0, 50, 100} {
			t.Run(fmt.Sprintf("%s/%d%%", mode, percent), func(t *testing.T) {
				conformance.Run(t, func(context.Context, testing.TB) (conformance.Harness, error) {
					return &rolloutHarness{oldB: memorybackend.New(), newB: memorybackend.New(), percent: percent, mode: mode}, nil
				})
			})
		}
	}
}
