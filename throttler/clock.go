package throttler

import (
	"time"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// maxTime is the latest clock reading a Throttler decides with.
var maxTime = time.UnixMilli(driver.MaxUnixMilli).UTC()

// checkTime reports whether t is a clock reading the throttler decides
// with; the error wraps ErrClockOutOfRange.
func checkTime(t time.Time) error {
	if t.Before(time.Unix(0, 0)) || t.After(maxTime) {
		return driver.Errorf("%w: %v is outside [1970-01-01, %v]", ErrClockOutOfRange, t, maxTime.Format(time.DateOnly))
	}
	return nil
}

// Clock supplies the time for every decision. Backends never read a clock
// of their own: the reading travels with each request. Tests use
// throttlertest.ManualClock, which moves only when told to.
type Clock interface {
	// Now returns the current time.
	Now() time.Time
}

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }
