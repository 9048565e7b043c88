package slogobserver_test

import (
	"context"
	"log/slog"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
	slogobserver "github.com/throttlekit/throttlekit/observe/slog"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

type traceKey struct{}

// record is one logged line with the trace ID its context carried.
type record struct {
	level slog.Level
	msg   string
	trace string
	attrs map[string]string
}

// traceHandler records lines and the trace ID of each line's context, as a
// tracing bridge would read it.
type traceHandler struct {
	mu    *sync.Mutex
	lines *[]record
	level slog.Level
}

func (h traceHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level }
func (h traceHandler) WithAttrs([]slog.Attr) slog.Handler           { return h }
func (h traceHandler) WithGroup(string) slog.Handler                { return h }
func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	rec := record{level: r.Level, msg: r.Message, attrs: map[string]string{}}
	rec.trace, _ = ctx.Value(traceKey{}).(string)
	r.Attrs(func(a slog.Attr) bool {
		rec.attrs[a.Key] = a.Value.String()
		return true
	})
	h.mu.Lock()
	*h.lines = append(*h.lines, rec)
	h.mu.Unlock()
	return nil
}

type down struct{}

func (down) Decide(context.Context, driver.Request) (driver.Outcome, error) {
	return driver.Outcome{}, syscall.ECONNREFUSED
}

// TestLinesCarryTheRequestContext: a denial is logged at Info with the
// request's context (its trace ID reaches the handler); allowed decisions
// are not logged at Info; failed calls are left to the throttler's outage
// log.
func TestLinesCarryTheRequestContext(t *testing.T) {
	var lines []record
	h := traceHandler{mu: new(sync.Mutex), lines: &lines, level: slog.LevelInfo}
	obs := slogobserver.New(slog.New(h))
	_, clock := testkit.Clock()
	th := testkit.Throttler(t, memorybackend.New(), clock, throttler.WithObserver(obs))
	failing := testkit.Throttler(t, down{}, clock, throttler.WithObserver(obs), throttler.WithLogger(nil))
	p := testkit.Policy(t, "api", "2/min")
	ctx := context.WithValue(context.Background(), traceKey{}, "trace-4bf92f35")
	for range 3 {
		_, err := th.Allow(ctx, p, "alice")
		require.NoError(t, err)
	}
	for range 5 {
		_, err := failing.Allow(ctx, p, "bob")
		require.NoError(t, err)
	}
	require.Len(t, lines, 1, "one denial; allowed and failed decisions below Info")
	l := lines[0]
	assert.Equal(t, slog.LevelInfo, l.level)
	assert.Equal(t, "throttlekit: denied", l.msg)
	assert.Equal(t, "trace-4bf92f35", l.trace, "the line was logged with the caller's context")
	assert.Equal(t, "alice", l.attrs["identifier"])
	assert.Equal(t, "api", l.attrs["policy"])
	assert.Equal(t, "2/min", l.attrs["limit"])
	assert.Equal(t, "denied", l.attrs["outcome"])
	assert.Equal(t, "0", l.attrs["remaining"])
	assert.NotEmpty(t, l.attrs["retry_after"])
}

// TestDebugAndWithoutIdentifier: at Debug every operation is logged, a
// failure with its kind, and WithoutIdentifier leaves identifiers out.
func TestDebugAndWithoutIdentifier(t *testing.T) {
	var lines []record
	h := traceHandler{mu: new(sync.Mutex), lines: &lines, level: slog.LevelDebug}
	obs := slogobserver.New(slog.New(h), slogobserver.WithoutIdentifier())
	_, clock := testkit.Clock()
	th := testkit.Throttler(t, memorybackend.New(), clock, throttler.WithObserver(obs))
	failing := testkit.Throttler(t, down{}, clock, throttler.WithObserver(obs), throttler.WithLogger(nil))
	p := testkit.Policy(t, "api", "2/min")
	ctx := context.Background()
	_, err := th.Allow(ctx, p, "alice")
	require.NoError(t, err)
	require.NoError(t, th.Reset(ctx, p, "alice"))
	_, err = failing.Allow(ctx, p, "bob")
	require.NoError(t, err)
	require.Len(t, lines, 3)
	assert.Equal(t, "throttlekit: allow", lines[0].msg)
	assert.Equal(t, "allowed", lines[0].attrs["outcome"])
	assert.Equal(t, "throttlekit: reset", lines[1].msg)
	assert.Equal(t, "throttlekit: allow failed", lines[2].msg)
	assert.Equal(t, "unreachable", lines[2].attrs["error_kind"])
	assert.Equal(t, "degraded_allowed", lines[2].attrs["outcome"])
	for _, l := range lines {
		assert.NotContains(t, l.attrs, "identifier")
		assert.Equal(t, slog.LevelDebug, l.level)
	}
}
