package legacybackend_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	legacybackend "github.com/throttlekit/throttlekit/backend/legacy"
	"github.com/throttlekit/throttlekit/internal/handwritten"
	"github.com/throttlekit/throttlekit/internal/localserver"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
)

// The way in from the hand-written limiters whose old processes do not
// report the window's end the way the new ones do: a Redis INCR+EXPIRE
// limiter (its reset is now plus the key's TTL in whole seconds, read anew
// on each request, so it wobbles by a second) and a memcached limiter that
// rounds its windows' ends down. The fleet is runDeploy's; the judge reads
// the new processes' answers for reset changes, since the old processes'
// own answers are the old code's, and every answer for grants.

// wayInRunsEnv names the environment variable that sets how many runs each
// way-in deploy test makes (1 unless set).
const wayInRunsEnv = "THROTTLEKIT_WAYIN_RUNS"

// oldKind is the kind of the old processes' answers.
const oldKind = "hand-written"

// oldSlack is how far an old Redis process's reported reset may lie from
// its window's end and still be read as that window's: the TTL's rounding
// (a second and a half at most) and the old code's round trips. Windows of
// one identifier end deployWindow (5 s) apart at least.
const oldSlack = 2 * time.Second

// wayInTally is what clients saw, summed over identifiers.
type wayInTally struct {
	requests, allowed, errors int
	byKind                    map[string]int
	// resetChanges counts the new processes' answers whose reset differs
	// from the previous new answer's without being a later window;
	// movedBack those of them that moved it back.
	resetChanges, movedBack int
	// windows counts the windows new processes reported;
	// rolledDuringOverlap those opened while old and new served together.
	windows, rolledDuringOverlap int
	// crossMoves counts consecutive answers, one of them an old
	// process's, whose resets differ by more than oldSlack without the
	// later one being a later window: what a client sees move beyond the
	// old code's own wobble when old and new processes answer it by
	// turns. Logged, not asserted: an old answer's reset also drifts by
	// the old code's round trips, which a loaded machine stretches.
	crossMoves int
	// longer counts the new answers' windows that end exactly a window
	// and a second after the previous one, both whole seconds: a window
	// opened in the second after the previous one ended and rounded up.
	// Logged: with every opener rounding down it is 0 unless no request
	// came in that second.
	longer int
	// unanchored counts allowed old answers near no window end a new
	// process reported (windows only old processes served); they are
	// grouped among themselves.
	unanchored int
	// overQuota counts windows that granted more than deployMax, and
	// overGranted the units above it.
	overQuota, overGranted int
}

// judge reads one client's answers in order. A new answer whose reset
// differs from the previous new answer's is a later window when it ends
// at least minGap after it (the window's length, less the second a
// rounding down may take off), and a reset change otherwise. Grants are
// counted per window: a new answer's window is its reset; an old answer's
// is the window end a new answer reported within oldSlack of its reset,
// or, when there is none, a group of old answers whose resets lie within
// oldSlack of each other.
func (tl *wayInTally) judge(answers []answer, overlapFrom, overlapTo time.Time, minGap time.Duration) {
	var prev int64
	ends := map[int64]bool{}
	for _, a := range answers {
		tl.requests++
		tl.byKind[a.kind]++
		if a.err != nil {
			tl.errors++
			continue
		}
		if a.allowed {
			tl.allowed++
		}
		if a.kind == oldKind {
			continue
		}
		ends[a.resetMs] = true
		switch {
		case a.resetMs == prev:
		case prev == 0 || a.resetMs >= prev+minGap.Milliseconds():
			if prev%1000 == 0 && a.resetMs == prev+deployWindow.Milliseconds()+1000 {
				tl.longer++
			}
			opened := time.UnixMilli(a.resetMs - deployWindow.Milliseconds())
			if opened.After(overlapFrom) && opened.Before(overlapTo) {
				tl.rolledDuringOverlap++
			}
		case a.resetMs < prev:
			tl.resetChanges++
			tl.movedBack++
		default:
			tl.resetChanges++
		}
		prev = a.resetMs
	}
	tl.windows += len(ends)
	var last *answer
	for i := range answers {
		a := &answers[i]
		if a.err != nil {
			continue
		}
		if last != nil && (a.kind == oldKind || last.kind == oldKind) &&
			abs(a.resetMs-last.resetMs) > oldSlack.Milliseconds() && a.resetMs < last.resetMs+(minGap-oldSlack).Milliseconds() {
			tl.crossMoves++
		}
		last = a
	}
	sorted := make([]int64, 0, len(ends))
	for e := range ends {
		sorted = append(sorted, e)
	}
	sort.Slice(sorted, func(i, j int) bool { return sorted[i] < sorted[j] })
	nearest := func(reset int64) (int64, bool) {
		i := sort.Search(len(sorted), func(i int) bool { return sorted[i] >= reset })
		best, found := int64(0), false
		for _, j := range []int{i - 1, i} {
			if j < 0 || j >= len(sorted) {
				continue
			}
			if d := abs(sorted[j] - reset); d <= oldSlack.Milliseconds() && (!found || d < abs(best-reset)) {
				best, found = sorted[j], true
			}
		}
		return best, found
	}
	grants := map[int64]int{}
	var loose []int64
	for _, a := range answers {
		if a.err != nil {
			continue
		}
		window := a.resetMs
		if a.kind == oldKind {
			e, ok := nearest(a.resetMs)
			if !ok {
				if a.allowed {
					tl.unanchored++
					loose = append(loose, a.resetMs)
				}
				continue
			}
			window = e
		}
		if a.allowed {
			grants[window]++
		}
	}
	// Windows only old processes served: group their resets.
	sort.Slice(loose, func(i, j int) bool { return loose[i] < loose[j] })
	for i := 0; i < len(loose); {
		j := i + 1
		for j < len(loose) && loose[j]-loose[j-1] <= oldSlack.Milliseconds() {
			j++
		}
		// A key no window end can be: below every real one.
		grants[-int64(i)-1] += j - i
		i = j
	}
	for _, n := range grants {
		if n > deployMax {
			tl.overQuota++
			tl.overGranted += n - deployMax
		}
	}
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

// judgeWayIn judges every client's answers and logs the figures.
func judgeWayIn(t *testing.T, answers [][]answer, overlapFrom, overlapTo time.Time, minGap time.Duration) wayInTally {
	tl := wayInTally{byKind: map[string]int{}}
	for _, a := range answers {
		tl.judge(a, overlapFrom, overlapTo, minGap)
	}
	kinds := make([]string, 0, len(tl.byKind))
	for k, n := range tl.byKind {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
	}
	sort.Strings(kinds)
	t.Logf("%d requests (%s), %d allowed, %d errors; %d windows, %d opened during the %v overlap, %d a second longer; new processes: %d reset changes (%d moved back); moves beyond %v between an old answer and the next: %d; %d windows over quota (+%d); %d allowed old answers near no new window",
		tl.requests, strings.Join(kinds, ", "), tl.allowed, tl.errors, tl.windows, tl.rolledDuringOverlap, overlapTo.Sub(overlapFrom).Round(time.Second), tl.longer,
		tl.resetChanges, tl.movedBack, oldSlack, tl.crossMoves, tl.overQuota, tl.overGranted, tl.unanchored)
	return tl
}

// requireWayIn checks what a way in must show: no errors, no mirror write
// lost, no reset change in new processes' answers, no window over quota,
// windows rolling over during the overlap, and denials.
func requireWayIn(t *testing.T, tl wayInTally, secondary int64) {
	t.Helper()
	require.Zero(t, tl.errors, "errors")
	require.Zero(t, secondary, "mirror writes lost")
	require.Zero(t, tl.resetChanges, "reset changes in new processes' answers")
	require.Zero(t, tl.overQuota, "windows over quota")
	require.Greater(t, tl.rolledDuringOverlap, deployClients, "windows must roll over during the overlap")
	require.Greater(t, tl.requests-tl.allowed, 0, "some requests must be denied for quotas to be tested")
}

// legacyRedisClient returns a client of addr closed at the end of the test.
func legacyRedisClient(t *testing.T, addr string) *goredis.Client {
	c := goredis.NewClient(&goredis.Options{Addr: addr, ReadTimeout: deployTimeout, WriteTimeout: deployTimeout})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// handwrittenRedisProcess returns an old process: the hand-written Redis
// limiter (INCR, EXPIRE on the first hit, reset = now + TTL) counting under
// key in the Redis at addr.
func handwrittenRedisProcess(t *testing.T, addr string, key legacybackend.KeyFunc) *process {
	l := &handwritten.RedisLimiter{Client: legacyRedisClient(t, addr), Limit: deployMax, Window: deployWindow,
		Key: func(id string) string { return key("", id) }}
	return &process{kind: oldKind, serve: func(id string) answer {
		d, err := l.Allow(context.Background(), time.Now(), id)
		return answer{allowed: d.Allowed, resetMs: d.Reset * 1000, err: err, kind: oldKind}
	}}
}

// From a hand-written Redis INCR+EXPIRE limiter to Redis groups: old
// processes run the hand-written code; new ones decide in the legacy
// counters (a Deciding Redis: INCRBY, PEXPIRE on opening, the window's end
// read with PEXPIRETIME) with the groups written alongside (mirror mode at
// 0 %), then the groups decide (100 %), then the groups alone.
func TestRollingDeployFromHandwrittenRedisLimiter(t *testing.T) {
	localserver.SkipIfShort(t)
	t.Parallel()
	for run := range testkit.Count(t, wayInRunsEnv, 1) {
		t.Run(fmt.Sprintf("run %d", run+1), func(t *testing.T) {
			servers := startDeployServers(t)
			legacy := localserver.RedisT(t, localserver.RedisOptions{})
			prefix := freshPrefix()
			p, err := throttler.ParsePolicy("api", fmt.Sprintf("%d/%v", deployMax, deployWindow))
			require.NoError(t, err)
			key := func(_, id string) string { return "rl:" + id }
			var (
				secondary atomic.Int64
				mu        sync.Mutex
				olds      []*legacybackend.Redis
			)
			answers, from, to := runFleet(t, deployScenario{
				old: func(t *testing.T) *process { return handwrittenRedisProcess(t, legacy.Addr(), key) },
				mirror: func(t *testing.T) *process {
					old, err := legacybackend.NewRedis(legacyRedisClient(t, legacy.Addr()), legacybackend.Deciding(),
						legacybackend.WithWindow(deployWindow), legacybackend.WithKeyFunc(key))
					require.NoError(t, err)
					mu.Lock()
					olds = append(olds, old)
					mu.Unlock()
					return mirrored(t, old, openGroups(t, servers, prefix), p, &secondary, func() string {
						s := old.Stats()
						return fmt.Sprintf("legacy: decided %d, opened %d, seeded %d, unmatched %d", s.Decided, s.Opened, s.Seeded, s.Unmatched)
					})
				},
				final: func(t *testing.T) *process {
					return throttled(t, "redis", openGroups(t, servers, prefix), p)
				},
			})
			tl := judgeWayIn(t, answers, from, to, deployWindow)
			requireWayIn(t, tl, secondary.Load())
			var decided uint64
			for _, old := range olds {
				decided += old.Stats().Decided
			}
			require.Positive(t, decided, "new processes decided in the legacy counters")
		})
	}
}

// From a hand-written memcached limiter that rounds its windows' ends down
// (now.Unix() + window) to Redis groups, through a Deciding Memcached told
// so (WithResetRounding(RoundDown)). A window rounded down may last up to
// a second less than the window, so a later window may end that much less
// than a window after the previous one.
func TestRollingDeployFromRoundingDownLimiter(t *testing.T) {
	localserver.SkipIfShort(t)
	t.Parallel()
	for run := range testkit.Count(t, wayInRunsEnv, 1) {
		t.Run(fmt.Sprintf("run %d", run+1), func(t *testing.T) {
			servers := startDeployServers(t)
			prefix := freshPrefix()
			p, err := throttler.ParsePolicy("api", fmt.Sprintf("%d/%v", deployMax, deployWindow))
			require.NoError(t, err)
			key := func(_, id string) string { return prefix + "rl:" + id }
			var (
				secondary atomic.Int64
				mu        sync.Mutex
				olds      []*legacybackend.Memcached
			)
			answers, from, to := runFleet(t, deployScenario{
				old: func(t *testing.T) *process { return handwrittenRounding(t, servers, key, true) },
				mirror: func(t *testing.T) *process {
					old, err := legacybackend.NewMemcached(memcacheClient(t, servers.memcached), deployWindow,
						legacybackend.Deciding(), legacybackend.WithKeyFunc(key), legacybackend.WithResetRounding(legacybackend.RoundDown))
					require.NoError(t, err)
					mu.Lock()
					olds = append(olds, old)
					mu.Unlock()
					return mirrored(t, old, openGroups(t, servers, prefix), p, &secondary, func() string {
						s := old.Stats()
						return fmt.Sprintf("legacy: decided %d, opened %d, seeded %d, contended %d, rounding checked %d, mismatched %d",
							s.Decided, s.Opened, s.Seeded, s.Contended, s.RoundingChecked, s.RoundingMismatched)
					})
				},
				final: func(t *testing.T) *process {
					return throttled(t, "redis", openGroups(t, servers, prefix), p)
				},
			})
			tl := judgeWayIn(t, answers, from, to, deployWindow-time.Second)
			requireWayIn(t, tl, secondary.Load())
			var st legacybackend.Stats
			for _, old := range olds {
				s := old.Stats()
				st.RoundingChecked += s.RoundingChecked
				st.RoundingMismatched += s.RoundingMismatched
			}
			require.Positive(t, st.RoundingChecked, "the rounding check saw the old code's windows")
			require.Zero(t, st.RoundingMismatched, "the rounding configured is the old code's")
		})
	}
}

// The judge counts what it must: a new answer's reset moving within a
// window, in either direction, and grants above the quota in a window
// whatever kind of process granted them; it leaves the old processes'
// own wobble alone.
func TestWayInJudge(t *testing.T) {
	const e = int64(1_900_000_005_000)
	w := deployWindow.Milliseconds()
	from, to := time.UnixMilli(e-2*w), time.UnixMilli(e+2*w)
	judge := func(answers []answer) wayInTally {
		tl := wayInTally{byKind: map[string]int{}}
		tl.judge(answers, from, to, deployWindow)
		return tl
	}
	many := func(kind string, reset int64, n int, allowed bool) []answer {
		out := make([]answer, n)
		for i := range out {
			out[i] = answer{allowed: allowed, resetMs: reset, kind: kind}
		}
		return out
	}
	cat := func(parts ...[]answer) []answer {
		var out []answer
		for _, p := range parts {
			out = append(out, p...)
		}
		return out
	}

	// Old answers wobbling around the window new answers show, a full
	// quota, then the next window: nothing to report.
	tl := judge(cat(many(oldKind, e-1000, 5, true), many("mirror", e, 10, true), many(oldKind, e+300, 5, true),
		many("mirror", e, 3, false), many("mirror", e+w+200, 1, true)))
	require.Zero(t, tl.resetChanges)
	require.Zero(t, tl.overQuota)
	require.Equal(t, 2, tl.windows)

	// An old answer far from the window around it moves it for the client.
	tl = judge(cat(many("mirror", e, 2, true), many(oldKind, e-2500, 1, true), many("mirror", e, 1, true)))
	require.Zero(t, tl.resetChanges)
	require.Equal(t, 2, tl.crossMoves)

	// A new answer moved forward, then back.
	tl = judge(cat(many("mirror", e, 2, true), many("mirror", e+1000, 1, true), many("mirror", e, 1, true)))
	require.Equal(t, 2, tl.resetChanges)
	require.Equal(t, 1, tl.movedBack)

	// One grant too many, by an old process near the window's end.
	tl = judge(cat(many("mirror", e, deployMax, true), many(oldKind, e-1500, 1, true)))
	require.Equal(t, 1, tl.overQuota)
	require.Equal(t, 1, tl.overGranted)

	// Windows only old processes served are grouped among themselves.
	tl = judge(cat(many(oldKind, e-3*w, deployMax/2, true), many(oldKind, e-3*w+1000, deployMax/2+1, true),
		many(oldKind, e-2*w, deployMax, true), many("mirror", e, 1, true)))
	require.Equal(t, 1, tl.overQuota)
	require.Equal(t, 2*deployMax+1, tl.unanchored)
}
