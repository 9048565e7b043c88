package breaker_test

import (
	"context"
	"errors"
	"log/slog"
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
)

var errDown = errors.New("connection refused")

// flaky is a backend that fails while down is set and counts the calls
// that reached it.
type flaky struct {
	driver.Backend
	mu    sync.Mutex
	down  bool
	calls int
}

func (f *flaky) Decide(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	f.mu.Lock()
	f.calls++
	down := f.down
	f.mu.Unlock()
	if down {
		return driver.Outcome{}, errDown
	}
	return f.Backend.Decide(ctx, req)
}

func (f *flaky) set(down bool) {
	f.mu.Lock()
	f.down = down
	f.mu.Unlock()
}

func (f *flaky) reached() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls
}

func TestOptionsAreChecked(t *testing.T) {
	for name, opt := range map[string]breaker.Option{
		"failures": breaker.WithFailures(0),
		"failing":  breaker.WithFailingFor(-time.Millisecond),
		"open":     breaker.WithOpenFor(0),
		"log":      breaker.WithLogEvery(-time.Second),
		"nil":      nil,
	} {
		_, err := breaker.New("s", opt)
		assert.ErrorIs(t, err, driver.ErrInvalidOption, name)
		_, err = breaker.NewSet(opt)
		assert.ErrorIs(t, err, driver.ErrInvalidOption, name)
	}
	_, err := breaker.Wrap(nil, "s")
	assert.ErrorIs(t, err, driver.ErrNotInitialized)
	var zero breaker.Backend
	_, err = zero.Decide(context.Background(), driver.Request{})
	assert.ErrorIs(t, err, driver.ErrNotInitialized)
}

// The breaker opens after the configured consecutive failures, answers
// without reaching the backend while open, lets one probe through after
// the open period, and closes when the probe succeeds. The logs have one
// line per opening and closing, a count while open, and the probes at
// debug level only.
func TestOpensProbesAndCloses(t *testing.T) {
	ctx := context.Background()
	logs, logger := testkit.NewLogs()
	f := &flaky{Backend: memorybackend.New()}
	var changes []string
	var mu sync.Mutex
	b, err := breaker.Wrap(f, "store-1", breaker.WithFailures(3), breaker.WithFailingFor(0), breaker.WithOpenFor(50*time.Millisecond),
		breaker.WithLogEvery(20*time.Millisecond), breaker.WithLogger(logger),
		breaker.WithStateChange(func(server string, from, to breaker.State) {
			mu.Lock()
			changes = append(changes, server+": "+from.String()+" -> "+to.String())
			mu.Unlock()
		}))
	require.NoError(t, err)
	th := testkit.Throttler(t, b, throttler.WithLogger(nil))
	p := testkit.Policy(t, "p", "1000/min", throttler.WithFailureMode(throttler.FailClosed))

	r, err := th.Allow(ctx, p, "u")
	require.NoError(t, err)
	require.True(t, r.Allowed)

	f.set(true)
	for range 3 {
		r, err := th.Allow(ctx, p, "u")
		require.NoError(t, err)
		assert.True(t, r.Degraded)
		assert.ErrorIs(t, r.Err, errDown)
	}
	assert.Equal(t, breaker.Open, b.Breaker().State())
	reached := f.reached()
	for range 100 {
		r, err := th.Allow(ctx, p, "u")
		require.NoError(t, err)
		assert.True(t, r.Degraded)
		assert.False(t, r.Allowed, "fail closed")
		assert.ErrorIs(t, r.Err, breaker.ErrOpen)
		assert.ErrorIs(t, r.Err, throttler.ErrBackend)
		assert.Contains(t, r.Err.Error(), "store-1")
	}
	assert.Equal(t, reached, f.reached(), "an open breaker must not reach the backend")
	assert.EqualValues(t, 100, b.Breaker().Rejected())

	// A failed probe opens it again.
	time.Sleep(60 * time.Millisecond)
	r, _ = th.Allow(ctx, p, "u")
	assert.ErrorIs(t, r.Err, errDown, "the probe reaches the backend")
	assert.Equal(t, breaker.Open, b.Breaker().State())
	time.Sleep(30 * time.Millisecond)
	r, _ = th.Allow(ctx, p, "u")
	assert.ErrorIs(t, r.Err, breaker.ErrOpen)

	// The server returns: the first call after the open period probes and
	// closes the breaker.
	f.set(false)
	time.Sleep(60 * time.Millisecond)
	r, err = th.Allow(ctx, p, "u")
	require.NoError(t, err)
	assert.False(t, r.Degraded, "%v", r.Err)
	assert.Equal(t, breaker.Closed, b.Breaker().State())

	assert.Equal(t, 1, logs.Count(slog.LevelWarn, "circuit breaker opened"))
	assert.Equal(t, 1, logs.Count(slog.LevelInfo, "circuit breaker closed"))
	assert.GreaterOrEqual(t, logs.Count(slog.LevelWarn, "circuit breaker still open"), 1)
	assert.Equal(t, 2, logs.Count(slog.LevelDebug, "circuit breaker half-open"))
	assert.Equal(t, 0, logs.Count(slog.LevelInfo, "half-open"), "probes are not logged above debug")
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{
		"store-1: closed -> open", "store-1: open -> half-open", "store-1: half-open -> open",
		"store-1: open -> half-open", "store-1: half-open -> closed",
	}, changes)
}

// Answers of the store that are not outages (bad input, an unsupported
// operation) never open the breaker, and a canceled call counts neither
// way.
func TestOnlyOutagesCount(t *testing.T) {
	ctx := context.Background()
	b, err := breaker.Wrap(memorybackend.New(), "m", breaker.WithFailures(1), breaker.WithFailingFor(0), breaker.WithLogger(nil))
	require.NoError(t, err)
	for range 5 {
		_, err := b.Decide(ctx, driver.Request{}) // no policy
		assert.ErrorIs(t, err, driver.ErrInvalidPolicy)
	}
	assert.Equal(t, breaker.Closed, b.Breaker().State())

	canceled, cancel := context.WithCancel(ctx)
	cancel()
	br, err := breaker.New("c", breaker.WithFailures(1), breaker.WithFailingFor(0), breaker.WithLogger(nil))
	require.NoError(t, err)
	for range 5 {
		done, err := br.Allow()
		require.NoError(t, err)
		done(canceled.Err())
	}
	assert.Equal(t, breaker.Closed, br.State())
	done, err := br.Allow()
	require.NoError(t, err)
	done(errDown)
	assert.Equal(t, breaker.Open, br.State())
}

// A Set makes one breaker per server on first use, so that one server's
// outage leaves the others' calls alone.
func TestSetIsPerServer(t *testing.T) {
	s, err := breaker.NewSet(breaker.WithFailures(1), breaker.WithFailingFor(0), breaker.WithLogger(nil))
	require.NoError(t, err)
	a, b := s.For("10.0.0.1:6379"), s.For("10.0.0.2:6379")
	assert.Same(t, a, s.For("10.0.0.1:6379"))
	done, err := a.Allow()
	require.NoError(t, err)
	done(errDown)
	_, err = a.Allow()
	assert.ErrorIs(t, err, breaker.ErrOpen)
	done, err = b.Allow()
	require.NoError(t, err)
	done(nil)
	assert.Equal(t, []breaker.Status{
		{Server: "10.0.0.1:6379", State: breaker.Open, Rejected: 1},
		{Server: "10.0.0.2:6379", State: breaker.Closed},
	}, s.Statuses())
}

// A rejected call costs no allocation.
func TestRejectionAllocatesNothing(t *testing.T) {
	br, err := breaker.New("s", breaker.WithFailures(1), breaker.WithFailingFor(0), breaker.WithLogger(nil))
	require.NoError(t, err)
	done, _ := br.Allow()
	done(errDown)
	allocs := testing.AllocsPerRun(100, func() { _, _ = br.Allow() })
	assert.Zero(t, allocs)
}
