package middleware_test

import (
	"bytes"
	"log/slog"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/middleware"
	"github.com/throttlekit/throttlekit/throttler"
)

// The Limiter's errors are logged where its throttler's are: one
// throttler.WithLogger reaches them, and WithLogger(nil) silences them.
func TestErrorsLogToTheThrottlersLogger(t *testing.T) {
	var buf, def bytes.Buffer
	logged := slog.New(slog.NewTextHandler(&buf, nil))
	// The default logger too writes to a buffer, to show that nothing
	// falls back to it.
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&def, nil)))
	t.Cleanup(func() { slog.SetDefault(prev) })
	user := middleware.Header("X-User")
	for _, c := range []struct {
		name   string
		logger *slog.Logger
	}{{"WithLogger", logged}, {"WithLogger(nil)", nil}} {
		t.Run(c.name, func(t *testing.T) {
			buf.Reset()
			def.Reset()
			// failingBackend takes no leases: an unsupported concurrency
			// limit is an error the default handler answers with a 500.
			th := testkit.Throttler(t, failingBackend{}, throttler.WithLogger(c.logger))
			lim, err := middleware.New(th, nil, middleware.WithConcurrency(concurrencyLimit(t, "in-flight", 1), user))
			require.NoError(t, err)
			rp := get(t, serve(t, lim, statusHandler), "/", "X-User", "u1")
			assert.Equal(t, http.StatusInternalServerError, rp.status)
			assert.NotContains(t, def.String(), "rate limiter error", "logged to slog.Default()")
			if c.logger == nil {
				assert.Empty(t, buf.String())
				return
			}
			assert.Contains(t, buf.String(), "throttlekit: middleware: rate limiter error")
			assert.Contains(t, buf.String(), "path=/")
		})
	}
}
