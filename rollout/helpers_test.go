package rollout

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// t0 is the start of every manual-clock timeline.
var t0 = time.Date(2030, 1, 2, 3, 4, 0, 0, time.UTC)

func mustPolicy(t testing.TB, name, limits string) *throttler.Policy {
	t.Helper()
	p, err := throttler.ParsePolicy(name, limits)
	require.NoError(t, err)
	return p
}

func mustStatic(t testing.TB, percent int) *StaticSource {
	t.Helper()
	s, err := NewStaticSource(percent)
	require.NoError(t, err)
	return s
}

func mustRollout(t testing.TB, oldB, newB driver.Backend, src FlagSource, opts ...Option) *Backend {
	t.Helper()
	b, err := New(oldB, newB, src, opts...)
	require.NoError(t, err)
	return b
}

// view is a throttler over one backend, for reading what that backend holds.
type view struct {
	th *throttler.Throttler
	p  *throttler.Policy
}

func newView(b driver.Backend, clock throttler.Clock, p *throttler.Policy) view {
	th, err := throttler.New(b, throttler.WithClock(clock), throttler.WithLogger(nil))
	if err != nil {
		panic(err) // the tests pass valid backends and options
	}
	return view{th: th, p: p}
}

func (v view) peek(t testing.TB, id string) throttler.Result {
	t.Helper()
	r, err := v.th.Peek(context.Background(), v.p, id)
	require.NoError(t, err)
	require.False(t, r.Degraded, "peek degraded: %v", r.Err)
	return r
}

func (v view) allowN(t testing.TB, id string, n int64) throttler.Result {
	t.Helper()
	r, err := v.th.AllowN(context.Background(), v.p, id, n)
	require.NoError(t, err)
	require.False(t, r.Degraded, "allow degraded: %v", r.Err)
	return r
}

// errInjected is the failure of brokenBackend.
var errInjected = errors.New("injected backend failure")

// brokenBackend fails every call: a fault a real server cannot be told to
// produce on demand for one call and not the next.
type brokenBackend struct{ calls atomic.Int64 }

func (b *brokenBackend) Decide(context.Context, driver.Request) (driver.Outcome, error) {
	b.calls.Add(1)
	return driver.Outcome{}, errInjected
}

func (b *brokenBackend) Refund(context.Context, driver.Request) (driver.Outcome, error) {
	b.calls.Add(1)
	return driver.Outcome{}, errInjected
}

func (b *brokenBackend) Reset(context.Context, *driver.Policy, string) error {
	b.calls.Add(1)
	return errInjected
}

func (b *brokenBackend) Ping(context.Context) error { return errInjected }

// decideOnly is a backend with Decide and nothing else, to check the
// fallbacks of the optional interfaces.
type decideOnly struct{ inner *memorybackend.Backend }

func (d decideOnly) Decide(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	return d.inner.Decide(ctx, req)
}

// nilSource is a flag source that never has an answer.
type nilSource struct{}

func (nilSource) Split() *Split { return nil }

// ids returns n distinct identifiers.
func ids(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "user:" + strconv.Itoa(i)
	}
	return out
}
