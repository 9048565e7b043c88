package redisbackend_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/internal/redislayout2"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// TestLayout2BesideCountsWithTheOldRelease runs a timeline in which a
// process of the release before layout 3 (its frozen decide script, under
// key layout 1 or 2) and a process of Layout2Beside decide for one
// identifier in turn, then, once the old process is gone, a process of
// rollout.Upgrade from the old layout to the backend joins: each sees every
// unit the others granted, in one window whose end never moves, and the
// fifth request of a quota of 4 is denied whoever asks. (The backend alone
// would miss the old process's last unit, which only the old string holds.)
func TestLayout2BesideCountsWithTheOldRelease(t *testing.T) {
	for _, keyLayout := range []int{1, 2} {
		t.Run(fmt.Sprintf("key layout %d", keyLayout), func(t *testing.T) {
			ctx := context.Background()
			client := newClient(t, standalone(t).primary.Addr())
			prefix := newPrefix()
			b := mustBackend(t, client, redisbackend.WithPrefix(prefix))
			beside, err := b.Layout2Beside(keyLayout)
			require.NoError(t, err)
			clock := throttlertest.NewManualClock(testkit.T0)
			p := mustPolicy(t, "api", "4/min")
			compiled := testkit.Compile(t, p)
			var old driver.Backend = redislayout2.New(client, prefix)
			oldKey := prefix + "{u}:api::fixed:60000"
			from := b.Layout2()
			if keyLayout == 1 {
				old = rollout.KeyLayoutV1(old)
				oldKey = prefix + "{u}:api:4%2Fmin:fixed:60000"
				from = rollout.KeyLayoutV1(from)
			}
			upgrade, err := rollout.Upgrade(from, b)
			require.NoError(t, err)
			end := testkit.T0.Add(time.Minute).UnixMilli()
			for i, step := range []struct {
				who     string
				b       driver.Backend
				allowed bool
			}{
				{"old", old, true},
				{"beside", beside, true},
				{"old", old, true},
				{"upgrade", upgrade, true}, // the old process has stopped
				{"beside", beside, false},
				{"upgrade", upgrade, false},
			} {
				th := testkit.Throttler(t, step.b, throttler.WithClock(clock), throttler.WithLogger(nil),
					throttler.WithCallTimeout(5*time.Second))
				r, err := th.Allow(ctx, p, "u")
				require.NoError(t, err)
				require.False(t, r.Degraded, "%v", r.Err)
				assert.Equal(t, step.allowed, r.Allowed, "step %d (%s)", i, step.who)
				assert.Equal(t, end, r.ResetAt.UnixMilli(), "step %d (%s)", i, step.who)
				clock.Advance(time.Second)
			}
			// The old string holds the units of the old process and of
			// Layout2Beside; the hash every unit.
			held, err := client.Get(ctx, oldKey).Result()
			require.NoError(t, err)
			assert.Equal(t, fmt.Sprintf("3:%d", end), held)
			fields, err := client.HGetAll(ctx, b.Key(compiled, "u")).Result()
			require.NoError(t, err)
			assert.Equal(t, "4", fields["u:fixed:60000"])
			assert.Equal(t, fmt.Sprint(end), fields["e:fixed:60000"])
			// Neither a peek nor a denial writes.
			out, err := beside.(driver.Peeker).Peek(ctx, driver.Request{Policy: compiled, Identifier: "u", Now: clock.Now()})
			require.NoError(t, err)
			assert.Equal(t, driver.State{Used: 4, End: end}, out.States[0])
			again, err := client.Get(ctx, oldKey).Result()
			require.NoError(t, err)
			assert.Equal(t, held, again)

			require.NoError(t, beside.(driver.Resetter).Reset(ctx, compiled, "u"))
			n, err := client.Exists(ctx, oldKey, b.Key(compiled, "u")).Result()
			require.NoError(t, err)
			assert.Zero(t, n, "Reset leaves no key of either layout")
		})
	}
}

func TestLayout2BesideRefusesWhatItCannotDo(t *testing.T) {
	ctx := context.Background()
	b := mustBackend(t, newClient(t, standalone(t).primary.Addr()), redisbackend.WithPrefix(newPrefix()))
	for _, bad := range []int{0, 3, -1} {
		_, err := b.Layout2Beside(bad)
		assert.ErrorIs(t, err, driver.ErrInvalidOption, "key layout %d", bad)
	}
	beside, err := b.Layout2Beside(2)
	require.NoError(t, err)
	compiled := testkit.Compile(t, mustPolicy(t, "api", "3/min"))
	req := driver.Request{Policy: compiled, Identifier: "u", Cost: 1, Now: testkit.T0}
	_, err = beside.(driver.Refunder).Refund(ctx, req)
	assert.ErrorIs(t, err, errors.ErrUnsupported)

	// A string the old layout could not have written is a foreign value,
	// and nothing is written.
	client := newClient(t, standalone(t).primary.Addr())
	prefix := newPrefix()
	b = mustBackend(t, client, redisbackend.WithPrefix(prefix))
	beside, err = b.Layout2Beside(2)
	require.NoError(t, err)
	require.NoError(t, client.Set(ctx, b.Layout2Keys(compiled, "u")[0], "not a window", 0).Err())
	_, err = beside.Decide(ctx, req)
	assert.ErrorIs(t, err, redisbackend.ErrForeignValue)
	n, err := client.Exists(ctx, b.Key(compiled, "u")).Result()
	require.NoError(t, err)
	assert.Zero(t, n)

	// A take grants what fits, through peeks and decisions on both layouts.
	out, err := beside.(driver.Taker).Take(ctx, driver.Request{Policy: compiled, Identifier: "w", Cost: 5, Now: testkit.T0})
	require.NoError(t, err)
	assert.Equal(t, int64(3), out.Granted)
}

// TestLayout2BesideMatchesOneStore alternates an old process (the frozen
// layout-2 script) and Layout2Beside on one identifier, for every
// algorithm, through windows that open, fill and roll over, and requires
// every result to be the one a single memory store gives for the same
// sequence.
func TestLayout2BesideMatchesOneStore(t *testing.T) {
	for _, limits := range []string{"4/min", "4/min aligned", "4/min gcra", "4/min sliding", "3/10s, 6/min gcra burst=4"} {
		t.Run(limits, func(t *testing.T) {
			ctx := context.Background()
			client := newClient(t, standalone(t).primary.Addr())
			prefix := newPrefix()
			b := mustBackend(t, client, redisbackend.WithPrefix(prefix))
			beside, err := b.Layout2Beside(2)
			require.NoError(t, err)
			clock := throttlertest.NewManualClock(testkit.T0)
			p := mustPolicy(t, "api", limits)
			opts := []throttler.Option{throttler.WithClock(clock), throttler.WithLogger(nil), throttler.WithCallTimeout(5 * time.Second)}
			procs := []*throttler.Throttler{
				testkit.Throttler(t, redislayout2.New(client, prefix), opts...),
				testkit.Throttler(t, beside, opts...),
			}
			model := testkit.Throttler(t, memorybackend.New(), opts...)
			for step := range 40 {
				want, err := model.Allow(ctx, p, "u")
				require.NoError(t, err)
				got, err := procs[step%3%2].Allow(ctx, p, "u") // old, beside, old, old, beside, old...
				require.NoError(t, err)
				require.False(t, got.Degraded, "%v", got.Err)
				require.Equal(t, want.Allowed, got.Allowed, "step %d", step)
				require.Equal(t, want.Remaining, got.Remaining, "step %d", step)
				require.Equal(t, want.ResetAt, got.ResetAt, "step %d", step)
				clock.Advance(4300 * time.Millisecond)
			}
		})
	}
}
