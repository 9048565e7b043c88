package unleashflag

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/Unleash/unleash-client-go/v4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/internal/localserver"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// unleashAdmin drives a real Unleash server's admin API, as an operator
// would from its UI.
type unleashAdmin struct {
	t   *testing.T
	url string
}

func (a unleashAdmin) do(method, path string, body any) []byte {
	a.t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(a.t, err)
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, a.url+path, r)
	require.NoError(a.t, err)
	req.Header.Set("Authorization", localserver.UnleashAdminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(a.t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(a.t, err)
	require.Less(a.t, resp.StatusCode, 300, "%s %s: %s", method, path, out)
	return out
}

const devEnv = "/api/admin/projects/default/features/%s/environments/development"

// createToggle creates feature with one flexibleRollout strategy of
// percent, enabled in the development environment, and returns the
// strategy's ID.
func (a unleashAdmin) createToggle(feature string, percent int) string {
	a.do(http.MethodPost, "/api/admin/projects/default/features", map[string]any{"name": feature})
	out := a.do(http.MethodPost, fmt.Sprintf(devEnv+"/strategies", feature), a.strategy(feature, percent))
	var st struct{ ID string }
	require.NoError(a.t, json.Unmarshal(out, &st))
	a.do(http.MethodPost, fmt.Sprintf(devEnv+"/on", feature), nil)
	return st.ID
}

func (a unleashAdmin) strategy(feature string, percent int) map[string]any {
	return map[string]any{"name": "flexibleRollout", "parameters": map[string]any{
		"rollout": fmt.Sprint(percent), "stickiness": "default", "groupId": feature}}
}

func (a unleashAdmin) setPercent(feature, strategyID string, percent int) {
	a.do(http.MethodPut, fmt.Sprintf(devEnv+"/strategies/%s", feature, strategyID), a.strategy(feature, percent))
}

// The source on a real Unleash server: it follows the toggle an operator
// changes, fails fast on a refused token or a stopped server, reports the
// server's health through Ping, and reports usage so the toggle shows as
// used. The figures (start, propagation) are logged.
func TestRealUnleashServer(t *testing.T) {
	start := time.Now()
	u := localserver.UnleashT(t)
	t.Logf("PostgreSQL and Unleash %s started in %v", localserver.UnleashServerVersion, time.Since(start).Round(time.Millisecond))
	admin := unleashAdmin{t: t, url: u.URL()}
	const feature = "ratelimit-redis"
	strategyID := admin.createToggle(feature, 30)
	// Each source copies the token into a header map of its own client:
	// one map shared by two clients is a data race inside the client.
	auth := WithToken(localserver.UnleashClientToken)

	// A token the server refuses fails New at once, clearly.
	began := time.Now()
	_, err := New(feature, WithServer(u.APIURL(), "throttlekit-test"),
		WithToken("default:development.wrong"),
		WithWaitForFirstFetch(10*time.Second))
	assert.ErrorIs(t, err, ErrRefused)
	assert.NotContains(t, fmt.Sprint(err), "wrong")
	t.Logf("refused token: New failed after %v: %v", time.Since(began).Round(time.Millisecond), err)
	// A URL without /api fails before anything starts.
	_, err = New(feature, WithServer(u.URL(), "throttlekit-test"), auth)
	assert.ErrorIs(t, err, driver.ErrInvalidOption)

	src, err := New(feature, WithServer(u.APIURL(), "throttlekit-test"),
		auth, WithClientOptions(unleash.WithRefreshInterval(100*time.Millisecond),
			unleash.WithMetricsInterval(200*time.Millisecond), unleash.WithInstanceId("test-1")),
		WithWaitForFirstFetch(10*time.Second), WithUsageMetrics())
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close() })
	require.NotNil(t, src.Split())
	assert.Equal(t, 30, src.Split().Percent(), "in force when New returns")
	require.NoError(t, src.Ping(context.Background()))

	// A typo in the toggle's name: the kill switch, which Ping reports and
	// Status counts.
	typo, err := New(feature+"s", WithServer(u.APIURL(), "throttlekit-test"), WithToken(localserver.UnleashClientToken),
		WithWaitForFirstFetch(10*time.Second))
	require.NoError(t, err)
	typo.SetLogger(nil)
	t.Cleanup(func() { _ = typo.Close() })
	assert.True(t, typo.Split().Killed())
	assert.ErrorIs(t, typo.Ping(context.Background()), ErrToggleMissing)
	assert.True(t, typo.Status().Missing)
	assert.Positive(t, typo.Status().MissingFetches)

	// The operator moves the toggle; the source follows.
	for _, percent := range []int{60, 100, 0} {
		changed := time.Now()
		admin.setPercent(feature, strategyID, percent)
		waitPercent(t, src, percent)
		t.Logf("toggle set to %d%%: in force %v later (refresh interval 100 ms)", percent, time.Since(changed).Round(time.Millisecond))
	}
	admin.do(http.MethodPost, fmt.Sprintf(devEnv+"/off", feature), nil)
	waitFor(t, "the kill switch", func() bool { sp := src.Split(); return sp != nil && sp.Killed() })

	// Usage reaches Unleash: the toggle shows this application.
	waitFor(t, "usage metrics", func() bool {
		var m struct{ SeenApplications []string }
		_ = json.Unmarshal(admin.do(http.MethodGet, "/api/admin/client-metrics/features/"+feature, nil), &m)
		return slices.Contains(m.SeenApplications, "throttlekit-test")
	})

	// Unleash stops: Ping says so and the split stays; it returns: Ping
	// recovers.
	require.NoError(t, u.Stop())
	waitFor(t, "Ping to report the stopped server", func() bool {
		return errors.Is(src.Ping(context.Background()), ErrNotReady)
	})
	assert.True(t, src.Split().Killed(), "the last split stays in force")
	_, err = New(feature, WithServer(u.APIURL(), "throttlekit-test"), auth,
		WithWaitForFirstFetch(2*time.Second))
	assert.ErrorIs(t, err, ErrNotReady, "a stopped server fails New")
	require.NoError(t, u.Start())
	waitFor(t, "Ping to recover", func() bool { return src.Ping(context.Background()) == nil })
}
