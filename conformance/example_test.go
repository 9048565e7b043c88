package conformance_test

import (
	"fmt"
	"time"

	"github.com/throttlekit/throttlekit/conformance"
	"github.com/throttlekit/throttlekit/throttler"
)

// The model answers what SPEC says a backend behind a Throttler must
// answer, here for an anchored window of 2 per minute.
func ExampleModel() {
	p, err := throttler.NewPolicy("api", []throttler.Limit{throttler.PerMinute(2)})
	if err != nil {
		panic(err)
	}
	m := conformance.NewModel()
	for i, at := range []time.Duration{0, time.Second, 2 * time.Second, time.Minute} {
		r := m.AllowN(p, "user:42", conformance.T0.Add(at), 1)
		fmt.Printf("t%d: allowed=%v remaining=%d reset-in=%v retry-after=%v\n",
			i, r.Allowed, r.Remaining, r.ResetAt.Sub(conformance.T0.Add(at)), r.RetryAfter)
	}
	// Output:
	// t0: allowed=true remaining=1 reset-in=1m0s retry-after=0s
	// t1: allowed=true remaining=0 reset-in=59s retry-after=0s
	// t2: allowed=false remaining=0 reset-in=58s retry-after=58s
	// t3: allowed=true remaining=1 reset-in=1m0s retry-after=0s
}
