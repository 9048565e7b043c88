package shardedbackend

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
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

var t0 = time.Date(2030, time.January, 2, 3, 4, 0, 0, time.UTC)

// newMemoryLayout returns a Backend whose shards, named names, are memory
// backends without replicas.
func newMemoryLayout(tb testing.TB, names ...string) *Backend {
	tb.Helper()
	shards := make([]Shard, len(names))
	for i, name := range names {
		shards[i] = Shard{Name: name, Primary: memorybackend.New()}
	}
	b, err := New(shards)
	require.NoError(tb, err)
	return b
}

func mustPolicy(tb testing.TB, name, limits string, opts ...throttler.Option) *throttler.Policy {
	tb.Helper()
	p, err := throttler.ParsePolicy(name, limits, opts...)
	require.NoError(tb, err)
	return p
}

// compile returns the backend's view of p as a throttler sends it, an
// unnamed limit (one Limits shows by its notation) without a name, so that
// a test calling the backend directly reads the keys a throttler writes.
func compile(tb testing.TB, p *throttler.Policy) *driver.Policy {
	tb.Helper()
	var limits []driver.Limit
	for _, l := range p.Limits() {
		name := l.Name
		if name == l.String() {
			name = ""
		}
		dl, err := driver.NewLimit(name, l.Algorithm, l.Max, l.Window, l.Burst)
		require.NoError(tb, err)
		limits = append(limits, dl)
	}
	dp, err := driver.NewPolicy(p.Name(), limits...)
	require.NoError(tb, err)
	return dp
}

// errInjected is the failure of the fakes below: the faults a real server
// cannot produce on demand (a replica that fails or hangs on one call).
var errInjected = errors.New("injected failure")

// failing fails every operation.
type failing struct{ calls atomic.Int64 }

func (f *failing) Decide(context.Context, driver.Request) (driver.Outcome, error) {
	f.calls.Add(1)
	return driver.Outcome{}, errInjected
}

func (f *failing) Peek(context.Context, driver.Request) (driver.Outcome, error) {
	f.calls.Add(1)
	return driver.Outcome{}, errInjected
}

func (f *failing) Refund(context.Context, driver.Request) (driver.Outcome, error) {
	f.calls.Add(1)
	return driver.Outcome{}, errInjected
}

func (f *failing) Reset(context.Context, *driver.Policy, string) error {
	f.calls.Add(1)
	return errInjected
}

func (f *failing) Ping(context.Context) error { return errInjected }

// hung answers a peek only when its context is done.
type hung struct{}

func (hung) Peek(ctx context.Context, _ driver.Request) (driver.Outcome, error) {
	<-ctx.Done()
	return driver.Outcome{}, ctx.Err()
}

// recordingPeeker answers peeks from a memory backend and counts them.
type recordingPeeker struct {
	inner *memorybackend.Backend
	calls atomic.Int64
}

func (r *recordingPeeker) Peek(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	r.calls.Add(1)
	return r.inner.Decide(ctx, req)
}

// decideOnly hides every optional interface of a backend.
type decideOnly struct{ inner driver.Backend }

func (d decideOnly) Decide(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	return d.inner.Decide(ctx, req)
}

func TestNewRejectsBadLayouts(t *testing.T) {
	m := memorybackend.New()
	for _, c := range []struct {
		name   string
		shards []Shard
		want   string
	}{
		{"no shards", nil, "no shards"},
		{"empty name", []Shard{{Name: "", Primary: m}}, "empty shard name"},
		{"name with a space", []Shard{{Name: "a b", Primary: m}}, `"a b"`},
		{"name with a NUL", []Shard{{Name: "a\x00", Primary: m}}, `"a\x00"`},
		{"long name", []Shard{{Name: strings.Repeat("n", MaxNameLen+1), Primary: m}}, "longer than 64"},
		{"duplicate name", []Shard{{Name: "a", Primary: m}, {Name: "b", Primary: m}, {Name: "a", Primary: m}}, `duplicate shard name "a"`},
		{"nil primary", []Shard{{Name: "a"}}, `shard "a": nil primary`},
		{"nil replica", []Shard{{Name: "a", Primary: m, Replicas: []driver.Peeker{nil}}}, `shard "a": replica 0 is nil`},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, err := New(c.shards)
			require.ErrorIs(t, err, driver.ErrInvalidOption)
			assert.Contains(t, err.Error(), c.want)
			assert.Nil(t, b)
		})
	}
	name64 := strings.Repeat("n", MaxNameLen)
	_, err := New([]Shard{{Name: name64, Primary: m}, {Name: "A.b_c-9", Primary: m}})
	assert.NoError(t, err)
}

// TestDecideGoesToTheOwnerOnly checks that each identifier's state lives on
// exactly the shard ShardFor names, for every policy (routing ignores the
// policy).
func TestDecideGoesToTheOwnerOnly(t *testing.T) {
	ctx := context.Background()
	stores := map[string]*memorybackend.Backend{"a": memorybackend.New(), "b": memorybackend.New(), "c": memorybackend.New()}
	var shards []Shard
	for _, name := range []string{"a", "b", "c"} {
		shards = append(shards, Shard{Name: name, Primary: stores[name]})
	}
	b, err := New(shards)
	require.NoError(t, err)
	assert.Equal(t, []string{"a", "b", "c"}, b.Shards())
	th := testkit.Throttler(t, b, throttler.WithClock(throttlertest.NewManualClock(t0)))
	policies := []*throttler.Policy{mustPolicy(t, "api", "3/min"), mustPolicy(t, "search", "10/h, 1/s")}
	want := map[string]int{}
	for _, id := range identifiers(300) {
		owner := b.ShardFor(id)
		want[owner] += len(policies)
		for _, p := range policies {
			r, err := th.Allow(ctx, p, id)
			require.NoError(t, err)
			require.True(t, r.Allowed)
			require.False(t, r.Degraded)
		}
	}
	for name, store := range stores {
		assert.Equalf(t, want[name], store.Len(), "pairs held by shard %q", name)
		assert.Positivef(t, want[name], "shard %q owns no identifier", name)
	}
}

// TestFailingShardFailsOnlyItsIdentifiers uses a primary that fails every
// call: its identifiers get the policy's failure mode, with an error naming
// the shard; every other identifier keeps exact counts.
func TestFailingShardFailsOnlyItsIdentifiers(t *testing.T) {
	ctx := context.Background()
	broken := &failing{}
	b, err := New([]Shard{{Name: "a", Primary: memorybackend.New()}, {Name: "b", Primary: broken}, {Name: "c", Primary: memorybackend.New()}})
	require.NoError(t, err)
	th := testkit.Throttler(t, b, throttler.WithClock(throttlertest.NewManualClock(t0)))
	p := mustPolicy(t, "api", "5/min", throttler.WithFailureMode(throttler.FailClosed))
	degraded, exact := 0, 0
	for _, id := range identifiers(300) {
		for range 2 {
			_, err := th.Allow(ctx, p, id)
			require.NoError(t, err)
		}
		r, err := th.Allow(ctx, p, id)
		require.NoError(t, err)
		if b.ShardFor(id) == "b" {
			require.True(t, r.Degraded, id)
			require.False(t, r.Allowed, "fail closed")
			var se *ShardError
			require.ErrorAs(t, r.Err, &se)
			assert.Equal(t, "b", se.Shard)
			assert.Equal(t, "decide", se.Op)
			require.ErrorIs(t, r.Err, errInjected)
			require.ErrorIs(t, r.Err, throttler.ErrBackend)
			degraded++
			continue
		}
		require.False(t, r.Degraded, id)
		require.True(t, r.Allowed)
		require.EqualValues(t, 3, r.Used, id)
		exact++
	}
	assert.Equal(t, 300, degraded+exact)
	assert.Positive(t, degraded)
	assert.EqualValues(t, 3*degraded, broken.calls.Load())
}

func TestPeekUsesReplicasThenPrimary(t *testing.T) {
	ctx := context.Background()
	clock := throttlertest.NewManualClock(t0)
	p := mustPolicy(t, "api", "5/min")
	store := memorybackend.New()
	// Both replicas read the primary's store: what a replica in sync holds.
	r0, r1 := &recordingPeeker{inner: store}, &recordingPeeker{inner: store}

	t.Run("replicas take turns", func(t *testing.T) {
		b, err := New([]Shard{{Name: "only", Primary: store, Replicas: []driver.Peeker{r0, r1}}})
		require.NoError(t, err)
		th := testkit.Throttler(t, b, throttler.WithClock(clock))
		_, err = th.AllowN(ctx, p, "user:1", 2)
		require.NoError(t, err)
		for range 10 {
			r, err := th.Peek(ctx, p, "user:1")
			require.NoError(t, err)
			require.False(t, r.Degraded)
			require.EqualValues(t, 2, r.Used)
		}
		assert.EqualValues(t, 5, r0.calls.Load())
		assert.EqualValues(t, 5, r1.calls.Load())
	})

	t.Run("failed replica falls through", func(t *testing.T) {
		bad := &failing{}
		var reported []error
		var mu sync.Mutex
		b, err := New([]Shard{{Name: "only", Primary: store, Replicas: []driver.Peeker{bad, r0}}},
			WithReplicaErrorHandler(func(err error) { mu.Lock(); reported = append(reported, err); mu.Unlock() }))
		require.NoError(t, err)
		th := testkit.Throttler(t, b, throttler.WithClock(clock))
		before := r0.calls.Load()
		for range 4 {
			r, err := th.Peek(ctx, p, "user:1")
			require.NoError(t, err)
			require.False(t, r.Degraded)
			require.EqualValues(t, 2, r.Used)
		}
		assert.EqualValues(t, 2, bad.calls.Load(), "the failing replica is tried first every other peek")
		assert.EqualValues(t, 4, r0.calls.Load()-before)
		require.Len(t, reported, 2)
		var se *ShardError
		require.ErrorAs(t, reported[0], &se)
		assert.Equal(t, "only", se.Shard)
		assert.Contains(t, se.Error(), "replica 0")
	})

	t.Run("every replica failed: primary answers", func(t *testing.T) {
		bad0, bad1 := &failing{}, &failing{}
		b, err := New([]Shard{{Name: "only", Primary: store, Replicas: []driver.Peeker{bad0, bad1}}})
		require.NoError(t, err)
		th := testkit.Throttler(t, b, throttler.WithClock(clock))
		r, err := th.Peek(ctx, p, "user:1")
		require.NoError(t, err)
		require.False(t, r.Degraded)
		require.EqualValues(t, 2, r.Used)
		assert.EqualValues(t, 1, bad0.calls.Load())
		assert.EqualValues(t, 1, bad1.calls.Load())
	})

	t.Run("nobody answers: every error joined", func(t *testing.T) {
		b, err := New([]Shard{{Name: "only", Primary: &failing{}, Replicas: []driver.Peeker{&failing{}, &failing{}}}})
		require.NoError(t, err)
		_, err = b.Peek(ctx, driver.Request{Policy: compile(t, p), Identifier: "user:1", Now: t0})
		var se *ShardError
		require.ErrorAs(t, err, &se)
		assert.Equal(t, "peek", se.Op)
		for _, part := range []string{"replica 0", "replica 1", "primary"} {
			assert.Contains(t, err.Error(), part)
		}
		assert.ErrorIs(t, err, errInjected)
	})

	t.Run("a hung replica leaves the primary time", func(t *testing.T) {
		b, err := New([]Shard{{Name: "only", Primary: store, Replicas: []driver.Peeker{hung{}}}})
		require.NoError(t, err)
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		out, err := b.Peek(ctx, driver.Request{Policy: compile(t, p), Identifier: "user:1", Now: t0})
		require.NoError(t, err)
		assert.EqualValues(t, 2, out.States[0].Used)
	})

	t.Run("caller gone: no fallback", func(t *testing.T) {
		primary := &failing{}
		b, err := New([]Shard{{Name: "only", Primary: primary, Replicas: []driver.Peeker{hung{}}}})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err = b.Peek(ctx, driver.Request{Policy: compile(t, p), Identifier: "user:1", Now: t0})
		require.ErrorIs(t, err, context.Canceled)
		assert.Zero(t, primary.calls.Load())
	})

	t.Run("a peek never writes", func(t *testing.T) {
		fresh := memorybackend.New()
		b, err := New([]Shard{{Name: "only", Primary: decideOnly{fresh}}})
		require.NoError(t, err)
		out, err := b.Peek(ctx, driver.Request{Policy: compile(t, p), Identifier: "user:9", Cost: 3, Now: t0})
		require.NoError(t, err)
		assert.True(t, out.Allowed)
		assert.Zero(t, fresh.Len())
	})
}

func TestRefundAndResetGoToTheOwner(t *testing.T) {
	ctx := context.Background()
	b := newMemoryLayout(t, "a", "b", "c")
	th := testkit.Throttler(t, b, throttler.WithClock(throttlertest.NewManualClock(t0)))
	p := mustPolicy(t, "api", "5/min")
	for _, id := range identifiers(30) {
		_, err := th.AllowN(ctx, p, id, 3)
		require.NoError(t, err)
		r, err := th.Refund(ctx, p, id, 2)
		require.NoError(t, err)
		require.EqualValues(t, 1, r.Used)
		require.NoError(t, th.Reset(ctx, p, id))
		r, err = th.Peek(ctx, p, id)
		require.NoError(t, err)
		require.EqualValues(t, 0, r.Used)
	}
}

func TestUnsupportedOperations(t *testing.T) {
	ctx := context.Background()
	b, err := New([]Shard{{Name: "a", Primary: decideOnly{memorybackend.New()}}})
	require.NoError(t, err)
	p := mustPolicy(t, "api", "5/min")
	_, err = b.Refund(ctx, driver.Request{Policy: compile(t, p), Identifier: "x", Cost: 1, Now: t0})
	require.ErrorIs(t, err, errors.ErrUnsupported)
	assert.Contains(t, err.Error(), `shard "a": refund`)
	err = b.Reset(ctx, compile(t, p), "x")
	require.ErrorIs(t, err, errors.ErrUnsupported)
	assert.Contains(t, err.Error(), `shard "a": reset`)
	assert.NoError(t, b.Ping(ctx), "a backend without Pinger counts as reachable")
}

func TestForwardedErrorsNameTheShard(t *testing.T) {
	ctx := context.Background()
	b, err := New([]Shard{{Name: "down", Primary: &failing{}}})
	require.NoError(t, err)
	p := mustPolicy(t, "api", "5/min")
	req := driver.Request{Policy: compile(t, p), Identifier: "x", Cost: 1, Now: t0}
	_, err = b.Refund(ctx, req)
	assert.ErrorIs(t, err, errInjected)
	assert.Contains(t, err.Error(), `shard "down": refund`)
	err = b.Reset(ctx, compile(t, p), "x")
	assert.ErrorIs(t, err, errInjected)
	assert.Contains(t, err.Error(), `shard "down": reset`)
}

func TestPingJoinsEveryServersFailure(t *testing.T) {
	ctx := context.Background()
	b, err := New([]Shard{
		{Name: "a", Primary: memorybackend.New()},
		{Name: "b", Primary: &failing{}, Replicas: []driver.Peeker{&failing{}}},
		{Name: "c", Primary: memorybackend.New(), Replicas: []driver.Peeker{&recordingPeeker{}, &failing{}}},
	})
	require.NoError(t, err)
	err = b.Ping(ctx)
	require.ErrorIs(t, err, errInjected)
	msg := err.Error()
	assert.Contains(t, msg, `shard "b": ping: primary`)
	assert.Contains(t, msg, `shard "b": ping: replica 0`)
	assert.Contains(t, msg, `shard "c": ping: replica 1`)
	assert.NotContains(t, msg, `shard "a"`)
	assert.Less(t, strings.Index(msg, `shard "b"`), strings.Index(msg, `shard "c"`), "failures in shard order")

	healthy := newMemoryLayout(t, "a", "b")
	assert.NoError(t, healthy.Ping(ctx))
	th := testkit.Throttler(t, b)
	assert.ErrorIs(t, th.Ping(ctx), throttler.ErrBackend)
}

func TestCloseOfAGenericBackendDoesNothing(t *testing.T) {
	b := newMemoryLayout(t, "a")
	assert.NoError(t, b.Close())
	assert.NoError(t, b.Ping(context.Background()))
}

// TestConcurrentDecisionsAreExact runs many goroutines over a few
// identifiers spread on three memory shards: each window admits exactly
// Max requests.
func TestConcurrentDecisionsAreExact(t *testing.T) {
	ctx := context.Background()
	b := newMemoryLayout(t, "a", "b", "c")
	th := testkit.Throttler(t, b, throttler.WithClock(throttlertest.NewManualClock(t0)))
	p := mustPolicy(t, "api", "50/min")
	ids := identifiers(6)
	var allowed [6]atomic.Int64
	var wg sync.WaitGroup
	for g := range 12 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 40 {
				k := (g + i) % len(ids)
				r, err := th.Allow(ctx, p, ids[k])
				if err == nil && r.Allowed {
					allowed[k].Add(1)
				}
			}
		}()
	}
	wg.Wait()
	for k := range ids {
		assert.EqualValues(t, 50, allowed[k].Load(), ids[k])
	}
}

// A Backend no constructor built, zero or nil, fails every operation with
// driver.ErrNotInitialized, its health check included, and panics nowhere;
// a throttler returns that error instead of failing open.
func TestZeroBackendFailsWithoutPanicking(t *testing.T) {
	ctx := context.Background()
	p := mustPolicy(t, "api", "5/min")
	req := driver.Request{Policy: compile(t, p), Identifier: "x", Cost: 1, Now: t0}
	for name, b := range map[string]*Backend{"zero": {}, "nil": nil} {
		_, err := b.Decide(ctx, req)
		assert.ErrorIs(t, err, driver.ErrNotInitialized, name)
		_, err = b.Peek(ctx, req)
		assert.ErrorIs(t, err, driver.ErrNotInitialized, name)
		_, err = b.Refund(ctx, req)
		assert.ErrorIs(t, err, driver.ErrNotInitialized, name)
		assert.ErrorIs(t, b.Reset(ctx, compile(t, p), "x"), driver.ErrNotInitialized, name)
		assert.Equal(t, "", b.ShardFor("x"), name)
		assert.Empty(t, b.Shards(), name)
		assert.ErrorIs(t, b.Ping(ctx), driver.ErrNotInitialized, name, "a backend with no server is not healthy")
		assert.NoError(t, b.Close(), name)

		if b != nil {
			th := testkit.Throttler(t, b, throttler.WithClock(throttlertest.NewManualClock(t0)), throttler.WithLogger(nil))
			_, err := th.Allow(ctx, p, "x")
			assert.ErrorIs(t, err, throttler.ErrNotInitialized, name)
			assert.ErrorIs(t, th.Ping(ctx), throttler.ErrNotInitialized, name)
		} else {
			_, err := throttler.New(b)
			assert.ErrorIs(t, err, throttler.ErrNotInitialized, name)
		}
	}
}
