package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	legacybackend "github.com/throttlekit/throttlekit/backend/legacy"
	memcachedbackend "github.com/throttlekit/throttlekit/backend/memcached"
	"github.com/throttlekit/throttlekit/internal/handwritten"
	"github.com/throttlekit/throttlekit/internal/headless"
	"github.com/throttlekit/throttlekit/internal/localserver"
	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// runDemo runs the demo in-process with cfg and returns its verdict and
// output. The run is bounded by its own phases; the context is a backstop.
func runDemo(t *testing.T, cfg Config) (Verdict, string) {
	t.Helper()
	// The tests run under -race on machines that run other tests at the
	// same time: a stalled call would fail open and show as a degraded
	// response, which is about the machine, not the migration.
	cfg.CallTimeout = 2 * time.Second
	cfg.Verbose = true
	if cfg.ReportPath == "" {
		cfg.ReportPath = filepath.Join(t.TempDir(), "report.html")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	v, err := run(ctx, cfg, &out)
	require.NoError(t, err, "output:\n%s", out.String())
	if testing.Verbose() {
		t.Logf("output:\n%s", out.String())
	}
	return v, out.String()
}

// assertPassed checks a run's report: for each mode, one table per phase
// (the warm-up and the ramp), the mode's summary and its passing verdict;
// then a passing overall verdict, and the summary that ends the output.
// legs counts the legs beyond the modes (the rolling deploy, the stalled
// group), legRows their rows in the summary's table.
func assertPassed(t *testing.T, v Verdict, out string, modes []rollout.Mode, phases, legs, legRows int) {
	t.Helper()
	if !v.Pass {
		t.Errorf("verdict: %s\noutput:\n%s", v.Line, out)
		return
	}
	require.Len(t, v.Modes, len(modes)+legs)
	for i, m := range modes {
		mv := v.Modes[i]
		assert.Equal(t, m, mv.Mode)
		assert.True(t, mv.Pass, mv.Line)
		assert.Contains(t, out, "\n== "+m.String()+" mode, keys ")
		assert.Contains(t, out, "\nsummary, "+m.String()+" mode\n")
		assert.Contains(t, out, "\n"+m.String()+" mode: PASS (")
		assert.Positive(t, mv.moves, "identifiers moved")
		assert.Positive(t, mv.checked, "moves in open windows were checked")
	}
	assert.Contains(t, out, fmt.Sprintf("\nphase 1/%d: warm-up on the old store alone", phases))
	for i := 2; i <= phases; i++ {
		assert.Contains(t, out, fmt.Sprintf("\nphase %d/%d: ", i, phases))
	}
	assert.Contains(t, out, "  backend ")
	assert.Contains(t, out, "\nVERDICT: PASS (")
	assert.Empty(t, v.Failures)
	sum := readSummary(t, out)
	assert.Equal(t, v.Line, sum.verdict, "the summary begins with the verdict")
	assert.Len(t, sum.rows, 1+len(modes)*phases+legRows, "a row per phase")
	assert.FileExists(t, sum.report)
}

// requireServers skips the test when a server binary is missing, or fails
// it where localserver says missing servers must fail (CI).
func requireServers(t *testing.T) {
	t.Helper()
	for _, bin := range []string{localserver.MemcachedBinary, localserver.RedisServerBinary} {
		if _, err := localserver.LookPath(bin); err != nil {
			if localserver.RequireServers() {
				t.Fatalf("%v", err)
			}
			t.Skipf("skipping: %v (set CI or THROTTLEKIT_REQUIRE_SERVERS=1 to fail instead)", err)
		}
	}
}

// TestShortRunOnServers is `-short` on real servers: one memcached, two
// Redis primaries with a replica each, half the clients first on the
// hand-written limiter, the warm-up and the ramp up and back down in mirror
// and then split mode; then the rolling deploy from the hand-written
// limiter, and the stalled group. Every invariant must hold in each.
func TestShortRunOnServers(t *testing.T) {
	localserver.SkipIfShort(t)
	requireServers(t)
	cfg := demoConfig(true)
	v, out := runDemo(t, cfg)
	assertPassed(t, v, out, cfg.Modes, 1+len(cfg.Ramp), 2, deployPhases+1)
	assert.Contains(t, out, "old memcached")
	assert.Contains(t, out, "\n    legacy ", "the warm-up shows the hand-written limiter's clients")
	assert.Contains(t, out, "redis/a")
	assert.Contains(t, out, "redis/b")
	assert.Regexp(t, `legacy windows carried over\)`, v.Modes[0].Line)
	// The report shows what the summary says, in a real browser when
	// there is one (the run is too long to repeat for the browser alone).
	if _, err := headless.LookPath(); err == nil || localserver.RequireServers() {
		assertReportShows(t, headless.RequireT(t), readSummary(t, out), "migrate-demo-report-servers.png")
	}
	deploy := v.Modes[2]
	assert.Equal(t, deployLegName, deploy.Leg)
	assert.Regexp(t, `^rolling deploy: PASS · policy 6/2s, the hand-written limiter's own limit · 3 processes, `+
		`old and new together for 6\.\d s, [1-9][\d,]* windows rolled over meanwhile · [\d,]+ responses from 200 clients, `+
		`[1-9][\d,]* moves \([1-9][\d,]* checked in an open window\), 0 ResetAt changes, 0 double grants, 0 contradicting$`, deploy.Line)
	for _, phase := range []string{"1 old only", "2 overlap", "3 100% mirror", "4 Redis alone"} {
		assert.Regexp(t, `\n  deploy +`+regexp.QuoteMeta(phase)+`  `, out, "the summary's row of the rolling deploy's phase")
	}
	assert.Contains(t, out, "\n    legacy/deciding ", "new processes decided in the legacy keys during the overlap")
	stall := v.Modes[3]
	assert.Equal(t, stallLegName, stall.Leg)
	assert.Regexp(t, `^stalled Redis group: PASS \(\d+ bursts of 250ms, .* [1-9][\d,]* degraded and marked; `+
		`0 results contradicting the store`, stall.Line)
}

// TestShortRunEmbedded is `-short -embedded`: the same on a memory backend
// and a sharded backend over two memory shards, without the hand-written
// limiter.
func TestShortRunEmbedded(t *testing.T) {
	cfg := demoConfig(true)
	cfg.Embedded = true
	v, out := runDemo(t, cfg)
	assertPassed(t, v, out, cfg.Modes, 1+len(cfg.Ramp), 0, 0)
	assert.Contains(t, out, "rolling deploy: not run (-embedded: the hand-written limiter needs memcached)")
	assert.Contains(t, out, "stalled Redis group: not run (-embedded: no server to stop)")
	assert.Contains(t, out, "memory/a")
	assert.Contains(t, out, "memory/b")
	assert.NotContains(t, out, "\n    legacy ")
}

// TestSplitWithoutSeedingIsCaught shows that the clients' checks have
// teeth: in split mode without seeding an identifier that moves starts
// afresh on the new store, and the verdict must say so.
func TestSplitWithoutSeedingIsCaught(t *testing.T) {
	cfg := demoConfig(true)
	cfg.Embedded, cfg.Modes, cfg.Seeding, cfg.Ramp, cfg.Identifiers, cfg.Progress =
		true, []rollout.Mode{rollout.SplitMode}, false, []int{0, 100}, 60, 0
	v, out := runDemo(t, cfg)
	require.False(t, v.Pass, "split mode without seeding passed:\n%s", out)
	require.NotEmpty(t, v.Failures)
	// Each move that lands in an open window shows a new Reset, or the
	// same one with a lower Used; which of the two comes first depends on
	// timing.
	caught := false
	for _, f := range v.Failures {
		caught = caught || strings.HasPrefix(f, "split mode: no ResetAt change (phase 3: ") ||
			strings.HasPrefix(f, "split mode: no double grant (phase 3: ")
	}
	assert.True(t, caught, "failures: %q", v.Failures)
	assert.Contains(t, out, "\nsplit mode: FAIL: no ")
	assert.Contains(t, out, "\nVERDICT: FAIL: split mode: no ")
}

// TestMissingServersSaysWhatToDo points the binary lookups at nothing: the
// run must not start, and the error must name the binaries and the ways
// out.
func TestMissingServersSaysWhatToDo(t *testing.T) {
	t.Setenv("MEMCACHED", "/nonexistent/memcached")
	t.Setenv("REDIS_SERVER", "/nonexistent/redis-server")
	var out bytes.Buffer
	_, err := run(context.Background(), demoConfig(true), &out)
	var missing *MissingServersError
	require.ErrorAs(t, err, &missing)
	assert.Len(t, missing.Missing, 2)
	for _, want := range []string{"memcached", "redis-server", "make demo", "make demo-embedded", "-embedded"} {
		assert.Contains(t, err.Error(), want)
	}
}

// TestUnleashSetsThePercentage runs one phase with the percentage from an
// Unleash toggle. No Unleash server can run here, so a handler answers the
// client API (/api/client/features) as the server does; it checks the
// client token too.
func TestUnleashSetsThePercentage(t *testing.T) {
	var fetches atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path != "/api/client/features":
			w.WriteHeader(http.StatusAccepted) // registration, metrics
		case r.Header.Get("Authorization") != "secret-token":
			w.WriteHeader(http.StatusUnauthorized)
		default:
			fetches.Add(1)
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"version":2,"features":[{"name":%q,"enabled":true,"strategies":[`+
				`{"name":"flexibleRollout","parameters":{"rollout":"50","stickiness":"default","groupId":%q}}]}]}`,
				defaultFeature, defaultFeature)
		}
	}))
	defer srv.Close()

	// The toggle says 50% from the deploy on: split mode, which seeds each
	// identifier's store at its first decision, keeps the warm-up's
	// windows (mirror mode needs the ramp to begin at 0%).
	cfg := demoConfig(true)
	cfg.Embedded, cfg.Ramp, cfg.Modes, cfg.Progress = true, []int{0}, []rollout.Mode{rollout.SplitMode}, 0
	cfg.UnleashURL, cfg.UnleashToken = srv.URL+"/api", "secret-token"
	v, out := runDemo(t, cfg)
	assertPassed(t, v, out, cfg.Modes, 2, 0, 0)
	assert.Contains(t, out, "phase 2/2: Unleash says 50% on new")
	assert.Positive(t, fetches.Load())
}

func TestParseConfig(t *testing.T) {
	noEnv := func(string) string { return "" }
	var usage bytes.Buffer

	c, err := parseConfig(nil, noEnv, &usage)
	require.NoError(t, err)
	full := demoConfig(false)
	assert.Equal(t, full, c)
	assert.Equal(t, []rollout.Mode{rollout.MirrorMode, rollout.SplitMode}, c.Modes, "both modes by default")

	c, err = parseConfig([]string{"-short", "-embedded"}, noEnv, &usage)
	require.NoError(t, err)
	short := demoConfig(true)
	short.Embedded = true
	assert.Equal(t, short, c)

	env := map[string]string{envMemcached: "10.0.0.1:11211", envRedisShards: "a=redis://10.0.0.2:6379"}
	c, err = parseConfig([]string{"-short", "-duration", "4s", "-policy", "5/s", "-ramp", "0, 25%,100", "-mode", "shadow",
		"-memcached", "10.0.0.9:11211", "-warmup", "3s", "-legacy", "0.25", "-seeding=false"},
		func(k string) string { return env[k] }, &usage)
	require.NoError(t, err)
	assert.Equal(t, 4*time.Second, c.PhaseDuration)
	assert.Equal(t, 3*time.Second, c.WarmUp)
	assert.Equal(t, "5/s", c.Policy)
	assert.Equal(t, []int{0, 25, 100}, c.Ramp)
	assert.Equal(t, []rollout.Mode{rollout.ShadowMode}, c.Modes)
	assert.False(t, c.Seeding)
	assert.Equal(t, 0.25, c.LegacyShare)
	assert.Equal(t, "10.0.0.9:11211", c.MemcachedAddr, "a flag wins over the environment")
	assert.Equal(t, "a=redis://10.0.0.2:6379", c.RedisShards)
	assert.Equal(t, 1.5, c.NormalRate, "-short's default")

	c, err = parseConfig([]string{"-mode", "split, mirror"}, noEnv, &usage)
	require.NoError(t, err)
	assert.Equal(t, []rollout.Mode{rollout.SplitMode, rollout.MirrorMode}, c.Modes)

	for _, args := range [][]string{
		{"-ramp", "0,101"}, {"-ramp", ""}, {"-mode", "sideways"}, {"-mode", "split,split"}, {"-mode", ""},
		{"-identifiers", "0"}, {"-abusive", "1.5"}, {"-legacy", "-0.1"}, {"-warmup", "-1s"},
		{"-policy", "lots"}, {"-policy", "6/2s gcra, 600/h"}, {"-policy", "6/2s sliding"}, {"-duration", "-1s"},
		{"-embedded", "-memcached", "x:1"}, {"extra"},
	} {
		_, err := parseConfig(args, noEnv, &usage)
		assert.ErrorIs(t, err, errUsage, "%q", args)
	}
}

func TestWarmUpLastsAWindow(t *testing.T) {
	for _, tc := range []struct {
		policy string
		warmUp time.Duration
		want   time.Duration
	}{
		{"30/10s, 600/h", 0, 10 * time.Second},
		{"600/h, 6/2s", 0, 2 * time.Second},
		{"30/10s", 3 * time.Second, 3 * time.Second},
	} {
		p, err := throttler.ParsePolicy("core", tc.policy)
		require.NoError(t, err)
		assert.Equal(t, tc.want, Config{WarmUp: tc.warmUp}.warmUp(p), tc.policy)
	}
}

func TestJudge(t *testing.T) {
	// A window ending at 100.400 s shows Reset 101: certainly open before
	// 100 s, perhaps closed after.
	at := func(ms int64) time.Time { return time.UnixMilli(ms) }
	obs := func(store string, recvMs, reset, used int64) observation {
		side := rollout.SideOld
		if strings.HasPrefix(store, "redis") {
			side = rollout.SideNew
		}
		return observation{status: http.StatusOK, received: at(recvMs), side: side, store: store, member: "core:30/10s",
			limit: 30, reset: reset, used: used, remaining: 30 - used}
	}
	prev := obs("memcached", 95_000, 101, 5)
	win := &windowSeen{reset: 101, used: 5, allowed: 5}
	full := &windowSeen{reset: 101, used: 30, allowed: 30}
	denied := func(o observation, remaining, r int64) observation {
		o.status, o.remaining, o.r = http.StatusTooManyRequests, remaining, r
		return o
	}
	member := func(o observation, m string) observation { o.member = m; return o }
	degraded := func(o observation) observation { o.degraded = true; return o }
	legacyPrev := obs(legacyStore, 95_000, 101, 5)

	for _, tc := range []struct {
		name string
		prev *observation
		win  *windowSeen
		cur  observation
		want judgement
	}{
		{"first response", nil, nil, obs("memcached", 95_000, 101, 1), judgement{}},
		{"same window", &prev, win, obs("memcached", 99_999, 101, 6), judgement{}},
		{"reset changed within the window", &prev, win, obs("memcached", 99_000, 102, 6), judgement{resetChange: true}},
		{"new window in the last second", &prev, win, obs("memcached", 100_500, 111, 1), judgement{}},
		{"reset going back", &prev, win, obs("memcached", 100_500, 100, 6), judgement{resetChange: true}},
		{"move keeps the window", &prev, win, obs("redis/a", 96_000, 101, 6), judgement{moved: true, checked: true}},
		{"move restarts the window", &prev, win, obs("redis/b", 96_000, 106, 1),
			judgement{moved: true, checked: true, resetChange: true}},
		{"move loses the count", &prev, win, obs("redis/a", 96_000, 101, 2),
			judgement{moved: true, checked: true, doubleGrant: true}},
		{"move after the window may have closed", &prev, win, obs("redis/a", 100_100, 111, 1), judgement{moved: true}},
		{"shards are one store", ptr(obs("redis/a", 95_000, 101, 5)), win, obs("redis/b", 96_000, 101, 6), judgement{}},
		{"the deploy is a move", &legacyPrev, win, obs("memcached", 96_000, 101, 6), judgement{moved: true, checked: true}},
		{"the deploy restarts the window", &legacyPrev, win, obs("memcached", 96_000, 102, 1),
			judgement{moved: true, checked: true, resetChange: true}},
		{"allowed without spending", &prev, win, obs("memcached", 96_000, 101, 5), judgement{doubleGrant: true}},
		{"allowed beyond the limit", &prev, &windowSeen{reset: 101, used: 29, allowed: 30}, obs("memcached", 96_000, 101, 30),
			judgement{doubleGrant: true}},
		{"Used above the limit", &prev, win, obs("memcached", 96_000, 101, 31), judgement{doubleGrant: true}},
		{"binding limit changed", &prev, nil, member(obs("memcached", 96_000, 3600, 9), "core:600/h"), judgement{}},
		{"honest denial", &prev, full, denied(obs("memcached", 96_000, 101, 30), 0, 0), judgement{}},
		{"denial giving units back", &prev, full, denied(obs("memcached", 96_000, 101, 28), 0, 0),
			judgement{doubleGrant: true}},
		{"denial claiming remaining", &prev, full, denied(obs("memcached", 96_000, 101, 30), 3, 0),
			judgement{quotaClaim: true}},
		{"denial claiming r", nil, nil, denied(obs("memcached", 96_000, 101, 30), 0, 1), judgement{quotaClaim: true}},
		{"degraded is not compared", &prev, win, degraded(obs("redis/a", 96_000, 0, 0)), judgement{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, judge(tc.prev, tc.win, tc.cur))
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestTrail is a timeline of one client's responses of one limit, whose
// window shows Reset 101 (certainly open until 100 s): the results that
// contradict the store are those between two responses of one window that
// show another window, or a Used outside theirs.
func TestTrail(t *testing.T) {
	type step struct {
		recvMs, reset, used int64
		// want lists the used figures of the responses this one shows to
		// contradict the store.
		want []int64
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"one window, Used rising", []step{{95_000, 101, 1, nil}, {96_000, 101, 2, nil}, {97_000, 101, 3, nil}}},
		{"a made-up window between two of the real one", []step{
			{95_000, 101, 5, nil}, {96_000, 106, 1, nil}, {96_500, 101, 6, []int64{1}}}},
		{"two made-up windows in a row", []step{
			{95_000, 101, 5, nil}, {96_000, 106, 1, nil}, {96_100, 107, 1, nil}, {96_500, 101, 7, []int64{1, 1}}}},
		{"Used going down within the window", []step{{95_000, 101, 5, nil}, {96_000, 101, 2, []int64{2}}, {97_000, 101, 6, nil}}},
		{"a suspect of the same window with Used above the next", []step{
			{95_000, 101, 5, nil}, {96_000, 101, 9, nil}, {97_000, 101, 7, []int64{7}}}},
		{"the next window, once the last may have ended", []step{{95_000, 101, 5, nil}, {100_200, 111, 1, nil},
			{101_000, 111, 2, nil}}},
		{"a new window that never shows the old one again", []step{{95_000, 101, 5, nil}, {96_000, 106, 1, nil},
			{100_500, 111, 1, nil}, {101_000, 111, 2, nil}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tr trail
			for i, s := range tc.steps {
				got := tr.next(observation{status: http.StatusOK, received: time.UnixMilli(s.recvMs), reset: s.reset,
					used: s.used, member: "core:30/10s"})
				var used []int64
				for _, o := range got {
					used = append(used, o.used)
				}
				assert.Equal(t, s.want, used, "step %d", i)
			}
		})
	}
}

func TestJudgeStall(t *testing.T) {
	good := phaseResult{stalls: 14, stalled: 3500 * time.Millisecond, target: 100}
	good.totals.sides[1] = sideCounts{requests: 1000, allowed: 800, denied: 200, degraded: 90}
	v := judgeStall(good, nil, 400)
	assert.True(t, v.Pass, v.Line)
	assert.Equal(t, "stalled Redis group: PASS (14 bursts of 250ms, 3.5 s stopped: 1,000 responses from 400 clients, "+
		"90 degraded and marked; 0 results contradicting the store, 0 ResetAt changes, 0 double grants, "+
		"0 denials claiming quota, 0 failed)", v.Line)

	bad := good
	bad.totals.sides[1].contradictions, bad.totals.sides[1].resetChanges, bad.totals.sides[1].doubleGrants = 6, 12, 4
	bad.totals.sides[1].degraded, bad.totals.errors = 0, 2
	v = judgeStall(bad, errors.New("redis-server on 127.0.0.1:1 is not running"), 400)
	assert.False(t, v.Pass)
	assert.Equal(t, []string{
		"no ResetAt change (12)", "no double grant (4)", "no result contradicting the store (6)",
		"no failed requests (2)", "the stall reached the clients (14 bursts, 0 degraded responses)",
		"the group stopped and resumed (redis-server on 127.0.0.1:1 is not running)",
	}, v.Failures)
}

func TestWindowSeen(t *testing.T) {
	var w windowSeen
	ok := func(reset, used int64) observation {
		return observation{status: http.StatusOK, reset: reset, used: used}
	}
	w.add(ok(101, 1))
	w.add(ok(101, 2))
	w.add(observation{status: http.StatusTooManyRequests, reset: 101, used: 2})
	assert.Equal(t, windowSeen{reset: 101, used: 2, allowed: 2}, w)
	w.add(ok(111, 1))
	assert.Equal(t, windowSeen{reset: 111, used: 1, allowed: 1}, w, "a new window starts over")
}

func TestReadObservation(t *testing.T) {
	now := time.Unix(1_000, 0)
	h := http.Header{}
	h.Set(headerSide, "new")
	h.Set(headerStore, "redis/b")
	h.Set("X-RateLimit-Limit", "30")
	h.Set("X-RateLimit-Reset", "1007")
	h.Set("X-RateLimit-Used", "30")
	h.Set("X-RateLimit-Remaining", "0")
	h.Set("RateLimit", `"core:30/10s";r=0;t=7`)
	h.Set(headerResultRemaining, "0")
	h.Set(headerResultUsed, "29") // a cost-2 denial with one unit left, say
	o, err := readObservation(http.StatusTooManyRequests, h, now)
	require.NoError(t, err)
	assert.Equal(t, observation{status: 429, received: now, side: rollout.SideNew, store: "redis/b",
		member: "core:30/10s", limit: 30, reset: 1007, used: 29}, o, "a denial's Used is the throttler's own")

	// A denial whose store still held quota is seen through the result
	// headers, although the standard headers are forced to 0.
	h.Set(headerResultRemaining, "5")
	o, err = readObservation(http.StatusTooManyRequests, h, now)
	require.NoError(t, err)
	assert.True(t, judge(nil, nil, o).quotaClaim)
	for _, missing := range []string{headerResultRemaining, headerResultUsed} {
		bad := h.Clone()
		bad.Del(missing)
		_, err := readObservation(http.StatusTooManyRequests, bad, now)
		assert.ErrorIs(t, err, errBadResponse, "a denial without %s", missing)
	}
	h.Set(headerResultRemaining, "0")

	d := http.Header{}
	d.Set(headerSide, "old")
	d.Set("X-RateLimit-Degraded", "1")
	o, err = readObservation(http.StatusOK, d, now)
	require.NoError(t, err)
	assert.True(t, o.degraded)

	for name, mutate := range map[string]func(http.Header){
		"no side":       func(h http.Header) { h.Del(headerSide) },
		"no limit":      func(h http.Header) { h.Del("X-RateLimit-Limit") },
		"no reset":      func(h http.Header) { h.Del("X-RateLimit-Reset") },
		"bad used":      func(h http.Header) { h.Set("X-RateLimit-Used", "many") },
		"bad RateLimit": func(h http.Header) { h.Set("RateLimit", `core;r=0`) },
		"no r":          func(h http.Header) { h.Set("RateLimit", `"core";t=1`) },
	} {
		bad := h.Clone()
		mutate(bad)
		_, err := readObservation(http.StatusOK, bad, now)
		assert.ErrorIs(t, err, errBadResponse, name)
	}
	_, err = readObservation(http.StatusServiceUnavailable, h, now)
	assert.ErrorIs(t, err, errBadResponse)
}

func TestParseRateLimit(t *testing.T) {
	for _, tc := range []struct {
		in     string
		member string
		r      int64
		ok     bool
	}{
		{`"core:30/10s";r=12;t=3`, "core:30/10s", 12, true},
		{` "a\"b";t=1;r=0 `, `a"b`, 0, true},
		{`"core"`, "", 0, false},
		{`"unterminated;r=1`, "", 0, false},
		{`"core";r=x`, "", 0, false},
		{``, "", 0, false},
	} {
		member, r, ok := parseRateLimit(tc.in)
		assert.Equal(t, tc.ok, ok, tc.in)
		if tc.ok {
			assert.Equal(t, tc.member, member, tc.in)
			assert.Equal(t, tc.r, r, tc.in)
		}
	}
	assert.Equal(t, `"core:30/10s"`, sfString("core:30/10s"))
	member, _, ok := parseRateLimit(sfString(`a"b\c`) + ";r=1")
	assert.True(t, ok)
	assert.Equal(t, `a"b\c`, member, "the legacy limiter's member names read back")
}

func TestJudgeMode(t *testing.T) {
	cfg := demoConfig(true)
	good := func(i, target, onNew int) phaseResult {
		p := phaseResult{index: i, count: 3, warmUp: i == 0, target: target, totals: phaseTotals{active: 100}}
		p.totals.ids = [2]int{100 - onNew, onNew}
		p.totals.sides[0] = sideCounts{requests: 10, allowed: 7, denied: 3, moved: 1, checked: 1}
		return p
	}
	mirror := modeRun{mode: rollout.MirrorMode, clients: 100, abusive: 10, planned: 3}
	v := judgeMode([]phaseResult{good(0, 0, 0), good(1, 0, 0), good(2, 50, 53)}, cfg, mirror)
	assert.True(t, v.Pass, v.Line)
	assert.True(t, strings.HasPrefix(v.Line, "mirror mode: PASS (3 phases, warm-up → 0% → 50%: "), v.Line)

	bad := good(2, 50, 60)
	bad.totals.sides[1] = sideCounts{resetChanges: 2, doubleGrants: 3, contradictions: 2, quotaClaims: 1, degraded: 1, moved: 4}
	bad.totals.errors = 4
	v = judgeMode([]phaseResult{good(0, 0, 0), good(1, 0, 0), bad}, cfg, modeRun{mode: rollout.SplitMode, planned: 4})
	assert.False(t, v.Pass)
	assert.Equal(t, []string{
		"no ResetAt change (phase 3: 2, with 5 moves)",
		"no double grant (phase 3: 3)",
		"no result contradicting the store (phase 3: 2)",
		"no denial claiming quota (phase 3: 1)",
		"share on new backend (phase 3: 60.0%, target 50% ± 5)",
		"no degraded responses (phase 3: 1)",
		"no failed requests (phase 3: 4)",
		"complete run (3 of 4 phases)",
	}, v.Failures)
	assert.True(t, strings.HasPrefix(v.Line, "split mode: FAIL: no ResetAt change"), v.Line)

	quiet := good(0, 0, 0)
	quiet.totals.sides[0].denied = 0
	quiet.totals.sides[0].checked = 0
	v = judgeMode([]phaseResult{quiet}, cfg, modeRun{mode: rollout.SplitMode, planned: 1, interrupted: "interrupted"})
	assert.Equal(t, []string{
		"allowed and denied in every phase (phase 1: 7 allowed, 0 denied)",
		"moves checked (1 moves, none within an open window)",
		"complete run (interrupted after 1 of 1 phases)",
	}, v.Failures)

	// In mirror mode a shortfall or a failed write on the other store fails
	// the run, whether or not a client checked the window it broke; so do
	// writes that find the stores apart for an identifier already mirrored.
	torn := good(2, 50, 53)
	torn.stats.MirrorShortfalls, torn.stats.SecondaryErrors, torn.stats.MirrorDiverged = 2, 1, 3
	first := good(1, 0, 0)
	first.stats.MirrorDiverged = 100 // the new store was empty
	v = judgeMode([]phaseResult{good(0, 0, 0), first, torn}, cfg, mirror)
	assert.Equal(t, []string{
		"mirror kept both stores alike (phase 3: 2 shortfalls, 1 secondary errors)",
		"mirror converged after each identifier's first write (phase 3: 3 writes found the other store apart, 0 identifiers not mirrored before)",
	}, v.Failures)
	// A client that made no request in the rollout's first phase has its
	// first mirrored write later: one such write per identifier passes,
	// one more does not.
	late := good(2, 50, 53)
	late.totals.unmirrored, late.stats.MirrorDiverged = 3, 3
	v = judgeMode([]phaseResult{good(0, 0, 0), first, late}, cfg, mirror)
	assert.True(t, v.Pass, v.Line)
	late.stats.MirrorDiverged = 4
	v = judgeMode([]phaseResult{good(0, 0, 0), first, late}, cfg, mirror)
	assert.Equal(t, []string{
		"mirror converged after each identifier's first write (phase 3: 4 writes found the other store apart, 3 identifiers not mirrored before)",
	}, v.Failures)

	// Split mode must seed every move it looks up; legacy windows must be
	// carried when clients started on the hand-written limiter.
	unseeded := good(2, 50, 53)
	unseeded.stats.SeedUnsupported, unseeded.legacy.SecondaryErrors = 5, 2
	v = judgeMode([]phaseResult{good(0, 0, 0), good(1, 0, 0), unseeded}, cfg,
		modeRun{mode: rollout.SplitMode, legacy: 50, planned: 3})
	assert.Equal(t, []string{
		"split mode seeded every move (phase 3: 5 lookups the serving store could not take, 0 failed reads)",
		"legacy counters carried over (phase 3: 0 the old store could not take, 2 failed reads, " +
			"50 clients started on the hand-written limiter, no window was carried)",
	}, v.Failures)
	off := cfg
	off.Seeding = false
	v = judgeMode([]phaseResult{good(0, 0, 0), good(1, 0, 0), unseeded}, off, modeRun{mode: rollout.SplitMode, planned: 3})
	assert.Equal(t, []string{"legacy counters carried over (phase 3: 0 the old store could not take, 2 failed reads)"},
		v.Failures, "without seeding, split mode's lookups are not judged")
}

func TestJudgeRun(t *testing.T) {
	pass := func(m rollout.Mode) ModeVerdict {
		return ModeVerdict{Mode: m, Pass: true, Line: m.String() + " mode: PASS (...)", requests: 100, moves: 10, checked: 4}
	}
	stall := ModeVerdict{Leg: stallLegName, Pass: true, requests: 50}
	v := judgeRun([]ModeVerdict{pass(rollout.MirrorMode), pass(rollout.SplitMode), stall}, 3)
	assert.True(t, v.Pass)
	assert.Equal(t, "VERDICT: PASS (mirror mode, split mode and stalled Redis group: 0 ResetAt changes, 0 double grants "+
		"and 0 results contradicting the store, over 20 moves (8 checked in an open window) and 250 responses)", v.Line)

	failed := ModeVerdict{Mode: rollout.SplitMode, Failures: []string{"no double grant (phase 3: 1)"}}
	v = judgeRun([]ModeVerdict{pass(rollout.MirrorMode), failed}, 2)
	assert.False(t, v.Pass, "one failing mode fails the run")
	assert.Equal(t, "VERDICT: FAIL: split mode: no double grant (phase 3: 1)", v.Line)

	v = judgeRun([]ModeVerdict{pass(rollout.MirrorMode)}, 2)
	assert.False(t, v.Pass, "a mode that did not run fails the run")
	assert.Equal(t, []string{"complete run (1 of 2 legs)"}, v.Failures)

	v = judgeRun([]ModeVerdict{pass(rollout.MirrorMode), {Leg: stallLegName, Failures: []string{"no result contradicting the store (3)"}}}, 2)
	assert.Equal(t, "VERDICT: FAIL: stalled Redis group: no result contradicting the store (3)", v.Line)
}

// TestLegacyLimiter runs the hand-written limiter on a real memcached and
// reads its counters back through backend/legacy, as the deploy does: the
// two must agree on the classic layout.
func TestLegacyLimiter(t *testing.T) {
	requireServers(t)
	mc := localserver.MemcachedT(t, localserver.MemcachedOptions{})
	client, err := memcachedbackend.NewClient(2*time.Second, mc.Addr())
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close() })
	policy, err := throttler.ParsePolicy(resourceName, "600/h, 3/10s")
	require.NoError(t, err)
	lim := newLegacyLimiter(client, policy, newKeyPrefix(time.Now(), rollout.SplitMode))
	require.NotNil(t, lim)
	assert.Equal(t, "core:3/10s", lim.member)

	// Whole seconds from now, so that the window is live for memcached's
	// expiry too.
	t0 := time.Now().Truncate(time.Second).Add(300 * time.Millisecond)
	reset := t0.Add(10*time.Second).Unix() + 1
	for i, want := range []handwritten.Decision{
		{Allowed: true, Count: 1, Reset: reset}, {Allowed: true, Count: 2, Reset: reset},
		{Allowed: true, Count: 3, Reset: reset}, {Allowed: false, Count: 4, Reset: reset},
	} {
		d, err := lim.allow(t0.Add(time.Duration(i)*time.Second), "alice")
		require.NoError(t, err)
		assert.Equal(t, want, d, "request %d", i+1)
	}

	reader, err := legacybackend.NewMemcached(client, lim.window, legacybackend.WithKeyFunc(lim.key))
	require.NoError(t, err)
	th, err := throttler.New(reader, throttler.WithClock(throttlertest.NewManualClock(t0.Add(5*time.Second))))
	require.NoError(t, err)
	r, err := th.Peek(context.Background(), policy, "alice")
	require.NoError(t, err)
	require.False(t, r.Degraded, "%v", r.Err)
	assert.Equal(t, int64(3), r.Limits()[1].Used, "the legacy count, as backend/legacy reads it (denials included, capped)")
	assert.Equal(t, time.Unix(reset, 0), r.Limits()[1].ResetAt, "the legacy window's end")
	assert.Zero(t, r.Limits()[0].Used, "the hand-written limiter knows no hourly limit")

	// A window that has ended opens a new one at the next request.
	d, err := lim.allow(time.Unix(reset, 0).Add(100*time.Millisecond), "alice")
	require.NoError(t, err)
	assert.Equal(t, handwritten.Decision{Allowed: true, Count: 1, Reset: reset + 10 + 1}, d)
}

func TestOnLegacy(t *testing.T) {
	n := 0
	for i := range 200 {
		token := fmt.Sprintf("demo-%04d", i)
		assert.False(t, onLegacy(token, 0))
		assert.True(t, onLegacy(token, 1))
		if onLegacy(token, 0.5) {
			n++
		}
	}
	assert.InDelta(t, 100, n, 20, "about half the tokens")
}

func TestTable(t *testing.T) {
	var tb table
	tb.row("backend", "ids", "share")
	tb.row("old memcached", "181", "90.5%")
	tb.row("  redis/a", "9")
	var out bytes.Buffer
	tb.write(&out, "  ")
	assert.Equal(t, ""+
		"  backend        ids  share\n"+
		"  old memcached  181  90.5%\n"+
		"    redis/a        9\n", out.String())
	assert.Equal(t, "12,345,678", fmtInt(12_345_678))
	assert.Equal(t, "-1,000", fmtInt(-1000))
	assert.Equal(t, "999", fmtInt(999))
}

// TestErrorSamplesKeepEveryKind: a frequent kind of evidence does not
// hide a rarer one that comes later.
func TestErrorSamplesKeepEveryKind(t *testing.T) {
	var e errorSamples
	for i := range 20 {
		e.addKindf("ResetAt change", "client %d", i)
	}
	e.addKindf("ResetAt change", "client %d", 0)
	e.addKindf(contradictingKind, "client %d", 7)
	assert.Equal(t, []string{
		"2× ResetAt change: client 0",
		"1× ResetAt change: client 1", "1× ResetAt change: client 2", "1× ResetAt change: client 3",
		"1× ResetAt change: client 4",
		"1× result contradicting the store: client 7",
	}, e.list())
}
