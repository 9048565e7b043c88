package breaker_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/breaker"
	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// trip opens br with one failed call (its set trips on one failure).
func trip(t *testing.T, br *breaker.Breaker) {
	t.Helper()
	done, err := br.Allow()
	require.NoError(t, err)
	done(errDown)
	require.Equal(t, breaker.Open, br.State())
}

// Set.SetLogger reaches the breakers made before and after it; nil logs
// nothing; an explicit WithLogger wins.
func TestSetLoggerReachesEveryBreaker(t *testing.T) {
	logs, logger := testkit.NewLogs()
	set, err := breaker.NewSet(breaker.WithFailures(1), breaker.WithFailingFor(0))
	require.NoError(t, err)
	before := set.For("before")
	set.SetLogger(logger)
	trip(t, before)
	trip(t, set.For("after"))
	assert.Equal(t, 2, logs.Count(slog.LevelWarn, "circuit breaker opened"))

	set.SetLogger(nil)
	trip(t, set.For("silent"))
	assert.Equal(t, 2, logs.Count(slog.LevelWarn, "circuit breaker opened"), "nil logs nothing")

	explicitLogs, explicit := testkit.NewLogs()
	fixed, err := breaker.NewSet(breaker.WithFailures(1), breaker.WithFailingFor(0), breaker.WithLogger(explicit))
	require.NoError(t, err)
	fixed.SetLogger(logger)
	trip(t, fixed.For("fixed"))
	assert.Equal(t, 1, explicitLogs.Count(slog.LevelWarn, "circuit breaker opened"), "WithLogger wins")
	assert.Equal(t, 2, logs.Count(slog.LevelWarn, "circuit breaker opened"))
}

// loggingBackend records the logger SetLogger gave it.
type loggingBackend struct {
	driver.Backend
	got *slog.Logger
	set bool
}

func (b *loggingBackend) SetLogger(l *slog.Logger) { b.got, b.set = l, true }

// throttler.WithLogger reaches the breaker of Wrap and, through it, the
// wrapped backend.
func TestBackendSetLoggerPassesItOn(t *testing.T) {
	logs, logger := testkit.NewLogs()
	inner := &loggingBackend{Backend: memorybackend.New()}
	b, err := breaker.Wrap(inner, "store-1", breaker.WithFailures(1), breaker.WithFailingFor(0))
	require.NoError(t, err)
	testkit.Throttler(t, b, throttler.WithLogger(logger))
	assert.True(t, inner.set, "the wrapped backend got the logger")
	assert.Same(t, logger, inner.got)
	trip(t, b.Breaker())
	assert.Equal(t, 1, logs.Count(slog.LevelWarn, "circuit breaker opened"))

	// With WithLogger, the breaker keeps its own; the wrapped backend still
	// gets the throttler's.
	inner2 := &loggingBackend{Backend: memorybackend.New()}
	b2, err := breaker.Wrap(inner2, "store-2", breaker.WithFailures(1), breaker.WithFailingFor(0), breaker.WithLogger(nil))
	require.NoError(t, err)
	b2.SetLogger(logger)
	assert.Same(t, logger, inner2.got)
	trip(t, b2.Breaker())
	assert.Equal(t, 1, logs.Count(slog.LevelWarn, "circuit breaker opened"), "WithLogger(nil) wins")

	var zero *breaker.Backend
	zero.SetLogger(logger) // no panic
}

// The messages carry the package's prefix.
func TestErrorPrefix(t *testing.T) {
	_, err := breaker.New("s", breaker.WithFailures(0))
	assert.ErrorContains(t, err, "breaker: failures 0")
	_, err = breaker.New("s", nil)
	assert.ErrorContains(t, err, "breaker: nil Option")
	b, err := breaker.Wrap(unsupported{}, "s")
	require.NoError(t, err)
	_, err = b.Refund(context.Background(), driver.Request{})
	assert.ErrorContains(t, err, "throttlekit: breaker: unsupported operation: wrapped backend cannot refund")
}

// unsupported is a backend with Decide only.
type unsupported struct{ driver.Backend }
