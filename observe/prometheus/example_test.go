package promobserver_test

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	promobserver "github.com/throttlekit/throttlekit/observe/prometheus"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// A collector observing a throttler, registered with a registry; in a
// program, expose the registry with promhttp.HandlerFor.
func Example() {
	c, err := promobserver.New()
	if err != nil {
		panic(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)

	clock := throttlertest.NewManualClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	t, err := throttler.New(memorybackend.New(), throttler.WithClock(clock), throttler.WithObserver(c))
	if err != nil {
		panic(err)
	}
	p, err := throttler.ParsePolicy("api", "5/min")
	if err != nil {
		panic(err)
	}
	for range 7 {
		if _, err := t.Allow(context.Background(), p, "alice"); err != nil {
			panic(err)
		}
	}

	families, err := reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, f := range families {
		switch f.GetName() {
		case "throttlekit_decisions_total", "throttlekit_near_limit_total":
			for _, m := range f.GetMetric() {
				if v := m.GetCounter().GetValue(); v > 0 {
					fmt.Print(f.GetName())
					for _, l := range m.GetLabel() {
						fmt.Printf(" %s=%s", l.GetName(), l.GetValue())
					}
					fmt.Println(":", v)
				}
			}
		}
	}
	// Output:
	// throttlekit_decisions_total limit=5/min outcome=allowed policy=api: 5
	// throttlekit_decisions_total limit=5/min outcome=denied policy=api: 2
	// throttlekit_near_limit_total limit=5/min policy=api: 1
}
