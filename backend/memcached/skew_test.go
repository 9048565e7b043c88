package memcachedbackend

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// Two hosts whose clocks differ by 5 s and by 30 s share every window and
// GCRA state in real time: the items outlive the skew by default. See
// testkit.RealClockSkew.
func TestRealClockSkew(t *testing.T) {
	for _, skew := range []time.Duration{5 * time.Second, 30 * time.Second} {
		t.Run(fmt.Sprint(skew), func(t *testing.T) {
			t.Parallel()
			addrs, prefix := sharedAddrs(t, 1), freshPrefix()
			testkit.RealClockSkew(t, func(t *testing.T) driver.Backend {
				client, err := NewClient(time.Second, addrs...)
				require.NoError(t, err)
				t.Cleanup(func() { _ = client.Close() })
				b, err := New(client, WithPrefix(prefix))
				require.NoError(t, err)
				return b
			}, skew)
		})
	}
}
