package unleashflag

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/Unleash/unleash-client-go/v4"
	"github.com/Unleash/unleash-client-go/v4/api"
	ucontext "github.com/Unleash/unleash-client-go/v4/context"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// TestSplitMatchesUnleashClient checks that the source's own evaluation
// agrees, identifier by identifier, with the real client's IsEnabled given
// the identifier in the field the strategy's stickiness names, for several
// stickiness settings and a fractional rollout.
func TestSplitMatchesUnleashClient(t *testing.T) {
	flags := newFlagServer(t, 37)
	src := newTestSource(t, flags)
	client := src.Client()
	for _, tc := range []struct {
		stickiness string
		rollout    string
		context    func(id string) ucontext.Context
	}{
		{"userId", "37", func(id string) ucontext.Context { return ucontext.Context{UserId: id} }},
		{"default", "37.9", func(id string) ucontext.Context { return ucontext.Context{UserId: id} }},
		{"sessionId", "62", func(id string) ucontext.Context { return ucontext.Context{SessionId: id} }},
		{"tenantId", "5", func(id string) ucontext.Context {
			return ucontext.Context{Properties: map[string]string{"tenantId": id}}
		}},
	} {
		t.Run(tc.stickiness, func(t *testing.T) {
			before := src.Status().Updates
			flags.change(func(f *flagServer) { f.stickiness, f.rollout = tc.stickiness, tc.rollout })
			waitFor(t, "the new toggle", func() bool { return src.Status().Updates > before })
			sp := src.Split()
			disagree := 0
			for _, id := range ids(3000) {
				want := client.IsEnabled(testFeature, unleash.WithContext(tc.context(id)))
				if want != (sp.Side(id) == rollout.SideNew) {
					disagree++
				}
			}
			assert.Zero(t, disagree, "identifiers on which the client and the split disagree")
		})
	}
}

// TestUnleashIsStickyWhereTheClientIsNot shows the trap the source avoids:
// with default stickiness, a context without userId or sessionId makes the
// client hash a random number, so one identifier lands on both sides. The
// source hashes the identifier itself: the same side every time, across
// refreshes.
func TestUnleashIsStickyWhereTheClientIsNot(t *testing.T) {
	flags := newFlagServer(t, 50)
	flags.change(func(f *flagServer) { f.stickiness = "default" })
	src := newTestSource(t, flags)
	waitPercent(t, src, 50)

	seen := map[bool]bool{}
	for i := 0; i < 200 && len(seen) < 2; i++ {
		seen[src.Client().IsEnabled(testFeature)] = true
	}
	assert.Len(t, seen, 2, "without an identifier in the context the client answers at random")

	all := ids(500)
	first := make([]rollout.Side, len(all))
	for i, id := range all {
		first[i] = src.Split().Side(id)
	}
	// Several refreshes later (each a 304 or a refetch) nothing has moved.
	fetches := flags.fetches.Load() + flags.notModified.Load()
	waitFor(t, "three more polls", func() bool { return flags.fetches.Load()+flags.notModified.Load() >= fetches+3 })
	for i, id := range all {
		require.Equal(t, first[i], src.Split().Side(id), "identifier %q moved at a fixed percentage", id)
	}
}

// TestUnleashDistributionAndMonotonicity drives 10,000 identifiers through
// a rollout Backend whose split comes from the flag server: at p% the new
// backend serves p% of them within two points; raising the percentage moves
// identifiers only from old to new, lowering it only back.
func TestUnleashDistributionAndMonotonicity(t *testing.T) {
	flags := newFlagServer(t, 10)
	src := newTestSource(t, flags)
	rb := mustRollout(t, memorybackend.New(), memorybackend.New(), src)
	all := ids(10000)

	sides := func() []rollout.Side {
		out := make([]rollout.Side, len(all))
		for i, id := range all {
			out[i] = rb.Side(id)
		}
		return out
	}
	share := func(s []rollout.Side) float64 {
		n := 0
		for _, side := range s {
			if side == rollout.SideNew {
				n++
			}
		}
		return 100 * float64(n) / float64(len(s))
	}

	waitPercent(t, src, 10)
	prev := sides()
	t.Logf("10%%: new backend serves %.2f%%", share(prev))
	assert.InDelta(t, 10, share(prev), 2)
	for _, p := range []int{25, 50, 75, 90, 50, 10, 0, 100} {
		flags.setPercent(p)
		waitPercent(t, src, p)
		cur := sides()
		t.Logf("%d%%: new backend serves %.2f%%", p, share(cur))
		assert.InDelta(t, float64(p), share(cur), 2, "share at %d%%", p)
		movedUp, movedDown := 0, 0
		for i := range cur {
			switch {
			case prev[i] == rollout.SideOld && cur[i] == rollout.SideNew:
				movedUp++
			case prev[i] == rollout.SideNew && cur[i] == rollout.SideOld:
				movedDown++
			}
		}
		if raised := share(cur) >= share(prev); raised {
			assert.Zero(t, movedDown, "identifiers moved new→old while raising to %d%%", p)
		} else {
			assert.Zero(t, movedUp, "identifiers moved old→new while lowering to %d%%", p)
		}
		prev = cur
	}
}

// TestUnleashRaiseMovesOnlyOldToNew is the 10% → 50% step end to end: each
// identifier spends one unit through the rollout Backend at 10% and one at
// 50%, and the two memory backends' counts show who moved where.
func TestUnleashRaiseMovesOnlyOldToNew(t *testing.T) {
	flags := newFlagServer(t, 10)
	src := newTestSource(t, flags)
	clock := throttlertest.NewManualClock(t0)
	policy := mustPolicy(t, "api", "100/h")
	oldB, newB := memorybackend.New(), memorybackend.New()
	th := testkit.Throttler(t, mustRollout(t, oldB, newB, src), throttler.WithClock(clock))
	oldView, newView := newView(oldB, clock, policy), newView(newB, clock, policy)
	ctx := context.Background()
	all := ids(10000)

	spend := func() {
		for _, id := range all {
			r, err := th.Allow(ctx, policy, id)
			require.NoError(t, err)
			require.True(t, r.Allowed)
			require.False(t, r.Degraded, "%v", r.Err)
		}
	}
	waitPercent(t, src, 10)
	spend()
	// Which backend each identifier's first unit went to, read back from
	// the backends themselves.
	firstOnNew := make([]bool, len(all))
	onNew := 0
	for i, id := range all {
		o, n := oldView.peek(t, id).Used, newView.peek(t, id).Used
		require.Equal(t, int64(1), o+n, "%q spent its unit on exactly one backend", id)
		firstOnNew[i] = n == 1
		if firstOnNew[i] {
			onNew++
		}
	}
	assert.InDelta(t, 0.10*float64(len(all)), onNew, 0.02*float64(len(all)))

	flags.setPercent(50)
	waitPercent(t, src, 50)
	spend()
	stayedOld, movedUp, stayedNew := 0, 0, 0
	for i, id := range all {
		o, n := oldView.peek(t, id).Used, newView.peek(t, id).Used
		switch {
		case firstOnNew[i]:
			require.Equal(t, [2]int64{0, 2}, [2]int64{o, n}, "%q moved back from new to old", id)
			stayedNew++
		case o == 2 && n == 0:
			stayedOld++
		case o == 1 && n == 2:
			// Moved: the new backend was seeded with the unit spent on
			// the old one, then spent the second.
			movedUp++
		default:
			t.Fatalf("%q: old used %d, new used %d", id, o, n)
		}
	}
	t.Logf("10%% → 50%%: %d stayed on old, %d moved old→new, %d stayed on new, 0 moved back",
		stayedOld, movedUp, stayedNew)
	assert.InDelta(t, 0.40*float64(len(all)), movedUp, 0.02*float64(len(all)))
	assert.InDelta(t, 0.50*float64(len(all)), stayedOld, 0.02*float64(len(all)))
}

// TestUnleashFollowsChange measures how long a percentage changed on the
// flag server takes to be in force: at most about one refresh interval
// (two when a fetch was in flight at the change). The assertion only has a
// generous deadline; the figure is logged.
func TestUnleashFollowsChange(t *testing.T) {
	flags := newFlagServer(t, 20)
	src := newTestSource(t, flags)
	waitPercent(t, src, 20)

	var worst time.Duration
	for _, p := range []int{30, 40, 35} {
		changed := time.Now()
		flags.setPercent(p)
		waitPercent(t, src, p)
		lag := src.Status().LastUpdate.Sub(changed)
		worst = max(worst, lag)
		t.Logf("%d%%: in force %v after the change (%.2f refresh intervals)", p, lag.Round(time.Millisecond),
			float64(lag)/float64(refreshInterval))
	}
	t.Logf("worst lag %v = %.2f refresh intervals of %v", worst.Round(time.Millisecond),
		float64(worst)/float64(refreshInterval), refreshInterval)
	if worst > 2*refreshInterval {
		t.Logf("note: slower than two refresh intervals on this (shared) machine")
	}
}

// TestUnleashServerStoppedKeepsSplit stops the flag server: the client's
// fetches fail, and the split stays as it was.
func TestUnleashServerStoppedKeepsSplit(t *testing.T) {
	flags := newFlagServer(t, 30)
	var reported atomic.Int64
	src := newTestSource(t, flags, WithErrorHandler(func(error) { reported.Add(1) }))
	waitPercent(t, src, 30)
	rb := mustRollout(t, memorybackend.New(), memorybackend.New(), src)
	all := ids(2000)
	before := make([]rollout.Side, len(all))
	for i, id := range all {
		before[i] = rb.Side(id)
	}

	flags.srv.Close()
	errs := src.Status().Errors
	waitFor(t, "two failed fetches", func() bool { return src.Status().Errors >= errs+2 })
	st := src.Status()
	require.Error(t, st.LastError)
	assert.Positive(t, reported.Load())
	require.NotNil(t, st.Split)
	assert.Equal(t, 30, st.Split.Percent())
	for i, id := range all {
		require.Equal(t, before[i], rb.Side(id), "%q moved while the flag server was down", id)
	}
}

// TestUnleashServerFailingKeepsSplit is the same with a server that answers
// 503: the client backs off and the split stays.
func TestUnleashServerFailingKeepsSplit(t *testing.T) {
	flags := newFlagServer(t, 30)
	src := newTestSource(t, flags)
	waitPercent(t, src, 30)
	flags.change(func(f *flagServer) { f.failing, f.rollout = true, "90" })
	errs := src.Status().Errors
	waitFor(t, "a failed fetch", func() bool { return src.Status().Errors > errs })
	assert.Equal(t, 30, src.Split().Percent())
}

// TestUnleashDefaultBeforeFirstAnswer: before the first successful fetch
// the Backend routes by its default side (old unless told otherwise), and
// counts those decisions.
func TestUnleashDefaultBeforeFirstAnswer(t *testing.T) {
	flags := newFlagServer(t, 100)
	flags.change(func(f *flagServer) { f.failing = true })
	src := newTestSource(t, flags)
	waitFor(t, "a failed fetch", func() bool { return src.Status().Errors > 0 })
	require.Nil(t, src.Split())

	clock := throttlertest.NewManualClock(t0)
	policy := mustPolicy(t, "api", "10/min")
	for _, side := range []rollout.Side{rollout.SideOld, rollout.SideNew} {
		oldB, newB := memorybackend.New(), memorybackend.New()
		opts := []rollout.Option{}
		if side == rollout.SideNew {
			opts = append(opts, rollout.WithDefaultSide(rollout.SideNew))
		}
		rb := mustRollout(t, oldB, newB, src, opts...)
		th := testkit.Throttler(t, rb, throttler.WithClock(clock))
		_, err := th.Allow(context.Background(), policy, "user:1")
		require.NoError(t, err)
		backends := [2]driver.Backend{oldB, newB}
		assert.EqualValues(t, 1, newView(backends[side], clock, policy).peek(t, "user:1").Used)
		assert.EqualValues(t, 0, newView(backends[1-side], clock, policy).peek(t, "user:1").Used)
		assert.EqualValues(t, 1, rb.Stats().DefaultRouted)
	}

	flags.change(func(f *flagServer) { f.failing = false })
	waitPercent(t, src, 100)
}

// TestUnleashKillSwitch: a disabled or deleted toggle puts everything on the
// old backend; enabling it again restores the percentage.
func TestUnleashKillSwitch(t *testing.T) {
	flags := newFlagServer(t, 60)
	src := newTestSource(t, flags)
	waitPercent(t, src, 60)
	all := ids(1000)
	countNew := func() int {
		n := 0
		for _, id := range all {
			if src.Split().Side(id) == rollout.SideNew {
				n++
			}
		}
		return n
	}
	require.Positive(t, countNew())

	flags.change(func(f *flagServer) { f.enabled = false })
	waitFor(t, "the kill switch", func() bool { return src.Split().Killed() })
	assert.Zero(t, countNew())

	flags.change(func(f *flagServer) { f.enabled = true })
	waitPercent(t, src, 60)
	assert.Positive(t, countNew())

	flags.change(func(f *flagServer) { f.present = false })
	waitFor(t, "the kill switch", func() bool { return src.Split().Killed() })
	assert.Zero(t, countNew())
}

// TestUnleashRejectsUnstickyToggles: a toggle whose group ID changed, whose
// stickiness is random or which has constraints is not a sticky percentage:
// the source keeps the last split and reports ErrUnsupportedToggle.
func TestUnleashRejectsUnstickyToggles(t *testing.T) {
	flags := newFlagServer(t, 40)
	var lastErr atomic.Pointer[error]
	src := newTestSource(t, flags, WithErrorHandler(func(err error) { lastErr.Store(&err) }))
	waitPercent(t, src, 40)
	for _, edit := range []func(f *flagServer){
		func(f *flagServer) { f.groupID, f.rollout = "renamed", "41" },
		func(f *flagServer) { f.stickiness, f.rollout = "random", "42" },
		func(f *flagServer) {
			f.rollout = "43"
			f.extra = map[string]any{"constraints": []any{map[string]any{
				"contextName": "appName", "operator": "IN", "values": []any{"x"}}}}
		},
	} {
		rejected := src.Status().Rejected
		flags.change(func(f *flagServer) {
			f.groupID, f.stickiness, f.rollout, f.extra = testFeature, "userId", "40", nil
			edit(f)
		})
		waitFor(t, "a rejection", func() bool { return src.Status().Rejected > rejected })
		assert.Equal(t, 40, src.Split().Percent())
		e := lastErr.Load()
		require.NotNil(t, e)
		assert.ErrorIs(t, *e, ErrUnsupportedToggle)
	}
}

// TestUnleashNotModified: an unchanged toggle is answered 304 and changes
// nothing.
func TestUnleashNotModified(t *testing.T) {
	flags := newFlagServer(t, 40)
	src := newTestSource(t, flags)
	waitPercent(t, src, 40)
	waitFor(t, "two 304 answers", func() bool { return flags.notModified.Load() >= 2 })
	assert.EqualValues(t, 1, src.Status().Updates, "a 304 must not republish")
	assert.EqualValues(t, 1, flags.fetches.Load())
}

// TestUnleashWithMetrics: the client may be told to send metrics (the
// source disables them by default); registration then reaches the server
// and the split works the same.
func TestUnleashWithMetrics(t *testing.T) {
	flags := newFlagServer(t, 40)
	src := newTestSource(t, flags, WithClientOptions(
		unleash.WithDisableMetrics(false), unleash.WithMetricsInterval(refreshInterval)))
	waitPercent(t, src, 40)
	assert.EqualValues(t, 1, flags.registers.Load())
}

// Bad options are errors that name the problem, before anything starts: no
// goroutine is left behind, and no part of a password in the URL shows.
func TestNewUnleashSourceErrors(t *testing.T) {
	before := runtime.NumGoroutine()
	for name, tc := range map[string]struct {
		feature string
		opts    []Option
		want    string
	}{
		"no feature":  {"", []Option{WithServer("http://127.0.0.1:1/api", "app")}, "empty feature"},
		"no server":   {"f", nil, "needs WithServer"},
		"no app":      {"f", []Option{WithServer("http://127.0.0.1:1/api", "")}, "application name"},
		"no /api":     {"f", []Option{WithServer("http://127.0.0.1:1/", "app")}, "does not end in /api"},
		"deeper path": {"f", []Option{WithServer("http://u:s3cret@127.0.0.1:1/unleash/", "app")}, "does not end in /api"},
		"scheme":      {"f", []Option{WithServer("ftp://127.0.0.1:1/api", "app")}, "scheme"},
		"no host":     {"f", []Option{WithServer("http:///api", "app")}, "no host"},
		"unparsable":  {"f", []Option{WithServer("http://u:s3cret@[::1/api", "app")}, "does not parse"},
		"nil option":  {"f", []Option{nil}, "throttlekit: invalid option: unleashflag: nil Option"},
		"wait":        {"f", []Option{WithServer("http://127.0.0.1:1/api", "app"), WithWaitForFirstFetch(-1)}, "negative"},
	} {
		_, err := New(tc.feature, tc.opts...)
		assert.ErrorIs(t, err, driver.ErrInvalidOption, name)
		assert.ErrorContains(t, err, tc.want, name)
		if err != nil {
			assert.NotContains(t, err.Error(), "s3cret", name)
		}
	}
	// The client's goroutines would linger a moment after a Close; none
	// was started here, so the count returns to where it was.
	waitFor(t, "no goroutine left", func() bool { return runtime.NumGoroutine() <= before })
}

// WithWaitForFirstFetch fails fast and clearly: a refused token (401) or a
// path the server does not know (404) is ErrRefused, a server that does not
// answer is ErrNotReady, and a server that answers gives a source with its
// split in force when New returns. Ping follows the latest fetch.
func TestWaitForFirstFetch(t *testing.T) {
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
	}))
	t.Cleanup(refusing.Close)
	for name, url := range map[string]string{
		"401": refusing.URL + "/api/",
		"404": newFlagServer(t, 10).srv.URL + "/unleash/api/",
	} {
		start := time.Now()
		_, err := New(testFeature, WithServer(url, "app"), WithWaitForFirstFetch(5*time.Second))
		assert.ErrorIs(t, err, ErrRefused, name)
		t.Logf("%s: refused after %v: %v", name, time.Since(start).Round(time.Millisecond), err)
	}

	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close()) // nothing listens there
	start := time.Now()
	_, err = New(testFeature, WithServer("http://"+addr+"/api/", "app"), WithWaitForFirstFetch(5*time.Second))
	assert.ErrorIs(t, err, ErrNotReady)
	t.Logf("unreachable: failed after %v: %v", time.Since(start).Round(time.Millisecond), err)

	flags := newFlagServer(t, 35)
	src := newTestSource(t, flags, WithWaitForFirstFetch(5*time.Second))
	require.NotNil(t, src.Split(), "the split is in force when New returns")
	assert.Equal(t, 35, src.Split().Percent())
	require.NoError(t, src.Ping(context.Background()))
	flags.change(func(f *flagServer) { f.failing = true })
	waitFor(t, "Ping to report the failing server", func() bool {
		return errors.Is(src.Ping(context.Background()), ErrNotReady)
	})
	assert.Equal(t, 35, src.Split().Percent(), "the split stays")
	flags.change(func(f *flagServer) { f.failing = false })
	waitFor(t, "Ping to recover", func() bool { return src.Ping(context.Background()) == nil })

	// rollout.Backend's Ping includes the source's.
	b := mustRollout(t, memorybackend.New(), memorybackend.New(), src)
	assert.NoError(t, b.Ping(context.Background()))
}

// WithUsageMetrics evaluates the toggle off the request path and lets the
// client register and send metrics, so the toggle shows as used.
func TestUsageMetrics(t *testing.T) {
	flags := newFlagServer(t, 40)
	src := newTestSource(t, flags, WithUsageMetrics(), WithClientOptions(unleash.WithMetricsInterval(refreshInterval)))
	waitPercent(t, src, 40)
	waitFor(t, "metrics to reach the server", func() bool { return flags.metrics.Load() > 0 })
	assert.EqualValues(t, 1, flags.registers.Load())
}

func TestReadToggle(t *testing.T) {
	flex := func(params api.ParameterMap) api.Strategy {
		return api.Strategy{Name: "flexibleRollout", Parameters: params}
	}
	deps := []api.Dependency{{Feature: "parent"}}
	for _, tc := range []struct {
		name    string
		feature *api.Feature
		percent int
		killed  bool
		err     error
	}{
		{"missing", nil, 0, true, nil},
		{"disabled", &api.Feature{Enabled: false, Strategies: []api.Strategy{
			flex(api.ParameterMap{"rollout": "50", "groupId": "g"})}}, 0, true, nil},
		{"no strategies", &api.Feature{Enabled: true}, 100, false, nil},
		{"default strategy", &api.Feature{Enabled: true, Strategies: []api.Strategy{{Name: "default"}}}, 100, false, nil},
		{"string rollout", &api.Feature{Enabled: true, Strategies: []api.Strategy{
			flex(api.ParameterMap{"rollout": "37.5", "stickiness": "userId", "groupId": "g"})}}, 37, false, nil},
		{"number rollout, no stickiness", &api.Feature{Enabled: true, Strategies: []api.Strategy{
			flex(api.ParameterMap{"rollout": float64(12), "groupId": "g"})}}, 12, false, nil},
		{"above 100", &api.Feature{Enabled: true, Strategies: []api.Strategy{
			flex(api.ParameterMap{"rollout": "250", "groupId": "g"})}}, 100, false, nil},
		{"negative", &api.Feature{Enabled: true, Strategies: []api.Strategy{
			flex(api.ParameterMap{"rollout": "-3", "groupId": "g"})}}, 0, false, nil},
		{"largest of two", &api.Feature{Enabled: true, Strategies: []api.Strategy{
			flex(api.ParameterMap{"rollout": "20", "groupId": "g"}),
			flex(api.ParameterMap{"rollout": "30", "groupId": "g"})}}, 30, false, nil},
		{"other group", &api.Feature{Enabled: true, Strategies: []api.Strategy{
			flex(api.ParameterMap{"rollout": "20", "groupId": "h"})}}, 0, false, ErrUnsupportedToggle},
		{"random", &api.Feature{Enabled: true, Strategies: []api.Strategy{
			flex(api.ParameterMap{"rollout": "20", "groupId": "g", "stickiness": "random"})}}, 0, false, ErrUnsupportedToggle},
		{"bad rollout", &api.Feature{Enabled: true, Strategies: []api.Strategy{
			flex(api.ParameterMap{"rollout": "lots", "groupId": "g"})}}, 0, false, ErrUnsupportedToggle},
		{"NaN", &api.Feature{Enabled: true, Strategies: []api.Strategy{
			flex(api.ParameterMap{"rollout": "NaN", "groupId": "g"})}}, 0, false, ErrUnsupportedToggle},
		{"missing rollout", &api.Feature{Enabled: true, Strategies: []api.Strategy{
			flex(api.ParameterMap{"groupId": "g"})}}, 0, false, ErrUnsupportedToggle},
		{"other strategy", &api.Feature{Enabled: true, Strategies: []api.Strategy{
			{Name: "userWithId", Parameters: api.ParameterMap{"userIds": "a,b"}}}}, 0, false, ErrUnsupportedToggle},
		{"segments", &api.Feature{Enabled: true, Strategies: []api.Strategy{
			{Name: "default", Segments: []int{1}}}}, 0, false, ErrUnsupportedToggle},
		{"dependencies", &api.Feature{Enabled: true, Dependencies: &deps}, 0, false, ErrUnsupportedToggle},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sp, err := readToggle(tc.feature, "toggle", "g")
			if tc.err != nil {
				require.True(t, errors.Is(err, tc.err), "error %v", err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.percent, sp.Percent())
			assert.Equal(t, tc.killed, sp.Killed())
		})
	}
}
