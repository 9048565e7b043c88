package throttler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// lines is a slog.Handler that keeps each record's message and
// attributes. (internal/testkit has one too, but it imports this package.)
type lines struct {
	mu  sync.Mutex
	out []string
}

func (l *lines) Enabled(context.Context, slog.Level) bool { return true }
func (l *lines) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *lines) WithGroup(string) slog.Handler            { return l }
func (l *lines) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s", a); return true })
	l.mu.Lock()
	l.out = append(l.out, b.String())
	l.mu.Unlock()
	return nil
}

func (l *lines) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.out...)
}

// An outage is logged once, then as a count per interval, then once more
// when calls have succeeded for the quiet period; a partial outage (some
// calls fail, others succeed) is still an outage.
func TestOutageIsLoggedOnceNotPerRequest(t *testing.T) {
	ctx := context.Background()
	h := &lines{}
	o := &outageLog{logger: slog.New(h), every: 50 * time.Millisecond, quiet: 50 * time.Millisecond}
	e := Event{Op: "allow", Policy: "api", Err: fmt.Errorf("%w: %w", ErrBackend, errors.New("connection refused"))}

	for range 1000 {
		o.failure(ctx, e)
		o.success(ctx) // another shard serves: not a recovery
	}
	if got := h.all(); len(got) != 1 || !strings.HasPrefix(got[0], "throttlekit: backend failing") {
		t.Fatalf("after 1000 failures: %q, want one 'backend failing' line", got)
	}
	time.Sleep(60 * time.Millisecond)
	o.failure(ctx, e)
	got := h.all()
	if len(got) != 2 || !strings.Contains(got[1], "still failing failures=1000") {
		t.Fatalf("after the interval: %q, want a line counting 1000 failures", got)
	}
	time.Sleep(60 * time.Millisecond)
	for range 10 {
		o.success(ctx)
	}
	got = h.all()
	if len(got) != 3 || !strings.Contains(got[2], "backend recovered") || !strings.Contains(got[2], "failures=1001") {
		t.Fatalf("after the recovery: %q, want one 'recovered' line counting 1001 failures", got)
	}
	o.failure(ctx, e)
	if got := h.all(); len(got) != 4 || !strings.HasPrefix(got[3], "throttlekit: backend failing") {
		t.Fatalf("a new outage: %q, want a new 'backend failing' line", got)
	}
}
