package debugpage_test

import (
	"context"
	"fmt"
	"time"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	debugpage "github.com/throttlekit/throttlekit/observe/debug"
	"github.com/throttlekit/throttlekit/throttler"
)

// A debug page fed by a throttler's denials; in a program, serve it on an
// internal port with http.ListenAndServe("127.0.0.1:9090", page).
func Example() {
	backend := memorybackend.New()
	policy, err := throttler.ParsePolicy("api", "2/min")
	if err != nil {
		panic(err)
	}
	page, err := debugpage.New(debugpage.WithBackend("memory", backend), debugpage.WithPolicies(policy))
	if err != nil {
		panic(err)
	}
	clock := throttler.NewManualClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	t, err := throttler.New(backend, throttler.WithClock(clock), throttler.WithObserver(page.Observer()))
	if err != nil {
		panic(err)
	}
	for id, n := range map[string]int{"scraper": 12, "user:7": 4, "user:8": 1} {
		for range n {
			if _, err := t.Allow(context.Background(), policy, id); err != nil {
				panic(err)
			}
		}
	}
	snap := page.Snapshot(context.Background())
	fmt.Println("backend:", snap.Backends[0].Name, "healthy:", snap.Backends[0].Healthy)
	for _, d := range snap.TopDenied.Heaviest {
		fmt.Printf("%s %s denied %d times\n", d.Policy, d.Identifier, d.Count)
	}
	// Output:
	// backend: memory healthy: true
	// api scraper denied 10 times
	// api user:7 denied 2 times
}
