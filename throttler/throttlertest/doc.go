// Package throttlertest holds what a test of code that uses package
// throttler needs and a program never does, as net/http/httptest does for
// net/http: ManualClock, a throttler.Clock that moves only when told to,
// for timelines with no sleeping.
//
//	clock := throttlertest.NewManualClock(time.Date(2030, 1, 2, 3, 4, 0, 0, time.UTC))
//	th, err := throttler.New(memorybackend.New(), throttler.WithClock(clock))
//	...
//	clock.Advance(time.Minute) // the window closes
//
// It imports nothing of this module, so package throttler's own tests use
// it too.
package throttlertest
