package rollout

import "errors"

// Sentinel errors, for errors.Is.
var (
	// ErrInvalidPercent reports a percentage outside 0 to 100.
	ErrInvalidPercent = errors.New("rollout: invalid percentage")

	// ErrInvalidConfig reports a Backend or source that cannot work: a nil
	// backend or flag source, an unknown mode or side, an empty feature name.
	ErrInvalidConfig = errors.New("rollout: invalid configuration")

	// ErrNotInitialized reports a Backend that was not built by New.
	ErrNotInitialized = errors.New("rollout: backend not built by New")

	// ErrSecondary wraps every failure of the secondary backend in mirror
	// and shadow modes. Such failures never change a decision; they are
	// counted in Stats and passed to the secondary error handler.
	ErrSecondary = errors.New("rollout: secondary backend failure")

	// ErrUnsupportedToggle reports an Unleash toggle whose strategies cannot
	// be read as one sticky percentage (constraints, segments, dependencies,
	// random stickiness, another group ID, a strategy other than
	// flexibleRollout or default). The UnleashSource keeps the last split it
	// had and reports the error.
	ErrUnsupportedToggle = errors.New("rollout: unleash toggle is not a sticky percentage")
)
