package rollout

import (
	"context"
	"errors"
	"sync"
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

// sideIDs returns n identifiers that split sends to side.
func sideIDs(t testing.TB, sp *Split, side Side, n int) []string {
	t.Helper()
	var out []string
	for _, id := range ids(10 * n) {
		if sp.Side(id) == side {
			out = append(out, id)
			if len(out) == n {
				return out
			}
		}
	}
	t.Fatalf("fewer than %d identifiers on the %s side", n, side)
	return nil
}

func TestNewValidates(t *testing.T) {
	src := mustStatic(t, 10)
	m := memorybackend.New()
	for name, build := range map[string]func() (*Backend, error){
		"nil old":      func() (*Backend, error) { return New(nil, m, src) },
		"nil new":      func() (*Backend, error) { return New(m, nil, src) },
		"nil source":   func() (*Backend, error) { return New(m, m, nil) },
		"bad mode":     func() (*Backend, error) { return New(m, m, src, WithMode(Mode(7))) },
		"bad fallback": func() (*Backend, error) { return New(m, m, src, WithDefaultSide(Side(-1))) },
	} {
		_, err := build()
		assert.ErrorIs(t, err, driver.ErrInvalidOption, name)
	}
	for _, p := range []int{-1, 101} {
		_, err := NewStaticSource(p)
		assert.ErrorIs(t, err, driver.ErrInvalidOption)
		_, err = NewSplit(p, "g")
		assert.ErrorIs(t, err, driver.ErrInvalidOption)
		assert.ErrorIs(t, src.Set(p), driver.ErrInvalidOption)
		assert.Equal(t, 10, src.Percent(), "a refused Set keeps the split")
	}
	var zero StaticSource
	assert.Nil(t, zero.Split())
	assert.Zero(t, zero.Percent())
}

func TestModeAndKindStrings(t *testing.T) {
	assert.Equal(t, "split", SplitMode.String())
	assert.Equal(t, "mirror", MirrorMode.String())
	assert.Equal(t, "shadow", ShadowMode.String())
	assert.Equal(t, "Mode(9)", Mode(9).String())
	assert.Equal(t, "old", SideOld.String())
	assert.Equal(t, "new", SideNew.String())
	assert.Equal(t, "none", MismatchKind(0).String())
	assert.Equal(t, "verdict|reset", (VerdictDiffers | ResetDiffers).String())
	sp, err := NewSplit(25, "g")
	require.NoError(t, err)
	assert.Equal(t, "25% new (group g)", sp.String())
	assert.Equal(t, "off: 0% new (kill switch)", KillSwitch("g").String())
}

// TestStaticSplitIsStickyAndMonotone walks a static source through every
// percentage up and down: at each step identifiers move in one direction
// only, and the same percentage always gives the same sides.
func TestStaticSplitIsStickyAndMonotone(t *testing.T) {
	src := mustStatic(t, 0)
	all := ids(2000)
	sides := func() []Side {
		out := make([]Side, len(all))
		for i, id := range all {
			out[i] = src.Split().Side(id)
		}
		return out
	}
	at := map[int][]Side{}
	prev := sides()
	steps := []int{}
	for p := 1; p <= 100; p++ {
		steps = append(steps, p)
	}
	for p := 99; p >= 0; p-- {
		steps = append(steps, p)
	}
	last := 0
	for _, p := range steps {
		require.NoError(t, src.Set(p))
		cur := sides()
		for i := range cur {
			if p > last {
				require.False(t, prev[i] == SideNew && cur[i] == SideOld, "%q moved back raising to %d", all[i], p)
			} else {
				require.False(t, prev[i] == SideOld && cur[i] == SideNew, "%q moved up lowering to %d", all[i], p)
			}
		}
		if seen, ok := at[p]; ok {
			require.Equal(t, seen, cur, "sides at %d%% differ between visits", p)
		}
		at[p] = cur
		prev, last = cur, p
	}
}

// TestSplitModeRoutes: each identifier's decisions reach only its backend;
// a moved identifier starts afresh, which is what mirror mode prevents.
func TestSplitModeRoutes(t *testing.T) {
	src := mustStatic(t, 50)
	clock := throttlertest.NewManualClock(t0)
	policy := mustPolicy(t, "api", "10/min")
	oldB, newB := memorybackend.New(), memorybackend.New()
	th := testkit.Throttler(t, mustRollout(t, oldB, newB, src), throttler.WithClock(clock))
	oldV, newV := newView(oldB, clock, policy), newView(newB, clock, policy)
	ctx := context.Background()

	idOld := sideIDs(t, src.Split(), SideOld, 1)[0]
	idNew := sideIDs(t, src.Split(), SideNew, 1)[0]
	for range 3 {
		_, err := th.Allow(ctx, policy, idOld)
		require.NoError(t, err)
		_, err = th.Allow(ctx, policy, idNew)
		require.NoError(t, err)
	}
	assert.EqualValues(t, 3, oldV.peek(t, idOld).Used)
	assert.EqualValues(t, 0, newV.peek(t, idOld).Used)
	assert.EqualValues(t, 0, oldV.peek(t, idNew).Used)
	assert.EqualValues(t, 3, newV.peek(t, idNew).Used)

	require.NoError(t, src.Set(100))
	r, err := th.Allow(ctx, policy, idOld)
	require.NoError(t, err)
	assert.EqualValues(t, 4, r.Used, "split mode carries a moved identifier's window")

	// Without seeding, a moved identifier starts afresh.
	oldB, newB = memorybackend.New(), memorybackend.New()
	require.NoError(t, src.Set(50))
	th = testkit.Throttler(t, mustRollout(t, oldB, newB, src, WithSeeding(false)), throttler.WithClock(clock))
	for range 3 {
		_, err := th.Allow(ctx, policy, idOld)
		require.NoError(t, err)
	}
	require.NoError(t, src.Set(100))
	r, err = th.Allow(ctx, policy, idOld)
	require.NoError(t, err)
	assert.EqualValues(t, 1, r.Used, "without seeding a moved identifier starts a new window")
}

// TestMirrorMovedIdentifierKeepsWindow: in mirror mode an identifier moved
// mid-window finds its Used and ResetAt on the new backend, and its quota
// is not doubled.
func TestMirrorMovedIdentifierKeepsWindow(t *testing.T) {
	for _, lim := range []string{"10/min", "10/min aligned", "10/min gcra"} {
		t.Run(lim, func(t *testing.T) {
			src := mustStatic(t, 0)
			clock := throttlertest.NewManualClock(t0.Add(17 * time.Second))
			policy := mustPolicy(t, "api", lim+", 100/h")
			oldB, newB := memorybackend.New(), memorybackend.New()
			rb := mustRollout(t, oldB, newB, src, WithMode(MirrorMode))
			th := testkit.Throttler(t, rb, throttler.WithClock(clock))
			ctx := context.Background()
			const id = "user:42"

			var before throttler.Result
			for range 7 {
				r, err := th.Allow(ctx, policy, id)
				require.NoError(t, err)
				require.True(t, r.Allowed)
				before = r
				clock.Advance(time.Second)
			}
			oldPeek := newView(oldB, clock, policy).peek(t, id)
			newPeek := newView(newB, clock, policy).peek(t, id)
			assert.Equal(t, oldPeek.Limits(), newPeek.Limits(), "the new backend mirrors the old one")

			require.NoError(t, src.Set(100)) // move everything to the new backend mid-window
			require.Equal(t, SideNew, rb.Side(id))
			moved, err := th.Peek(ctx, policy, id)
			require.NoError(t, err)
			assert.Equal(t, oldPeek.Used, moved.Used)
			assert.Equal(t, oldPeek.Remaining, moved.Remaining)
			assert.True(t, oldPeek.ResetAt.Equal(moved.ResetAt), "ResetAt %v, want %v", moved.ResetAt, oldPeek.ResetAt)
			if lim != "10/min gcra" {
				assert.True(t, before.ResetAt.Equal(moved.ResetAt))
			}

			allowed := 0
			for range 10 {
				r, err := th.Allow(ctx, policy, id)
				require.NoError(t, err)
				if r.Allowed {
					allowed++
				}
			}
			assert.Equal(t, int(oldPeek.Remaining), allowed, "no doubled quota after the move")
			assert.Zero(t, rb.Stats().MirrorShortfalls)
		})
	}
}

// TestMirrorSecondaryKeepsItsOpenWindow: a secondary that already holds
// its own open fixed window, with another End than the primary's, keeps
// that End until it closes (driver.Merge never moves an open window's
// End) and takes the larger count at each write; every decision mirrored
// into it counts in MirrorDiverged, even when the merge changes nothing.
// From the window after, both stores hold the same and the count stops.
// Timeline (10/min, seeding off so that the primary keeps its own count):
//
//	t0       secondary: 9 units, End t0+60s
//	t0+10s   primary:   3 units, End t0+70s
//	t0+20s   +1: primary 4 (t0+70s); secondary stays 9 (t0+60s)   diverged 1
//	t0+30s   +1: primary 5 (t0+70s); secondary stays 9 (t0+60s)   diverged 2
//	t0+61s   +1: primary 6 (t0+70s); secondary closed, takes it   diverged 3
//	t0+62s   +1: primary 7 (t0+70s); secondary 7 (t0+70s)         diverged 3
func TestMirrorSecondaryKeepsItsOpenWindow(t *testing.T) {
	src := mustStatic(t, 0)
	clock := throttlertest.NewManualClock(t0)
	policy := mustPolicy(t, "api", "10/min")
	oldB, newB := memorybackend.New(), memorybackend.New()
	oldV, newV := newView(oldB, clock, policy), newView(newB, clock, policy)
	newV.allowN(t, "u", 9)
	clock.Set(t0.Add(10 * time.Second))
	oldV.allowN(t, "u", 3)
	rb := mustRollout(t, oldB, newB, src, WithMode(MirrorMode), WithSeeding(false))
	th := testkit.Throttler(t, rb, throttler.WithClock(clock))
	for _, c := range []struct {
		at                      time.Duration
		used, secondaryUsed     int64
		secondaryEnd            time.Duration
		mirrorDiverged, mirrors uint64
	}{
		{20 * time.Second, 4, 9, time.Minute, 1, 1},
		{30 * time.Second, 5, 9, time.Minute, 2, 2},
		{61 * time.Second, 6, 6, 70 * time.Second, 3, 3},
		{62 * time.Second, 7, 7, 70 * time.Second, 3, 4},
	} {
		clock.Set(t0.Add(c.at))
		r, err := th.Allow(context.Background(), policy, "u")
		require.NoError(t, err)
		require.True(t, r.Allowed)
		assert.EqualValues(t, c.used, r.Used, "at t0+%v", c.at)
		assert.True(t, r.ResetAt.Equal(t0.Add(70*time.Second)), "at t0+%v: ResetAt t0+%v, want the primary's t0+70s", c.at, r.ResetAt.Sub(t0))
		sec := newV.peek(t, "u")
		assert.EqualValues(t, c.secondaryUsed, sec.Used, "at t0+%v: secondary Used", c.at)
		assert.True(t, sec.ResetAt.Equal(t0.Add(c.secondaryEnd)), "at t0+%v: secondary ResetAt t0+%v, want t0+%v", c.at, sec.ResetAt.Sub(t0), c.secondaryEnd)
		st := rb.Stats()
		assert.Equal(t, c.mirrors, st.Mirrored, "at t0+%v", c.at)
		assert.Equal(t, c.mirrorDiverged, st.MirrorDiverged, "at t0+%v", c.at)
	}
}

// TestMirrorDenialConsumesNothing: when the serving backend denies, neither
// backend changes.
func TestMirrorDenialConsumesNothing(t *testing.T) {
	src := mustStatic(t, 0)
	clock := throttlertest.NewManualClock(t0)
	policy := mustPolicy(t, "api", "3/min")
	oldB, newB := memorybackend.New(), memorybackend.New()
	th := testkit.Throttler(t, mustRollout(t, oldB, newB, src, WithMode(MirrorMode)), throttler.WithClock(clock))
	ctx := context.Background()
	for i := range 6 {
		r, err := th.Allow(ctx, policy, "u")
		require.NoError(t, err)
		assert.Equal(t, i < 3, r.Allowed)
	}
	assert.EqualValues(t, 3, newView(oldB, clock, policy).peek(t, "u").Used)
	assert.EqualValues(t, 3, newView(newB, clock, policy).peek(t, "u").Used)

	// A peek through the rollout (cost 0) writes nothing anywhere.
	_, err := th.Peek(ctx, policy, "v")
	require.NoError(t, err)
	assert.Zero(t, oldB.Len()+newB.Len()-2)
}

// TestMirrorShortfall: a secondary without driver.Seeder replays the
// allowed units; when it is already fuller than the primary (state from
// before mirroring) it takes what room it has and the rest is counted.
func TestMirrorShortfall(t *testing.T) {
	src := mustStatic(t, 0)
	clock := throttlertest.NewManualClock(t0)
	policy := mustPolicy(t, "api", "10/min")
	oldB, newB := memorybackend.New(), memorybackend.New()
	newView(newB, clock, policy).allowN(t, "u", 8)
	rb := mustRollout(t, oldB, decideOnly{newB}, src, WithMode(MirrorMode), WithSeeding(false))
	th := testkit.Throttler(t, rb, throttler.WithClock(clock))

	r, err := th.AllowN(context.Background(), policy, "u", 5)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	assert.EqualValues(t, 5, newView(oldB, clock, policy).peek(t, "u").Used)
	assert.EqualValues(t, 10, newView(newB, clock, policy).peek(t, "u").Used, "the secondary is filled to its limit")
	st := rb.Stats()
	assert.EqualValues(t, 1, st.Mirrored)
	assert.EqualValues(t, 1, st.MirrorShortfalls)
	assert.EqualValues(t, 3, st.MirrorShortfallUnits)

	// Full secondary: nothing fits.
	r, err = th.AllowN(context.Background(), policy, "u", 2)
	require.NoError(t, err)
	require.True(t, r.Allowed)
	st = rb.Stats()
	assert.EqualValues(t, 2, st.MirrorShortfalls)
	assert.EqualValues(t, 5, st.MirrorShortfallUnits)
}

// TestSecondaryErrorsNeverChangeTheDecision: a failing secondary in mirror
// and shadow modes leaves every decision as the primary made it; failures
// are counted and reported with ErrSecondary.
func TestSecondaryErrorsNeverChangeTheDecision(t *testing.T) {
	for _, mode := range []Mode{MirrorMode, ShadowMode} {
		t.Run(mode.String(), func(t *testing.T) {
			clock := throttlertest.NewManualClock(t0)
			policy := mustPolicy(t, "api", "3/min")
			primary, broken := memorybackend.New(), &brokenBackend{}
			var mu sync.Mutex
			var reported []error
			rb := mustRollout(t, primary, broken, mustStatic(t, 0), WithMode(mode),
				WithSecondaryErrorHandler(func(err error) { mu.Lock(); reported = append(reported, err); mu.Unlock() }))
			th := testkit.Throttler(t, rb, throttler.WithClock(clock), throttler.WithLogger(nil))
			ctx := context.Background()
			for i := range 5 {
				r, err := th.Allow(ctx, policy, "u")
				require.NoError(t, err)
				assert.False(t, r.Degraded)
				assert.Equal(t, i < 3, r.Allowed, "decision %d", i)
			}
			_, err := th.Refund(ctx, policy, "u", 1)
			require.NoError(t, err, "a secondary refund failure is not the caller's")

			st := rb.Stats()
			// mirror: the look across for seeding (once: a failed look waits
			// a second before the next), three allowed decisions replayed
			// (the broken secondary is no Seeder) and the refund.
			want := 1 + 3 + 1
			if mode == ShadowMode {
				want = 5 + 1 // shadow: every decision and the refund
			}
			assert.EqualValues(t, want, st.SecondaryErrors)
			mu.Lock()
			defer mu.Unlock()
			require.Len(t, reported, want)
			for _, err := range reported {
				assert.ErrorIs(t, err, ErrSecondary)
				assert.ErrorIs(t, err, errInjected)
			}
		})
	}
}

// TestShadowCountsMismatchesByKind builds two memory backends with
// different histories and checks each kind of disagreement is counted, in
// both directions of the verdict, and reported to the handler.
func TestShadowCountsMismatchesByKind(t *testing.T) {
	clock := throttlertest.NewManualClock(t0)
	policy := mustPolicy(t, "api", "5/min")
	primary, shadow := memorybackend.New(), memorybackend.New()
	pv, sv := newView(primary, clock, policy), newView(shadow, clock, policy)

	// Prior state, before the rollout exists, all at t0 (the time of the
	// decisions) so that windows open together, except where a difference
	// in ResetAt is the point:
	pv.allowN(t, "same", 2) // identical histories
	sv.allowN(t, "same", 2)
	sv.allowN(t, "shadow-full", 5)  // shadow denies what primary allows
	pv.allowN(t, "primary-full", 5) // primary denies what shadow allows
	sv.allowN(t, "more-used", 2)    // both allow, Remaining differs
	sv.allowN(t, "later-window", 1) // same Used, windows opened 10 s apart
	clock.Set(t0.Add(-10 * time.Second))
	pv.allowN(t, "later-window", 1)
	clock.Set(t0)

	var mu sync.Mutex
	seen := map[string]MismatchKind{}
	rb := mustRollout(t, primary, shadow, mustStatic(t, 0), WithMode(ShadowMode),
		WithMismatchHandler(func(m Mismatch) {
			mu.Lock()
			defer mu.Unlock()
			assert.Equal(t, SideOld, m.Primary)
			assert.Len(t, m.PrimaryLimits, len(m.Request.Policy.Limits))
			seen[m.Request.Identifier] |= m.Kinds
		}))
	th := testkit.Throttler(t, rb, throttler.WithClock(clock))
	ctx := context.Background()
	verdicts := map[string]bool{}
	for _, id := range []string{"same", "shadow-full", "primary-full", "more-used", "later-window", "fresh"} {
		r, err := th.Allow(ctx, policy, id)
		require.NoError(t, err)
		verdicts[id] = r.Allowed
	}
	assert.Equal(t, map[string]bool{"same": true, "shadow-full": true, "primary-full": false,
		"more-used": true, "later-window": true, "fresh": true}, verdicts, "the primary decides")

	st := rb.Stats()
	assert.EqualValues(t, 6, st.ShadowCompared)
	assert.EqualValues(t, 4, st.ShadowMismatches)
	assert.EqualValues(t, 1, st.AllowedDenied)
	assert.EqualValues(t, 1, st.DeniedAllowed)
	assert.EqualValues(t, 3, st.RemainingDiffers) // shadow-full, primary-full, more-used
	assert.EqualValues(t, 1, st.ResetDiffers)     // later-window
	assert.Zero(t, st.SecondaryErrors)
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, map[string]MismatchKind{
		"shadow-full":  VerdictDiffers | RemainingDiffers,
		"primary-full": VerdictDiffers | RemainingDiffers,
		"more-used":    RemainingDiffers,
		"later-window": ResetDiffers,
	}, seen)
}

// TestShadowPrimaryIsTheServingSide: at 100% the new backend decides and
// the old one shadows.
func TestShadowPrimaryIsTheServingSide(t *testing.T) {
	clock := throttlertest.NewManualClock(t0)
	policy := mustPolicy(t, "api", "1/min")
	oldB, newB := memorybackend.New(), memorybackend.New()
	newView(oldB, clock, policy).allowN(t, "u", 1)
	var got Mismatch
	rb := mustRollout(t, oldB, newB, mustStatic(t, 100), WithMode(ShadowMode),
		WithMismatchHandler(func(m Mismatch) { got = m }))
	r, err := testkit.Throttler(t, rb, throttler.WithClock(clock)).Allow(context.Background(), policy, "u")
	require.NoError(t, err)
	assert.True(t, r.Allowed, "the new backend, empty, decides")
	assert.Equal(t, SideNew, got.Primary)
	// Both end full (1/min): only the verdicts differ.
	assert.Equal(t, VerdictDiffers, got.Kinds)
	assert.False(t, got.ShadowAllowed)
}

// TestOptionalInterfaces checks the forwarding of Peek, Refund, Reset and
// Ping, and their fallbacks.
func TestOptionalInterfaces(t *testing.T) {
	clock := throttlertest.NewManualClock(t0)
	policy := mustPolicy(t, "api", "10/min")
	ctx := context.Background()

	t.Run("refund goes to the serving backend in split mode", func(t *testing.T) {
		oldB, newB := memorybackend.New(), memorybackend.New()
		newView(newB, clock, policy).allowN(t, "u", 4)
		newView(oldB, clock, policy).allowN(t, "u", 4)
		th := testkit.Throttler(t, mustRollout(t, oldB, newB, mustStatic(t, 100)), throttler.WithClock(clock))
		r, err := th.Refund(ctx, policy, "u", 3)
		require.NoError(t, err)
		assert.EqualValues(t, 1, r.Used)
		assert.EqualValues(t, 4, newView(oldB, clock, policy).peek(t, "u").Used)
	})
	t.Run("refund goes to both in mirror mode", func(t *testing.T) {
		oldB, newB := memorybackend.New(), memorybackend.New()
		th := testkit.Throttler(t, mustRollout(t, oldB, newB, mustStatic(t, 0), WithMode(MirrorMode)), throttler.WithClock(clock))
		_, err := th.AllowN(ctx, policy, "u", 4)
		require.NoError(t, err)
		_, err = th.Refund(ctx, policy, "u", 3)
		require.NoError(t, err)
		assert.EqualValues(t, 1, newView(oldB, clock, policy).peek(t, "u").Used)
		assert.EqualValues(t, 1, newView(newB, clock, policy).peek(t, "u").Used)
	})
	t.Run("refund without Refunder", func(t *testing.T) {
		th := testkit.Throttler(t, mustRollout(t, decideOnly{memorybackend.New()}, memorybackend.New(), mustStatic(t, 0)),
			throttler.WithClock(clock), throttler.WithLogger(nil))
		_, err := th.Refund(ctx, policy, "u", 1)
		assert.ErrorIs(t, err, errors.ErrUnsupported)
	})
	t.Run("reset resets both", func(t *testing.T) {
		oldB, newB := memorybackend.New(), memorybackend.New()
		newView(oldB, clock, policy).allowN(t, "u", 4)
		newView(newB, clock, policy).allowN(t, "u", 4)
		th := testkit.Throttler(t, mustRollout(t, oldB, newB, mustStatic(t, 0)), throttler.WithClock(clock))
		require.NoError(t, th.Reset(ctx, policy, "u"))
		assert.EqualValues(t, 0, newView(oldB, clock, policy).peek(t, "u").Used)
		assert.EqualValues(t, 0, newView(newB, clock, policy).peek(t, "u").Used)
	})
	t.Run("reset reports either failure", func(t *testing.T) {
		oldB := memorybackend.New()
		newView(oldB, clock, policy).allowN(t, "u", 4)
		rb := mustRollout(t, oldB, &brokenBackend{}, mustStatic(t, 0))
		err := rb.Reset(ctx, testkit.Compile(t, policy), "u")
		assert.ErrorIs(t, err, errInjected)
		assert.EqualValues(t, 0, newView(oldB, clock, policy).peek(t, "u").Used, "the healthy side is reset anyway")
		err = mustRollout(t, oldB, decideOnly{memorybackend.New()}, mustStatic(t, 0)).Reset(ctx, testkit.Compile(t, policy), "u")
		assert.ErrorIs(t, err, errors.ErrUnsupported)
	})
	t.Run("peek asks only the serving backend", func(t *testing.T) {
		oldB, broken := memorybackend.New(), &brokenBackend{}
		newView(oldB, clock, policy).allowN(t, "u", 4)
		for _, mode := range []Mode{SplitMode, MirrorMode, ShadowMode} {
			th := testkit.Throttler(t, mustRollout(t, oldB, broken, mustStatic(t, 0), WithMode(mode), WithSeeding(false)), throttler.WithClock(clock))
			r, err := th.Peek(ctx, policy, "u")
			require.NoError(t, err)
			assert.False(t, r.Degraded)
			assert.EqualValues(t, 4, r.Used)
		}
		assert.Zero(t, broken.calls.Load())
	})
	t.Run("peek while seeding survives a broken other backend", func(t *testing.T) {
		oldB, broken := memorybackend.New(), &brokenBackend{}
		newView(oldB, clock, policy).allowN(t, "u", 4)
		rb := mustRollout(t, oldB, broken, mustStatic(t, 0))
		th := testkit.Throttler(t, rb, throttler.WithClock(clock))
		r, err := th.Peek(ctx, policy, "u")
		require.NoError(t, err)
		assert.False(t, r.Degraded)
		assert.EqualValues(t, 4, r.Used)
		assert.EqualValues(t, 1, rb.Stats().SecondaryErrors, "the failed look across is counted")
	})
	t.Run("ping pings both", func(t *testing.T) {
		assert.NoError(t, mustRollout(t, memorybackend.New(), decideOnly{memorybackend.New()}, mustStatic(t, 0)).Ping(ctx))
		err := mustRollout(t, memorybackend.New(), &brokenBackend{}, mustStatic(t, 0)).Ping(ctx)
		assert.ErrorIs(t, err, errInjected)
		th := testkit.Throttler(t, mustRollout(t, memorybackend.New(), &brokenBackend{}, mustStatic(t, 0)))
		assert.ErrorIs(t, th.Ping(ctx), throttler.ErrBackend)
	})
}

// TestPrimaryErrorIsReturned: the serving backend's failure is the
// throttler's to handle (failure mode, degraded result), and no secondary
// call is made.
func TestPrimaryErrorIsReturned(t *testing.T) {
	for _, mode := range []Mode{SplitMode, MirrorMode, ShadowMode} {
		secondary := memorybackend.New()
		rb := mustRollout(t, &brokenBackend{}, secondary, mustStatic(t, 0), WithMode(mode))
		_, err := rb.Decide(context.Background(), driver.Request{
			Policy: testkit.Compiled(t, "api", "1/min"), Identifier: "u", Cost: 1, Now: t0})
		assert.True(t, errors.Is(err, errInjected), "mode %s: %v", mode, err)
		assert.Zero(t, secondary.Len())
	}
}

// TestConcurrentSetAndDecide runs decisions while the percentage moves, for
// the race detector: routing reads one published split per decision.
func TestConcurrentSetAndDecide(t *testing.T) {
	src := mustStatic(t, 0)
	policy := mustPolicy(t, "api", "1000000/h")
	th := testkit.Throttler(t, mustRollout(t, memorybackend.New(), memorybackend.New(), src, WithMode(MirrorMode)),
		throttler.WithClock(throttlertest.NewManualClock(t0)))
	ctx := context.Background()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				r, err := th.Allow(ctx, policy, ids(8)[(i+w)%8])
				if err != nil || !r.Allowed || r.Degraded {
					t.Errorf("decision %d: %v %+v", i, err, r)
					return
				}
			}
		}()
	}
	for p := 0; p <= 100; p += 5 {
		require.NoError(t, src.Set(p))
	}
	close(stop)
	wg.Wait()
}

// TestDefaultSide: a source without an answer sends everything to the
// default side, counted in Stats.
func TestDefaultSide(t *testing.T) {
	oldB, newB := memorybackend.New(), memorybackend.New()
	for _, side := range []Side{SideOld, SideNew} {
		rb := mustRollout(t, oldB, newB, nilSource{}, WithDefaultSide(side))
		for _, id := range ids(50) {
			require.Equal(t, side, rb.Side(id))
		}
		_, err := rb.Decide(context.Background(), driver.Request{
			Policy: testkit.Compiled(t, "api", "1/min"), Identifier: "u", Cost: 1, Now: t0})
		require.NoError(t, err)
		assert.EqualValues(t, 1, rb.Stats().DefaultRouted)
		o, n := rb.Backends()
		assert.Same(t, oldB, o)
		assert.Same(t, newB, n)
		assert.Equal(t, SplitMode, rb.Mode())
	}
	assert.Equal(t, 1, oldB.Len())
	assert.Equal(t, 1, newB.Len())
}

func TestZeroBackendFailsWithoutPanicking(t *testing.T) {
	var b Backend
	p := mustPolicy(t, "api", "3/min")
	req := driver.Request{Policy: testkit.Compile(t, p), Identifier: "x", Cost: 1, Now: t0}
	ctx := context.Background()
	_, err := b.Decide(ctx, req)
	assert.ErrorIs(t, err, driver.ErrNotInitialized)
	_, err = b.Peek(ctx, req)
	assert.ErrorIs(t, err, driver.ErrNotInitialized)
	_, err = b.Refund(ctx, req)
	assert.ErrorIs(t, err, driver.ErrNotInitialized)
	assert.ErrorIs(t, b.Reset(ctx, testkit.Compile(t, p), "x"), driver.ErrNotInitialized)
	assert.ErrorIs(t, b.Ping(ctx), driver.ErrNotInitialized)
	assert.Equal(t, SideOld, b.Side("x"))
}

// closeCounter is a backend that counts its Close calls.
type closeCounter struct {
	driver.Backend
	closed int
	err    error
}

func (c *closeCounter) Close() error { c.closed++; return c.err }

// Close closes both backends that are Closers and joins their errors.
func TestCloseClosesBothBackends(t *testing.T) {
	errOld := errors.New("old close failed")
	oldB := &closeCounter{Backend: memorybackend.New(), err: errOld}
	newB := &closeCounter{Backend: memorybackend.New()}
	src, err := NewStaticSource(50)
	require.NoError(t, err)
	b, err := New(oldB, newB, src)
	require.NoError(t, err)
	err = b.Close()
	assert.ErrorIs(t, err, errOld)
	assert.Equal(t, 1, oldB.closed)
	assert.Equal(t, 1, newB.closed)
}
