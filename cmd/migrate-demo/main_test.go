package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/internal/localserver"
	"github.com/throttlekit/throttlekit/rollout"
)

// runDemo runs the demo in-process with cfg and returns its verdict and
// output. The run is bounded by its own phases; the context is a backstop.
func runDemo(t *testing.T, cfg Config) (Verdict, string) {
	t.Helper()
	// The tests run under -race on machines that run other tests at the
	// same time: a stalled call would fail open and show as a degraded
	// response, which is about the machine, not the migration.
	cfg.CallTimeout = 2 * time.Second
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

// assertPassed checks a full ramp's report: one table per phase, the
// summary, and a passing verdict.
func assertPassed(t *testing.T, v Verdict, out string, phases int) {
	t.Helper()
	if !v.Pass {
		t.Errorf("verdict: %s\noutput:\n%s", v.Line, out)
		return
	}
	for i := 1; i <= phases; i++ {
		assert.Contains(t, out, fmt.Sprintf("\nphase %d/%d: ", i, phases))
	}
	assert.Contains(t, out, "\nsummary\n")
	assert.Contains(t, out, "  backend ")
	assert.Contains(t, out, "\nVERDICT: PASS (")
	assert.Empty(t, v.Failures)
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
// Redis primaries with a replica each, the ramp 0-10-50-100% in mirror mode.
// Every invariant must hold.
func TestShortRunOnServers(t *testing.T) {
	localserver.SkipIfShort(t)
	requireServers(t)
	v, out := runDemo(t, demoConfig(true))
	assertPassed(t, v, out, 4)
	assert.Contains(t, out, "old memcached")
	assert.Contains(t, out, "redis/a")
	assert.Contains(t, out, "redis/b")
}

// TestShortRunEmbedded is `-short -embedded`: the same ramp on a memory
// backend and a sharded backend over two memory shards.
func TestShortRunEmbedded(t *testing.T) {
	cfg := demoConfig(true)
	cfg.Embedded = true
	v, out := runDemo(t, cfg)
	assertPassed(t, v, out, 4)
	assert.Contains(t, out, "memory/a")
	assert.Contains(t, out, "memory/b")
}

// TestSplitModeRestartsAreCaught shows that the clients' checks have
// teeth: in split mode an identifier that moves starts afresh on the new
// store, and the verdict must say so.
func TestSplitModeRestartsAreCaught(t *testing.T) {
	cfg := demoConfig(true)
	cfg.Embedded, cfg.Mode, cfg.Ramp, cfg.Identifiers, cfg.Progress = true, rollout.SplitMode, []int{0, 100}, 60, 0
	v, out := runDemo(t, cfg)
	require.False(t, v.Pass, "split mode passed:\n%s", out)
	require.NotEmpty(t, v.Failures)
	assert.True(t, strings.HasPrefix(v.Failures[0], "windows restarted on move (phase 2: "), "failures: %q", v.Failures)
	assert.Contains(t, out, "\nVERDICT: FAIL: windows restarted on move")
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

	cfg := demoConfig(true)
	cfg.Embedded, cfg.Ramp, cfg.Progress = true, []int{0}, 0
	cfg.UnleashURL, cfg.UnleashToken = srv.URL+"/api", "secret-token"
	v, out := runDemo(t, cfg)
	assertPassed(t, v, out, 1)
	assert.Contains(t, out, "phase 1/1: Unleash says 50% on new")
	assert.Positive(t, fetches.Load())
}

func TestParseConfig(t *testing.T) {
	noEnv := func(string) string { return "" }
	var usage bytes.Buffer

	c, err := parseConfig(nil, noEnv, &usage)
	require.NoError(t, err)
	full := demoConfig(false)
	assert.Equal(t, full, c)

	c, err = parseConfig([]string{"-short", "-embedded"}, noEnv, &usage)
	require.NoError(t, err)
	short := demoConfig(true)
	short.Embedded = true
	assert.Equal(t, short, c)

	env := map[string]string{envMemcached: "10.0.0.1:11211", envRedisShards: "a=redis://10.0.0.2:6379"}
	c, err = parseConfig([]string{"-short", "-duration", "4s", "-policy", "5/s", "-ramp", "0, 25%,100", "-mode", "shadow",
		"-memcached", "10.0.0.9:11211"}, func(k string) string { return env[k] }, &usage)
	require.NoError(t, err)
	assert.Equal(t, 4*time.Second, c.PhaseDuration)
	assert.Equal(t, "5/s", c.Policy)
	assert.Equal(t, []int{0, 25, 100}, c.Ramp)
	assert.Equal(t, rollout.ShadowMode, c.Mode)
	assert.Equal(t, "10.0.0.9:11211", c.MemcachedAddr, "a flag wins over the environment")
	assert.Equal(t, "a=redis://10.0.0.2:6379", c.RedisShards)
	assert.Equal(t, 1.5, c.NormalRate, "-short's default")

	for _, args := range [][]string{
		{"-ramp", "0,101"}, {"-ramp", ""}, {"-mode", "sideways"}, {"-identifiers", "0"}, {"-abusive", "1.5"},
		{"-policy", "lots"}, {"-policy", "6/2s gcra, 600/h"}, {"-duration", "-1s"}, {"-embedded", "-memcached", "x:1"}, {"extra"},
	} {
		_, err := parseConfig(args, noEnv, &usage)
		assert.ErrorIs(t, err, errUsage, "%q", args)
	}
}

func TestJudge(t *testing.T) {
	// A window ending at 100.400 s shows Reset 101: certainly open before
	// 100 s, perhaps closed after.
	at := func(ms int64) time.Time { return time.UnixMilli(ms) }
	obs := func(side rollout.Side, recvMs, reset, used int64) observation {
		return observation{status: http.StatusOK, received: at(recvMs), side: side, member: "core:30/10s",
			reset: reset, used: used, remaining: 30 - used}
	}
	prev := obs(rollout.SideOld, 95_000, 101, 5)
	denied := func(o observation, remaining, r int64) observation {
		o.status, o.remaining, o.r = http.StatusTooManyRequests, remaining, r
		return o
	}
	member := func(o observation, m string) observation { o.member = m; return o }
	degraded := func(o observation) observation { o.degraded = true; return o }

	for _, tc := range []struct {
		name string
		prev *observation
		cur  observation
		want judgement
	}{
		{"first response", nil, obs(rollout.SideOld, 95_000, 101, 1), judgement{}},
		{"same window", &prev, obs(rollout.SideOld, 99_999, 101, 6), judgement{}},
		{"wobble within the window", &prev, obs(rollout.SideOld, 99_000, 102, 6), judgement{wobble: true}},
		{"new window in the last second", &prev, obs(rollout.SideOld, 100_500, 111, 1), judgement{}},
		{"reset going back", &prev, obs(rollout.SideOld, 100_500, 100, 6), judgement{wobble: true}},
		{"move keeps the window", &prev, obs(rollout.SideNew, 96_000, 101, 6), judgement{moved: true, checked: true}},
		{"move restarts the window", &prev, obs(rollout.SideNew, 96_000, 106, 1),
			judgement{moved: true, checked: true, restart: true}},
		{"move loses the count", &prev, obs(rollout.SideNew, 96_000, 101, 2),
			judgement{moved: true, checked: true, restart: true}},
		{"move after the window may have closed", &prev, obs(rollout.SideNew, 100_100, 111, 1), judgement{moved: true}},
		{"binding limit changed", &prev, member(obs(rollout.SideOld, 96_000, 3600, 9), "core:600/h"), judgement{}},
		{"honest denial", &prev, denied(obs(rollout.SideOld, 96_000, 101, 30), 0, 0), judgement{}},
		{"denial claiming remaining", &prev, denied(obs(rollout.SideOld, 96_000, 101, 30), 3, 0),
			judgement{quotaClaim: true}},
		{"denial claiming r", nil, denied(obs(rollout.SideOld, 96_000, 101, 30), 0, 1), judgement{quotaClaim: true}},
		{"degraded is not compared", &prev, degraded(obs(rollout.SideNew, 96_000, 0, 0)), judgement{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, judge(tc.prev, tc.cur))
		})
	}
}

func TestReadObservation(t *testing.T) {
	now := time.Unix(1_000, 0)
	h := http.Header{}
	h.Set(headerSide, "new")
	h.Set(headerStore, "redis/b")
	h.Set("X-RateLimit-Reset", "1007")
	h.Set("X-RateLimit-Used", "30")
	h.Set("X-RateLimit-Remaining", "0")
	h.Set("RateLimit", `"core:30/10s";r=0;t=7`)
	h.Set(headerResultRemaining, "0")
	h.Set(headerResultUsed, "29") // a cost-2 denial with one unit left, say
	o, err := readObservation(http.StatusTooManyRequests, h, now)
	require.NoError(t, err)
	assert.Equal(t, observation{status: 429, received: now, side: rollout.SideNew, store: "redis/b",
		member: "core:30/10s", reset: 1007, used: 29}, o, "a denial's Used is the throttler's own")

	// A denial whose store still held quota is seen through the result
	// headers, although the standard headers are forced to 0.
	h.Set(headerResultRemaining, "5")
	o, err = readObservation(http.StatusTooManyRequests, h, now)
	require.NoError(t, err)
	assert.True(t, judge(nil, o).quotaClaim)
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
}

func TestJudgeRun(t *testing.T) {
	cfg := demoConfig(true)
	good := func(i, target, onNew int) phaseResult {
		p := phaseResult{index: i, count: 2, target: target, totals: phaseTotals{active: 100}}
		p.totals.ids = [2]int{100 - onNew, onNew}
		p.totals.sides[0] = sideCounts{requests: 10, allowed: 7, denied: 3, moved: 1, checked: 1}
		return p
	}
	v := judgeRun([]phaseResult{good(0, 0, 0), good(1, 50, 53)}, cfg, 100, 10, 2, "")
	assert.True(t, v.Pass, v.Line)
	assert.True(t, strings.HasPrefix(v.Line, "VERDICT: PASS ("), v.Line)

	bad := good(1, 50, 60)
	bad.totals.sides[1] = sideCounts{wobble: 2, quotaClaims: 1, degraded: 1}
	bad.totals.errors = 4
	v = judgeRun([]phaseResult{good(0, 0, 0), bad}, cfg, 100, 10, 3, "")
	assert.False(t, v.Pass)
	assert.Equal(t, []string{
		"X-RateLimit-Reset wobble (phase 2: 2)",
		"denials claiming quota (phase 2: 1)",
		"share on new backend (phase 2: 60.0%, target 50% ± 5)",
		"no degraded responses (phase 2: 1)",
		"no failed requests (phase 2: 4)",
		"complete run (2 of 3 phases)",
	}, v.Failures)
	assert.True(t, strings.HasPrefix(v.Line, "VERDICT: FAIL: X-RateLimit-Reset wobble"), v.Line)

	quiet := good(0, 0, 0)
	quiet.totals.sides[0].denied = 0
	quiet.totals.sides[0].checked = 0
	v = judgeRun([]phaseResult{quiet}, cfg, 100, 10, 1, "interrupted")
	assert.Equal(t, []string{
		"allowed and denied in every phase (phase 1: 7 allowed, 0 denied)",
		"restart check exercised (1 moves, none within an open window)",
		"complete run (interrupted after 1 of 1 phases)",
	}, v.Failures)

	// In mirror mode a shortfall or a failed write on the other store fails
	// the run, whether or not a client checked the window it broke.
	require.Equal(t, rollout.MirrorMode, cfg.Mode)
	torn := good(1, 50, 53)
	torn.stats.MirrorShortfalls, torn.stats.SecondaryErrors = 2, 1
	v = judgeRun([]phaseResult{good(0, 0, 0), torn}, cfg, 100, 10, 2, "")
	assert.Equal(t, []string{"mirror kept both stores counting (phase 2: 2 shortfalls, 1 secondary errors)"}, v.Failures)
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
