package unleashflag

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/Unleash/unleash-client-go/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/internal/localserver"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

func TestWithStaleAfterIsChecked(t *testing.T) {
	_, err := New("f", WithServer("http://127.0.0.1:1/api/", "a"), WithStaleAfter(-time.Second))
	assert.ErrorIs(t, err, driver.ErrInvalidOption)
}

// A real Unleash server hung with SIGSTOP, ten times: Ping reports it once
// the server has been silent for longer than the stale bound (three
// refresh intervals of 100 ms), while the fetch in flight is still waiting
// for its answer (its HTTP timeout is 10 s); after SIGCONT Ping is nil
// again and a change of the toggle is followed. The figures are logged.
func TestRealUnleashServerHung(t *testing.T) {
	u := localserver.UnleashT(t)
	admin := unleashAdmin{t: t, url: u.URL()}
	const feature = "ratelimit-hang"
	strategyID := admin.createToggle(feature, 10)
	src, err := New(feature, WithServer(u.APIURL(), "throttlekit-test"), WithToken(localserver.UnleashClientToken),
		WithClientOptions(unleash.WithRefreshInterval(100*time.Millisecond)),
		WithWaitForFirstFetch(10*time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close() })
	waitFor(t, "the refresh interval to be seen", func() bool { return src.StaleBound() < time.Second })
	bound := src.StaleBound()
	t.Logf("stale bound %v", bound)

	ctx := context.Background()
	var reported, resumed []time.Duration
	for loop := range 10 {
		require.NoError(t, src.Ping(ctx))
		require.NoError(t, u.Pause())
		paused := time.Now()
		t.Cleanup(func() { _ = u.Resume() })
		var pingErr error
		waitFor(t, "Ping to report the hung server", func() bool {
			pingErr = src.Ping(ctx)
			return pingErr != nil
		})
		reported = append(reported, time.Since(paused))
		require.ErrorIs(t, pingErr, ErrNotReady)
		assert.NoError(t, src.fetchError(), "reported before the fetch in flight failed")

		require.NoError(t, u.Resume())
		back := time.Now()
		waitFor(t, "Ping to recover", func() bool { return src.Ping(ctx) == nil })
		percent := 20 + loop
		admin.setPercent(feature, strategyID, percent)
		waitPercent(t, src, percent)
		resumed = append(resumed, time.Since(back))
	}
	slices.Sort(reported)
	slices.Sort(resumed)
	t.Logf("hung server reported by Ping after min %v / median %v / max %v (bound %v, the in-flight fetch still waiting)",
		reported[0].Round(time.Millisecond), reported[len(reported)/2].Round(time.Millisecond), reported[len(reported)-1].Round(time.Millisecond), bound)
	t.Logf("after SIGCONT, Ping nil and a toggle change in force after min %v / median %v / max %v",
		resumed[0].Round(time.Millisecond), resumed[len(resumed)/2].Round(time.Millisecond), resumed[len(resumed)-1].Round(time.Millisecond))
}
