package throttler_test

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// loggerTaker is a backend that records the loggers SetLogger was given.
type loggerTaker struct {
	*memorybackend.Backend
	got []*slog.Logger
}

func (l *loggerTaker) SetLogger(lg *slog.Logger) { l.got = append(l.got, lg) }

var _ driver.LoggerSetter = (*loggerTaker)(nil)

// New hands WithLogger's logger, nil included, to the backend and to the
// local fallback store once; without WithLogger it leaves them alone.
func TestNewHandsTheLoggerToTheBackend(t *testing.T) {
	logger := slog.New(slog.DiscardHandler)
	for _, c := range []struct {
		name string
		opts []throttler.Option
		want []*slog.Logger
	}{
		{"no WithLogger", nil, nil},
		{"WithLogger", []throttler.Option{throttler.WithLogger(logger)}, []*slog.Logger{logger}},
		{"WithLogger(nil)", []throttler.Option{throttler.WithLogger(nil)}, []*slog.Logger{nil}},
	} {
		t.Run(c.name, func(t *testing.T) {
			b := &loggerTaker{Backend: memorybackend.New()}
			local := &loggerTaker{Backend: memorybackend.New()}
			opts := append([]throttler.Option{throttler.WithLocalFallback(local, 2)}, c.opts...)
			th, err := throttler.New(b, opts...)
			require.NoError(t, err)
			require.NotNil(t, th)
			assert.Equal(t, c.want, b.got, "backend")
			assert.Equal(t, c.want, local.got, "local fallback")
		})
	}
}

func TestLoggerOrDiscard(t *testing.T) {
	logger := slog.New(slog.DiscardHandler)
	assert.Same(t, logger, driver.LoggerOrDiscard(logger))
	d := driver.LoggerOrDiscard(nil)
	require.NotNil(t, d)
	assert.False(t, d.Enabled(t.Context(), slog.LevelError), "a nil logger writes nothing")
}

// Logger is the logger the middleware packages log through: WithLogger's,
// slog.Default() without it (and for a zero Throttler), nil when
// WithLogger(nil) turned logging off.
func TestLoggerIsWithLoggers(t *testing.T) {
	own := slog.New(slog.DiscardHandler)
	for name, c := range map[string]struct {
		opts []throttler.Option
		want *slog.Logger
	}{
		"no option":       {nil, slog.Default()},
		"WithLogger":      {[]throttler.Option{throttler.WithLogger(own)}, own},
		"WithLogger(nil)": {[]throttler.Option{throttler.WithLogger(nil)}, nil},
	} {
		th, err := throttler.New(memorybackend.New(), c.opts...)
		require.NoError(t, err, name)
		assert.Same(t, c.want, th.Logger(), name)
	}
	assert.Same(t, slog.Default(), (&throttler.Throttler{}).Logger())
	assert.Same(t, slog.Default(), (*throttler.Throttler)(nil).Logger())
}
