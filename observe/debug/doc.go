// Package debugpage is an operator's debug page for throttlekit: an
// http.Handler that shows, on every load,
//
//   - the backends and their health (each pinged, within a timeout, when
//     it implements driver.Pinger);
//   - the circuit breakers' states (those the backends report, and any
//     given with WithBreakers);
//   - each rollout's mode, the split in force, its flag source's health and
//     when the source last heard from its server, and the rollout's
//     counters (mirrored, shortfalls, secondary errors, shadow mismatches);
//   - the policies in use and their limits;
//   - the heaviest denied identifiers, counted by the Handler's Observer
//     in a Space-Saving sketch: K counters per shard (8 shards), so memory
//     stays fixed whatever the number of identifiers, and each count
//     overestimates by at most its err.
//
// The page is HTML for a person and JSON with ?format=json (the Page type
// and its field tags are the schema). Mount it on an internal port, never
// the public one: it shows identifiers, which may be API keys or users.
//
//	page, err := debugpage.New(
//		debugpage.WithBackend("redis", redisBackend),
//		debugpage.WithRollout("sessions", rolloutBackend),
//		debugpage.WithPolicies(apiPolicy, searchPolicy))
//	t, err := throttler.New(rolloutBackend, throttler.WithObserver(page.Observer()))
//	go http.ListenAndServe("127.0.0.1:9090", page)
package debugpage
