package redisbackend_test

import (
	"fmt"
	"testing"
	"time"

	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// Two hosts whose clocks differ by 5 s and by 30 s share every window and
// GCRA state in real time: the keys outlive the skew by default (the
// expiry grace). See testkit.RealClockSkew.
func TestRealClockSkew(t *testing.T) {
	for _, skew := range []time.Duration{5 * time.Second, 30 * time.Second} {
		t.Run(fmt.Sprint(skew), func(t *testing.T) {
			t.Parallel()
			addr, prefix := standalone(t).primary.Addr(), newPrefix()
			testkit.RealClockSkew(t, func(t *testing.T) driver.Backend {
				return mustBackend(t, newClient(t, addr), redisbackend.WithPrefix(prefix))
			}, skew)
		})
	}
	// The scenario does catch a loss: with a grace shorter than the skew,
	// the keys expire before the host behind reaches them.
	t.Run("5s with a 1s grace loses state", func(t *testing.T) {
		t.Parallel()
		addr, prefix := standalone(t).primary.Addr(), newPrefix()
		lost := testkit.SkewLosses(t, func(t *testing.T) driver.Backend {
			return mustBackend(t, newClient(t, addr), redisbackend.WithPrefix(prefix), redisbackend.WithExpiryGrace(time.Second))
		}, 5*time.Second)
		if len(lost) == 0 {
			t.Error("a 1 s grace under 5 s of skew lost nothing: the scenario would not notice a loss")
		}
	})
}
