package testkit

import (
	"context"
	"log/slog"
	"strings"
	"sync"
)

// Logs is a slog.Handler that keeps every record's level and message, for
// tests that count log lines. It is safe for concurrent use.
type Logs struct {
	mu      sync.Mutex
	records []LogRecord
}

// LogRecord is one logged line: its level, message and attributes as
// key=value text.
type LogRecord struct {
	Level   slog.Level
	Message string
	Attrs   string
}

// NewLogs returns an empty recorder and a logger writing to it at every
// level.
func NewLogs() (*Logs, *slog.Logger) {
	l := &Logs{}
	return l, slog.New(l)
}

// Enabled implements slog.Handler: every level is kept.
func (l *Logs) Enabled(context.Context, slog.Level) bool { return true }

// Handle implements slog.Handler.
func (l *Logs) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	r.Attrs(func(a slog.Attr) bool {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(a.String())
		return true
	})
	l.mu.Lock()
	l.records = append(l.records, LogRecord{Level: r.Level, Message: r.Message, Attrs: b.String()})
	l.mu.Unlock()
	return nil
}

// WithAttrs implements slog.Handler; attributes given this way are dropped.
func (l *Logs) WithAttrs([]slog.Attr) slog.Handler { return l }

// WithGroup implements slog.Handler; groups are ignored.
func (l *Logs) WithGroup(string) slog.Handler { return l }

// Count returns how many records at level or above have a message
// containing substr.
func (l *Logs) Count(level slog.Level, substr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.records {
		if r.Level >= level && strings.Contains(r.Message, substr) {
			n++
		}
	}
	return n
}

// Records returns a copy of every record so far.
func (l *Logs) Records() []LogRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]LogRecord(nil), l.records...)
}
