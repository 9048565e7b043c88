package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/throttler"
)

// TestPlanRollingDeploy: the leg's policy is the one limit the
// hand-written limiter counts, at a window of at most 5 s and the same
// rate, and the leg runs only where there is a memcached.
func TestPlanRollingDeploy(t *testing.T) {
	for _, tc := range []struct {
		policy, want, says string
	}{
		{"30/10s, 600/h", "core: 15/5s", "policy 15/5s, the hand-written limiter's own limit (the demo policy's 30/10s at 5s windows)"},
		{"6/2s, 600/h", "core: 6/2s", "policy 6/2s, the hand-written limiter's own limit"},
		{"600/h, 1/20s", "core: 1/5s", "policy 1/5s, the hand-written limiter's own limit (the demo policy's 1/20s at 5s windows)"},
	} {
		p, err := throttler.ParsePolicy(resourceName, tc.policy)
		require.NoError(t, err)
		plan, err := planRollingDeploy(demoConfig(false), p)
		require.NoError(t, err)
		require.Empty(t, plan.skipped)
		assert.Equal(t, tc.want, plan.policy.String(), tc.policy)
		assert.Equal(t, tc.says, plan.describePolicy(), tc.policy)
		assert.Equal(t, 3*plan.policy.Limits()[0].Window, plan.overlap, "three windows roll over during the overlap")
	}

	p, err := throttler.ParsePolicy(resourceName, "30/10s")
	require.NoError(t, err)
	cfg := demoConfig(true)
	cfg.Embedded = true
	plan, err := planRollingDeploy(cfg, p)
	require.NoError(t, err)
	assert.Equal(t, "-embedded: the hand-written limiter needs memcached", plan.skipped)
	cfg = demoConfig(true)
	cfg.RollingDeploy = false
	plan, err = planRollingDeploy(cfg, p)
	require.NoError(t, err)
	assert.Equal(t, "-rolling-deploy=false", plan.skipped)
}

// named is a process that names itself in a response header.
func named(name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Header().Set("X-Process", name) })
}

// servedBy returns which process of dep served each of n requests.
func servedBy(dep *deployment, n int) []string {
	var out []string
	for range n {
		rec := httptest.NewRecorder()
		dep.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		out = append(out, rec.Header().Get("X-Process"))
	}
	return out
}

// TestDeployments: the round-robin sends requests to each process in
// turn; deployAtOnce replaces them all between two requests; a rolling
// deploy replaces them one at a time, each spread after the one before,
// and stops when its context ends.
func TestDeployments(t *testing.T) {
	dep := newDeployment(3, named("old"))
	assert.Equal(t, []string{"old", "old", "old"}, servedBy(dep, 3))
	dep.replace(1, named("new"))
	assert.Equal(t, []string{"old", "new", "old", "old", "new", "old"}, servedBy(dep, 6))

	require.NoError(t, deployAtOnce(context.Background(), dep, func(int) http.Handler { return named("at once") }))
	assert.Equal(t, []string{"at once", "at once", "at once"}, servedBy(dep, 3))

	// Each replacement is seen between the deploy's steps: after the
	// first, one process of three is new.
	dep = newDeployment(3, named("old"))
	spread := 50 * time.Millisecond
	began := time.Now()
	var mixes [][]string
	require.NoError(t, rollingDeploy(spread)(context.Background(), dep, func(i int) http.Handler {
		if i > 0 {
			mixes = append(mixes, servedBy(dep, 3))
		}
		return named("new")
	}))
	assert.GreaterOrEqual(t, time.Since(began), 2*spread, "the last process is replaced (processes-1) spreads after the first")
	require.Len(t, mixes, 2)
	assert.ElementsMatch(t, []string{"new", "old", "old"}, mixes[0])
	assert.ElementsMatch(t, []string{"new", "new", "old"}, mixes[1])
	assert.Equal(t, []string{"new", "new", "new"}, servedBy(dep, 3))

	dep = newDeployment(3, named("old"))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := rollingDeploy(time.Hour)(ctx, dep, func(int) http.Handler { return named("new") })
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, []string{"old", "old", "old"}, servedBy(dep, 3), "a deploy whose context has ended replaces nothing")
}

// TestJudgeDeploy: the rolling deploy passes only when no phase shows a
// ResetAt change, a double grant or a contradicting result, old and new
// processes served together while windows rolled over, windows moved to
// Redis at 100 %, and Redis alone decided the last phase.
func TestJudgeDeploy(t *testing.T) {
	p, err := throttler.ParsePolicy(resourceName, "30/10s")
	require.NoError(t, err)
	plan, err := planRollingDeploy(demoConfig(false), p)
	require.NoError(t, err)
	phase := func(i int) phaseResult {
		r := phaseResult{index: i, count: deployPhases, name: deployPhaseNames[i]}
		r.totals.sides[0] = sideCounts{requests: 100, allowed: 80, denied: 20}
		r.totals.decisions = map[string]int64{legacyStore: 100}
		switch i {
		case deployOverlap:
			r.totals.sides[0].rolled = 120
			r.totals.decisions = map[string]int64{legacyStore: 40, deployingStore: 60}
		case deployMirror100:
			r.totals.sides[1] = sideCounts{requests: 100, allowed: 80, denied: 20, moved: 200, checked: 70}
			r.totals.decisions = map[string]int64{deployingStore: 10, "redis/a": 50, "redis/b": 40}
		case deployRedisAlone:
			r.totals.sides[0] = sideCounts{}
			r.totals.sides[1] = sideCounts{requests: 100, allowed: 80, denied: 20}
			r.totals.decisions = map[string]int64{"redis/a": 50, "redis/b": 50}
		}
		return r
	}
	var good []phaseResult
	for i := range deployPhases {
		good = append(good, phase(i))
	}
	run := deployRun{plan: plan, clients: 200, overlap: 15020 * time.Millisecond}
	v := judgeDeploy(good, run, false)
	require.True(t, v.Pass, v.Failures)
	assert.Equal(t, "rolling deploy: PASS · policy 15/5s, the hand-written limiter's own limit (the demo policy's 30/10s at 5s windows) · "+
		"3 processes, old and new together for 15.0 s, 120 windows rolled over meanwhile · 500 responses from 200 clients, "+
		"200 moves (70 checked in an open window), 0 ResetAt changes, 0 double grants, 0 contradicting", v.Line)
	assert.Equal(t, v.Line, legLine(legRecord{key: deployLegKey, verdict: v}), "the summary's line says the policy")

	bad := append([]phaseResult(nil), good[:3]...)
	bad[1].totals.sides[0].resetChanges, bad[1].totals.sides[0].doubleGrants = 5, 2
	bad[1].totals.sides[0].contradictions, bad[1].totals.sides[0].rolled = 1, 0
	bad[1].totals.decisions = map[string]int64{legacyStore: 100}
	bad[2].totals.sides[1].checked = 0
	run.secondaryErrors, run.unmatched, run.deployErr = 3, 7, errors.New("interrupted")
	v = judgeDeploy(bad, run, true)
	assert.False(t, v.Pass)
	assert.Equal(t, []string{
		"no ResetAt change (phase 2 overlap: 5)",
		"no double grant (phase 2 overlap: 2)",
		"no result contradicting the store (phase 2 overlap: 1)",
		"old and new processes served together (phase 2 overlap: 100 responses from old processes, 0 from new)",
		"windows rolled over during the overlap (phase 2 overlap: none)",
		"windows carried to Redis (phase 3 100% mirror: 200 moves, 0 checked in an open window)",
		"no mirror write lost (3)",
		"the legacy backend matched the policy (7 calls unmatched)",
		"the deploy ran (interrupted)",
		"complete run (3 of 4 phases)",
	}, v.Failures)

	last := append([]phaseResult(nil), good...)
	last[3].totals.decisions[deployingStore] = 4
	v = judgeDeploy(last, deployRun{plan: plan}, false)
	assert.Equal(t, []string{"Redis alone at the end (phase 4 Redis alone: 4 responses from legacy/deciding)"}, v.Failures)
}
