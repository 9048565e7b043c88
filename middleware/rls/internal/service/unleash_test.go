package service

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/internal/localserver"
)

// unleashAdmin sets a toggle on a real Unleash server through its admin
// API, as an operator does from its UI.
func unleashAdmin(t *testing.T, base, method, path string, body any) []byte {
	t.Helper()
	var r io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		require.NoError(t, err)
		r = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, base+path, r)
	require.NoError(t, err)
	req.Header.Set("Authorization", localserver.UnleashAdminToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Less(t, resp.StatusCode, 300, "%s %s: %s", method, path, out)
	return out
}

// TestRolloutByUnleashToggle: the service's store follows an Unleash
// toggle an operator moves from 0 to 100 %, and every client keeps its
// count across the move (split mode carries each window to the new store).
func TestRolloutByUnleashToggle(t *testing.T) {
	localserver.SkipIfShort(t)
	u := localserver.UnleashT(t)
	const feature = "rls-store"
	env := "/api/admin/projects/default/features/" + feature + "/environments/development"
	strategy := func(percent int) map[string]any {
		return map[string]any{"name": "flexibleRollout", "parameters": map[string]any{
			"rollout": strconv.Itoa(percent), "stickiness": "default", "groupId": feature}}
	}
	unleashAdmin(t, u.URL(), http.MethodPost, "/api/admin/projects/default/features", map[string]any{"name": feature})
	var st struct{ ID string }
	require.NoError(t, json.Unmarshal(unleashAdmin(t, u.URL(), http.MethodPost, env+"/strategies", strategy(0)), &st))
	unleashAdmin(t, u.URL(), http.MethodPost, env+"/on", nil)

	redisOld := localserver.RedisT(t, localserver.RedisOptions{})
	redisNew := localserver.RedisT(t, localserver.RedisOptions{})
	s := start(t, Settings{Rollout: &RolloutYAML{
		Old: "redis://" + redisOld.Addr(), New: "redis://" + redisNew.Addr(),
		Unleash: &UnleashYAML{URL: u.APIURL(), Token: localserver.UnleashClientToken, Toggle: feature,
			Wait: 20 * time.Second, Refresh: 100 * time.Millisecond},
	}})
	c := rlsClient(t, s.addrs.GRPC)
	newStore := redis.NewClient(&redis.Options{Addr: redisNew.Addr()})
	defer newStore.Close()
	// 20 clients, 2 a minute each: one hit now, one after the move.
	for i := range 20 {
		resp, err := c.ShouldRateLimit(context.Background(), request(fmt.Sprint("u", i)))
		require.NoError(t, err)
		require.Equal(t, uint32(1), resp.Statuses[0].LimitRemaining)
	}
	unleashAdmin(t, u.URL(), http.MethodPut, env+"/strategies/"+st.ID, strategy(100))
	// Once the toggle is in force, the new store holds what the old one
	// counted: look for a client's key there.
	require.Eventually(t, func() bool {
		if _, err := c.ShouldRateLimit(context.Background(), request("probe")); err != nil {
			return false
		}
		n, err := newStore.DBSize(context.Background()).Result()
		return err == nil && n > 0
	}, 20*time.Second, 50*time.Millisecond)
	for i := range 20 {
		resp, err := c.ShouldRateLimit(context.Background(), request(fmt.Sprint("u", i)))
		require.NoError(t, err)
		assert.Equal(t, uint32(0), resp.Statuses[0].LimitRemaining, "client %d kept its count across the move", i)
	}
}
