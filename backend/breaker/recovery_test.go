package breaker_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/breaker"
	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// A burst of failures, however many, does not open a breaker while the run
// is younger than WithFailingFor; a run that lasts it does, and a success
// starts the count again.
func TestTripNeedsAFailingPeriod(t *testing.T) {
	const period = 50 * time.Millisecond
	br, err := breaker.New("s", breaker.WithFailures(3), breaker.WithFailingFor(period), breaker.WithLogger(nil))
	require.NoError(t, err)
	fail := func() {
		done, err := br.Allow()
		require.NoError(t, err)
		done(errDown)
	}
	start := time.Now()
	for range 20 {
		fail()
	}
	if time.Since(start) < period { // a loaded machine may take longer
		assert.Equal(t, breaker.Closed, br.State(), "a burst of failures opened the breaker")
	}
	done, err := br.Allow()
	require.NoError(t, err)
	done(nil) // a success ends the run

	first := time.Now()
	for i := 0; br.State() == breaker.Closed; i++ {
		require.Less(t, i, 10_000, "a run of failures lasting %v never opened the breaker", period)
		fail()
		time.Sleep(time.Millisecond)
	}
	assert.GreaterOrEqual(t, time.Since(first), period, "opened before the run lasted its period")
}

// The drains run when the breaker opens and again before each probe,
// never while it is closed.
func TestDrainsRunOnOpenAndBeforeProbe(t *testing.T) {
	br, err := breaker.New("s", breaker.WithFailures(1), breaker.WithFailingFor(0),
		breaker.WithOpenFor(20*time.Millisecond), breaker.WithLogger(nil))
	require.NoError(t, err)
	var drains atomic.Int64
	br.AddDrain(func() { drains.Add(1) })
	br.AddDrain(nil) // ignored

	done, err := br.Allow()
	require.NoError(t, err)
	done(nil)
	assert.Zero(t, drains.Load())

	done, err = br.Allow()
	require.NoError(t, err)
	done(errDown)
	require.Equal(t, breaker.Open, br.State())
	assert.EqualValues(t, 1, drains.Load(), "drained when it opened")

	// The probe: drained before it goes out.
	var probe func(error)
	for i := 0; probe == nil; i++ {
		require.Less(t, i, 10_000, "no probe let through")
		probe, _ = br.Allow()
		time.Sleep(time.Millisecond)
	}
	assert.EqualValues(t, 2, drains.Load(), "drained before the probe")
	probe(nil)
	assert.Equal(t, breaker.Closed, br.State())
	assert.EqualValues(t, 2, drains.Load())
}

// idler is a backend with idle connections to close.
type idler struct {
	driver.Backend
	closed atomic.Int64
}

func (i *idler) CloseIdleConnections() { i.closed.Add(1) }

// Wrap closes the idle connections of an IdleCloser when its breaker opens.
func TestWrapClosesIdleConnections(t *testing.T) {
	inner := &idler{Backend: &flaky{Backend: memorybackend.New(), down: true}}
	b, err := breaker.Wrap(inner, "s", breaker.WithFailures(1), breaker.WithFailingFor(0), breaker.WithLogger(nil))
	require.NoError(t, err)
	p := testkit.Policy(t, "p", "10/min")
	_, err = b.Decide(context.Background(), driver.Request{Policy: testkit.Compile(t, p), Identifier: "u", Cost: 1, Now: testkit.T0})
	require.ErrorIs(t, err, errDown)
	assert.Equal(t, breaker.Open, b.Breaker().State())
	assert.EqualValues(t, 1, inner.closed.Load())
}
