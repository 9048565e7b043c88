package rollout

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// storeWithLayout2 is a store whose own layout changed after key layout 1,
// as the Redis backend's did: its layout-1 state lives in another place,
// which Layout2 names.
type storeWithLayout2 struct {
	*memorybackend.Backend
	earlier driver.Backend
}

func (s storeWithLayout2) Layout2() driver.Backend { return s.earlier }

// TestUpgradeKeysReadsTheEarlierLayoutWhereTheStoreKeepsIt: UpgradeKeys
// over a store with a Layout2 view reads the layout-1 windows there, not
// in the store under layout-1 keys (where a Redis store of layout 3 never
// held them), so the window carries on.
func TestUpgradeKeysReadsTheEarlierLayoutWhereTheStoreKeepsIt(t *testing.T) {
	clock := throttlertest.NewManualClock(t0)
	policy := mustPolicy(t, "api", "5/min")
	earlier := memorybackend.New()
	old := testkit.Throttler(t, KeyLayoutV1(earlier), throttler.WithClock(clock))
	ctx := context.Background()
	for range 3 {
		r, err := old.Allow(ctx, policy, "u")
		require.NoError(t, err)
		require.True(t, r.Allowed)
	}
	first, err := old.Peek(ctx, policy, "u")
	require.NoError(t, err)

	rb, err := UpgradeKeys(storeWithLayout2{Backend: memorybackend.New(), earlier: earlier})
	require.NoError(t, err)
	th := testkit.Throttler(t, rb, throttler.WithClock(clock))
	clock.Advance(10 * time.Second)
	r, err := th.Allow(ctx, policy, "u")
	require.NoError(t, err)
	assert.True(t, r.Allowed)
	assert.EqualValues(t, 4, r.Used, "the three units of layout 1, and this one")
	assert.Equal(t, first.ResetAt, r.ResetAt)
}
