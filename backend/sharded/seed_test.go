package shardedbackend

import (
	"context"
	"errors"
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

// seedPolicy returns the backend's view of an unnamed fixed window of 5
// per minute and a GCRA limit of 10 per minute, as a throttler sends it.
func seedPolicy(tb testing.TB) *driver.Policy {
	tb.Helper()
	fixed, err := driver.NewLimit("", driver.FixedWindow, 5, time.Minute, 0)
	require.NoError(tb, err)
	gcra, err := driver.NewLimit("", driver.GCRA, 10, time.Minute, 0)
	require.NoError(tb, err)
	p, err := driver.NewPolicy("api", fixed, gcra)
	require.NoError(tb, err)
	return p
}

// Given states go to the primary of the identifier's shard and nowhere
// else, merged and decided there as driver.Seed does; the next decision
// for the identifier, through the sharded backend, counts them.
func TestSeedGoesToTheOwner(t *testing.T) {
	ctx := context.Background()
	stores := map[string]*memorybackend.Backend{"a": memorybackend.New(), "b": memorybackend.New(), "c": memorybackend.New()}
	var shards []Shard
	for _, name := range []string{"a", "b", "c"} {
		shards = append(shards, Shard{Name: name, Primary: stores[name]})
	}
	b, err := New(shards)
	require.NoError(t, err)
	p := seedPolicy(t)
	now := t0.Add(1500 * time.Millisecond)
	given := []driver.State{
		{Used: 3, End: t0.Add(40 * time.Second).UnixMilli()},
		{End: now.Add(30 * time.Second).UnixMicro()},
	}
	held := map[string]int{}
	for _, id := range identifiers(60) {
		req := driver.Request{Policy: p, Identifier: id, Cost: 1, Now: now}
		out, err := b.Seed(ctx, req, append([]driver.State(nil), given...))
		require.NoError(t, err, id)

		want := make([]driver.State, len(p.Limits))
		wantAllowed := driver.Seed(p, now, 1, want, given)
		assert.Equal(t, wantAllowed, out.Allowed, id)
		assert.Equal(t, want, out.States, id)
		assert.Equal(t, make([]driver.State, len(p.Limits)), out.Prior, "%s: nothing held before", id)

		owner := b.ShardFor(id)
		held[owner]++
		for name, store := range stores {
			peeked, err := store.Peek(ctx, driver.Request{Policy: p, Identifier: id, Now: now})
			require.NoError(t, err)
			if name == owner {
				assert.Equal(t, want, peeked.States, "%s on its shard %s", id, name)
			} else {
				assert.Equal(t, make([]driver.State, len(p.Limits)), peeked.States, "%s on shard %s", id, name)
			}
		}

		// A decision through the sharded backend finds the seeded window:
		// 3 given + 1 seeded + 1 = the fixed window's 5.
		dec, err := b.Decide(ctx, req)
		require.NoError(t, err)
		assert.True(t, dec.Allowed, id)
		assert.EqualValues(t, 5, dec.States[0].Used, id)
		assert.Equal(t, given[0].End, dec.States[0].End, "%s keeps the given window", id)
	}
	for name := range stores {
		assert.Positive(t, held[name], "shard %s owns no identifier", name)
	}
}

// seedFailing is a Seeder primary that fails every call.
type seedFailing struct{ decideOnly }

func (seedFailing) Seed(context.Context, driver.Request, []driver.State) (driver.Outcome, error) {
	return driver.Outcome{}, errInjected
}

// A primary without Seeder makes Seed unsupported for its identifiers; a
// primary's own failures and invalid states come back as a *ShardError
// naming the shard, with their sentinels intact.
func TestSeedErrors(t *testing.T) {
	ctx := context.Background()
	p := seedPolicy(t)
	req := driver.Request{Policy: p, Identifier: "x", Cost: 1, Now: t0}
	given := make([]driver.State, len(p.Limits))

	plain, err := New([]Shard{{Name: "a", Primary: decideOnly{memorybackend.New()}}})
	require.NoError(t, err)
	_, err = plain.Seed(ctx, req, given)
	require.ErrorIs(t, err, errors.ErrUnsupported)
	assert.Contains(t, err.Error(), `shard "a": seed`)

	down, err := New([]Shard{{Name: "down", Primary: seedFailing{decideOnly{memorybackend.New()}}}})
	require.NoError(t, err)
	_, err = down.Seed(ctx, req, given)
	require.ErrorIs(t, err, errInjected)
	var se *ShardError
	require.ErrorAs(t, err, &se)
	assert.Equal(t, ShardError{Shard: "down", Op: "seed", Err: errInjected}, *se)

	mem := newMemoryLayout(t, "a", "b")
	for _, bad := range [][]driver.State{nil, given[:1], {{Used: -1}, {}}} {
		_, err = mem.Seed(ctx, req, bad)
		require.ErrorIs(t, err, driver.ErrInvalidState)
		require.ErrorAs(t, err, &se)
		assert.Equal(t, mem.ShardFor("x"), se.Shard)
	}

	for name, zero := range map[string]*Backend{"zero": {}, "nil": nil} {
		_, err = zero.Seed(ctx, req, given)
		assert.ErrorIs(t, err, driver.ErrNotInitialized, name)
	}
}

// deadlines is a memory primary that records whether the calls it gets
// carry a deadline, that is whether the throttler gave them its call
// timeout.
type deadlines struct {
	*memorybackend.Backend
	calls, bounded int
}

func (d *deadlines) Decide(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	d.calls++
	if _, ok := ctx.Deadline(); ok {
		d.bounded++
	}
	return d.Backend.Decide(ctx, req)
}

// The Backend is Nonblocking when every primary and replica is, so a
// throttler over memory shards gives their decisions no call timeout; one
// server that may block, primary or replica, makes it blocking again.
func TestNonblockingWhenEveryServerIs(t *testing.T) {
	ctx := context.Background()
	p := mustPolicy(t, "api", "1000/min")
	probe := &deadlines{Backend: memorybackend.New()}
	for _, c := range []struct {
		name        string
		shards      []Shard
		nonblocking bool
	}{
		{"memory shards", []Shard{{Name: "a", Primary: probe}, {Name: "b", Primary: memorybackend.New()}}, true},
		{"memory replica", []Shard{{Name: "a", Primary: probe, Replicas: []driver.Peeker{memorybackend.New()}}}, true},
		{"blocking replica", []Shard{{Name: "a", Primary: probe, Replicas: []driver.Peeker{&recordingPeeker{inner: memorybackend.New()}}}}, false},
		{"blocking primary", []Shard{{Name: "a", Primary: probe}, {Name: "b", Primary: decideOnly{memorybackend.New()}}}, false},
		{"sharded over sharded", []Shard{{Name: "a", Primary: probe}, {Name: "b", Primary: newMemoryLayout(t, "x", "y")}}, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, err := New(c.shards)
			require.NoError(t, err)
			assert.Equal(t, c.nonblocking, b.Nonblocking())
			th := testkit.Throttler(t, b, throttler.WithCallTimeout(time.Hour), throttler.WithClock(throttlertest.NewManualClock(t0)))
			probe.calls, probe.bounded = 0, 0
			for _, id := range identifiers(40) {
				if b.ShardFor(id) != "a" {
					continue
				}
				r, err := th.Allow(ctx, p, id)
				require.NoError(t, err)
				require.True(t, r.Allowed)
			}
			require.Positive(t, probe.calls)
			if c.nonblocking {
				assert.Zero(t, probe.bounded, "no call timeout")
			} else {
				assert.Equal(t, probe.calls, probe.bounded, "every call bounded by the call timeout")
			}
		})
	}
	var zero *Backend
	assert.False(t, zero.Nonblocking())
	assert.False(t, (&Backend{}).Nonblocking())
}
