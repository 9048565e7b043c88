package unleashflag

import (
	"context"
	"errors"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/rollout"
)

// A toggle name the server does not know (a typo) reads as the kill switch,
// which nobody notices by its effect: Ping reports it, the source logs one
// Error line however many fetches lack it, Status counts them, and the
// toggle's arrival is logged and clears Ping.
func TestMissingToggleIsReportedAndLoggedOnce(t *testing.T) {
	flags := newFlagServer(t, 40)
	// Failing until the logger is in place, so that the first fetched set
	// reaches it.
	flags.change(func(f *flagServer) { f.present, f.failing = false, true })
	src := newTestSource(t, flags)
	logs, logger := testkit.NewLogs()
	src.SetLogger(logger)
	flags.change(func(f *flagServer) { f.failing = false })

	ctx := context.Background()
	waitFor(t, "Ping to report the missing toggle", func() bool { return errors.Is(src.Ping(ctx), ErrToggleMissing) })
	err := src.Ping(ctx)
	assert.EqualError(t, err, `throttlekit: unleashflag: toggle does not exist on the unleash server: "`+testFeature+
		`" is not in the toggles the server sent (a typo? a project or environment the token does not see?); everything is on the old backend`)
	require.NotNil(t, src.Split())
	assert.True(t, src.Split().Killed())

	// More fetched sets without it: counted, not logged again.
	for range 3 {
		before := flags.fetches.Load()
		flags.change(func(*flagServer) {})
		waitFor(t, "another fetch", func() bool { return flags.fetches.Load() > before })
	}
	waitFor(t, "the fetches to be counted", func() bool { return src.Status().MissingFetches >= 4 })
	assert.True(t, src.Status().Missing)
	assert.Equal(t, 1, logs.Count(slog.LevelError, "toggle does not exist on the unleash server"))
	// A rollout over the source reports the count, which the metrics
	// export as event="flag_missing".
	rb, err := rollout.New(memorybackend.New(), memorybackend.New(), src)
	require.NoError(t, err)
	assert.Equal(t, src.Status().MissingFetches, rb.Stats().FlagMissing)
	assert.GreaterOrEqual(t, rb.Stats().FlagMissing, uint64(4))

	flags.change(func(f *flagServer) { f.present = true })
	waitPercent(t, src, 40)
	waitFor(t, "Ping to clear", func() bool { return src.Ping(ctx) == nil })
	assert.False(t, src.Status().Missing)
	assert.Equal(t, 1, logs.Count(slog.LevelInfo, "toggle found on the unleash server"))
	assert.Equal(t, 1, logs.Count(slog.LevelError, "toggle does not exist"), "no second Error line")
}
