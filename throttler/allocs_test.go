//go:build !race

package throttler_test

import (
	"context"
	"strconv"
	"testing"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
)

// An in-process decision allocates nothing for policies of up to four
// limits, once the identifier is stored: the Result holds its per-limit
// states in place and the backend's buffer is pooled. (The race detector
// allocates on its own, hence the build tag.)
func TestInProcessDecisionAllocatesNothing(t *testing.T) {
	for _, spec := range []string{
		"1000000/min",
		"100000/s, 1000000/min",
		"100000/s, 1000000/min gcra, 10000000/h sliding",
		"100000/s, 1000000/min aligned, 10000000/h gcra, 10000000/day sliding",
	} {
		p := testkit.Policy(t, "api", spec)
		th := testkit.Throttler(t, memorybackend.New())
		ctx := context.Background()
		ids := make([]string, 16)
		for i := range ids {
			ids[i] = "user:" + strconv.Itoa(i)
			if _, err := th.Allow(ctx, p, ids[i]); err != nil {
				t.Fatal(err)
			}
		}
		i := 0
		var binding int64
		allocs := testing.AllocsPerRun(200, func() {
			r, err := th.Allow(ctx, p, ids[i%len(ids)])
			if err != nil || !r.Allowed {
				t.Fatalf("%s: %+v, %v", spec, r, err)
			}
			binding += r.Remaining + r.LimitAt(r.NumLimits()-1).Remaining
			i++
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per decision, want 0", spec, allocs)
		}
	}
}
