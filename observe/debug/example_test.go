package debugpage_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http/httptest"
	"time"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	debugpage "github.com/throttlekit/throttlekit/observe/debug"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// A debug page fed by a throttler's denials. In a program, serve it on an
// internal port only: http.ListenAndServe("127.0.0.1:9090", page).
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
	clock := throttlertest.NewManualClock(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	t, err := throttler.New(backend, throttler.WithClock(clock), throttler.WithObserver(page.Observer()))
	if err != nil {
		panic(err)
	}
	for _, traffic := range []struct {
		id string
		n  int
	}{{"user:7", 4}, {"scraper", 12}, {"user:8", 1}} {
		for range traffic.n {
			if _, err := t.Allow(context.Background(), policy, traffic.id); err != nil {
				panic(err)
			}
		}
	}

	snap := page.Snapshot(context.Background())
	fmt.Println("backend:", snap.Backends[0].Name, "healthy:", snap.Backends[0].Healthy)
	fmt.Println("policy:", snap.Policies[0].Name, snap.Policies[0].Limits[0].Spec)
	for _, d := range snap.TopDenied.Heaviest {
		fmt.Printf("%s %s denied %d times (±%d)\n", d.Policy, d.Identifier, d.Count, d.Err)
	}

	// The same, as JSON.
	srv := httptest.NewServer(page)
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL + "?format=json")
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		panic(err)
	}
	var p debugpage.Page
	if err := json.Unmarshal(body, &p); err != nil {
		panic(err)
	}
	heaviest, err := json.Marshal(p.TopDenied.Heaviest)
	if err != nil {
		panic(err)
	}
	fmt.Println(string(heaviest))
	// Output:
	// backend: memory healthy: true
	// policy: api 2/min
	// api scraper denied 10 times (±0)
	// api user:7 denied 2 times (±0)
	// [{"policy":"api","identifier":"scraper","count":10,"err":0},{"policy":"api","identifier":"user:7","count":2,"err":0}]
}
