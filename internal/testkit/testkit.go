package testkit

import (
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// T0 is the start of every test timeline: a time with a sub-second part, so
// that rounding slips show.
var T0 = time.Date(2030, 1, 2, 3, 4, 5, 678_000_000, time.UTC)

// CallTimeout is the call timeout of a test whose throttler decides
// through a real server and that proves a property, not a latency: far
// above throttler.DefaultCallTimeout, so that a -race run on a loaded
// machine never turns a slow answer into a degraded result, as
// conformance.DefaultCallTimeout does for the suite. A test that measures
// timing keeps the production timeout.
const CallTimeout = 10 * time.Second

// Policy parses spec (ParsePolicy's notation) into a policy named name.
func Policy(tb testing.TB, name, spec string, opts ...throttler.Option) *throttler.Policy {
	tb.Helper()
	p, err := throttler.ParsePolicy(name, spec, opts...)
	if err != nil {
		tb.Fatalf("ParsePolicy(%q, %q): %v", name, spec, err)
	}
	return p
}

// Compiled returns the backend's view of a policy parsed from spec, for
// tests that call a backend directly.
func Compiled(tb testing.TB, name, spec string) *driver.Policy {
	tb.Helper()
	return Compile(tb, Policy(tb, name, spec))
}

// Compile returns the backend's view of p: the driver.Policy a Throttler
// sends with every request under p.
func Compile(tb testing.TB, p *throttler.Policy) *driver.Policy {
	tb.Helper()
	if p == nil {
		return nil
	}
	var limits []driver.Limit
	for _, l := range p.Limits() {
		dl, err := driver.NewLimit(l.Name, l.Algorithm, l.Max, l.Window, l.Burst)
		if err != nil {
			tb.Fatalf("NewLimit(%v): %v", l, err)
		}
		limits = append(limits, dl)
	}
	dp, err := driver.NewPolicy(p.Name(), limits...)
	if err != nil {
		tb.Fatalf("NewPolicy(%q): %v", p.Name(), err)
	}
	return dp
}

// Throttler returns a throttler over b with opts.
func Throttler(tb testing.TB, b driver.Backend, opts ...throttler.Option) *throttler.Throttler {
	tb.Helper()
	th, err := throttler.New(b, opts...)
	if err != nil {
		tb.Fatalf("throttler.New: %v", err)
	}
	return th
}

// Clock returns a manual clock reading T0 and the option that makes a
// throttler read it.
func Clock() (*throttlertest.ManualClock, throttler.Option) {
	c := throttlertest.NewManualClock(T0)
	return c, throttler.WithClock(c)
}

// Count returns the positive whole number in the environment variable
// name, or def when it is unset: how a long-running test lets a person ask
// for more runs, stalls or seconds than CI spends. A value that is not a
// positive whole number fails the test rather than being ignored.
func Count(tb testing.TB, name string, def int) int {
	tb.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n <= 0 {
		tb.Fatalf("%s=%q: want a positive whole number", name, s)
	}
	return n
}
