package breaker_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/breaker"
	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// seeding is a memory backend whose Seed fails while down is set, and
// counts the seeds that reached it.
type seeding struct {
	*memorybackend.Backend
	mu    sync.Mutex
	down  bool
	seeds int
}

func (s *seeding) Seed(ctx context.Context, req driver.Request, given []driver.State) (driver.Outcome, error) {
	s.mu.Lock()
	s.seeds++
	down := s.down
	s.mu.Unlock()
	if down {
		return driver.Outcome{}, errDown
	}
	return s.Backend.Seed(ctx, req, given)
}

func (s *seeding) set(down bool) {
	s.mu.Lock()
	s.down = down
	s.mu.Unlock()
}

func (s *seeding) reached() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.seeds
}

func seedPolicy(tb testing.TB) *driver.Policy {
	tb.Helper()
	l, err := driver.NewLimit("", driver.FixedWindow, 5, time.Minute, 0)
	require.NoError(tb, err)
	p, err := driver.NewPolicy("api", l)
	require.NoError(tb, err)
	return p
}

// Seed goes to the wrapped backend through the breaker, like Decide: its
// result is the wrapped backend's, its failures count towards opening, and
// an open breaker answers it without reaching the backend.
func TestSeedThroughTheBreaker(t *testing.T) {
	ctx := context.Background()
	inner := &seeding{Backend: memorybackend.New()}
	b, err := breaker.Wrap(inner, "memory", breaker.WithFailures(2), breaker.WithFailingFor(0), breaker.WithLogger(nil))
	require.NoError(t, err)
	p := seedPolicy(t)
	req := driver.Request{Policy: p, Identifier: "u", Cost: 1, Now: testkit.T0}
	given := []driver.State{{Used: 2, End: testkit.T0.Add(30 * time.Second).UnixMilli()}}

	out, err := b.Seed(ctx, req, given)
	require.NoError(t, err)
	assert.True(t, out.Allowed)
	assert.Equal(t, []driver.State{{Used: 3, End: given[0].End}}, out.States)
	assert.Equal(t, []driver.State{{}}, out.Prior)

	// Invalid states are the server's answer, not an outage.
	for range 3 {
		_, err = b.Seed(ctx, req, nil)
		require.ErrorIs(t, err, driver.ErrInvalidState)
	}
	assert.Equal(t, breaker.Closed, b.Breaker().State())

	inner.set(true)
	for range 2 {
		_, err = b.Seed(ctx, req, given)
		require.ErrorIs(t, err, errDown)
	}
	require.Equal(t, breaker.Open, b.Breaker().State(), "two failed seeds open it")
	reached := inner.reached()
	_, err = b.Seed(ctx, req, given)
	require.ErrorIs(t, err, breaker.ErrOpen)
	_, err = b.Decide(ctx, req)
	require.ErrorIs(t, err, breaker.ErrOpen, "one breaker for every call")
	assert.Equal(t, reached, inner.reached(), "an open breaker keeps seeds from the backend")
}

// A wrapped backend without Seeder makes Seed unsupported at once, whatever
// the breaker's state, and never counts against it.
func TestSeedUnsupported(t *testing.T) {
	ctx := context.Background()
	p := seedPolicy(t)
	req := driver.Request{Policy: p, Identifier: "u", Cost: 1, Now: testkit.T0}
	b, err := breaker.Wrap(decideOnly{memorybackend.New()}, "memcached-like", breaker.WithFailures(1), breaker.WithFailingFor(0), breaker.WithLogger(nil))
	require.NoError(t, err)
	for range 3 {
		_, err = b.Seed(ctx, req, []driver.State{{}})
		require.ErrorIs(t, err, errors.ErrUnsupported)
	}
	assert.Equal(t, breaker.Closed, b.Breaker().State())

	var zero breaker.Backend
	_, err = zero.Seed(ctx, req, []driver.State{{}})
	assert.ErrorIs(t, err, driver.ErrNotInitialized)
	assert.False(t, zero.Nonblocking())
}

// deadlines is a memory backend that records whether the calls it gets
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

// blocking hides the memory backend's Nonblocking.
type blocking struct{ *deadlines }

func (blocking) Nonblocking() bool { return false }

// A breaker over an in-process store is Nonblocking, so its decisions meet
// no call timeout; over a store that may block, it is not.
func TestNonblockingFollowsTheWrappedBackend(t *testing.T) {
	ctx := context.Background()
	p := testkit.Policy(t, "api", "100/min")
	for _, c := range []struct {
		name        string
		wrap        func(*deadlines) driver.Backend
		nonblocking bool
	}{
		{"memory", func(d *deadlines) driver.Backend { return d }, true},
		{"blocking", func(d *deadlines) driver.Backend { return blocking{d} }, false},
		{"no Nonblocking", func(d *deadlines) driver.Backend { return decideOnly{d} }, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			probe := &deadlines{Backend: memorybackend.New()}
			b, err := breaker.Wrap(c.wrap(probe), "s", breaker.WithLogger(nil))
			require.NoError(t, err)
			assert.Equal(t, c.nonblocking, b.Nonblocking())
			th := testkit.Throttler(t, b, throttler.WithCallTimeout(time.Hour), throttler.WithClock(throttlertest.NewManualClock(testkit.T0)))
			for range 10 {
				r, err := th.Allow(ctx, p, "u")
				require.NoError(t, err)
				require.True(t, r.Allowed)
			}
			require.Equal(t, 10, probe.calls)
			if c.nonblocking {
				assert.Zero(t, probe.bounded, "no call timeout")
			} else {
				assert.Equal(t, 10, probe.bounded, "every call bounded by the call timeout")
			}
		})
	}
}
