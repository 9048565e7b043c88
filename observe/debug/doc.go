// Package debugpage is an operator's debug page for throttlekit: an
// http.Handler that shows, gathered afresh on every load,
//
//   - the backends and their health: each backend listed with WithBackend
//     that implements driver.Pinger is pinged, all at once, each within
//     the ping timeout (one second by default), and shown ok or failed
//     with the error, its kind (observe.ErrorKind) and the ping's latency;
//   - the circuit breakers: those the backends report
//     (redisbackend.Backend.Breakers, breaker.Backend, or any backend with a
//     Breaker() *breaker.Breaker method) and those of WithBreakerSet and
//     WithBreakers, with server, state and rejected calls;
//   - each rollout of WithRollout: its mode, the split in force (percent
//     of identifiers on the new backend, kill switch, group ID), its flag
//     source's health (pinged when it can be) and freshness (when its
//     server last answered, for a source with a LastFetch method such as
//     unleashflag.Source, and its update time and errors through
//     WithSourceStatus), and its counters: mirrored decisions, mirror
//     shortfalls, secondary errors, shadow comparisons and mismatches by
//     kind;
//   - the policies of WithPolicies and their limits;
//   - the heaviest denied identifiers, counted by the Handler's Observer.
//
// # The heaviest denied identifiers
//
// Give Handler.Observer to throttler.WithObserver. It counts the denials
// of allow decisions and the refused acquires of concurrency limits, by
// policy and identifier, whether the store, the deny cache or FailLocal
// denied; not the degraded denials of a backend failing closed, which
// deny everyone. They go into a Space-Saving sketch of K counters
// (WithTopK, DefaultTopK): memory stays fixed at K entries whatever the
// number of distinct identifiers, each count overestimates its
// identifier's true number of denials by at most its err, err is at most
// the denials seen divided by K, and every identifier denied more often
// than that is listed. An allowed decision costs the Observer one field
// test; a denial, a hash and a short critical section in one of up to
// eight shards. The counts run from the Handler's creation or its latest
// ResetDenied.
//
// # Mounting
//
// Mount the page on an internal port, never the one the public is served
// on: it shows identifiers, which may be user IDs, addresses or API keys,
// and each load pings the backends.
//
//	page, err := debugpage.New(
//		debugpage.WithBackend("redis", redisBackend),
//		debugpage.WithRollout("sessions", rolloutBackend),
//		debugpage.WithPolicies(apiPolicy, searchPolicy))
//	if err != nil { ... }
//	t, err := throttler.New(rolloutBackend, throttler.WithObserver(page.Observer()))
//	internal := http.NewServeMux()
//	internal.Handle("/debug/throttlekit", page)
//	go http.ListenAndServe("127.0.0.1:9090", internal)
//
// # JSON
//
// With ?format=json the page is the Page type as indented JSON. Field
// names are stable: fields may be added, never renamed or removed. Times
// are RFC 3339 in UTC; durations are strings as time.Duration prints them
// ("1m0s") except where the name gives the unit.
//
//	{
//	  "generated_at": time, "uptime": "1h2m3s",
//	  "backends": [{"name", "kind", "pinged", "healthy", "ping_ms",
//	                "error"?, "error_kind"?}],
//	  "breakers": [{"source", "server", "state", "rejected"}],
//	  "rollouts": [{"name", "mode", "has_split", "split", "percent_new",
//	                "killed", "group_id"?,
//	                "source": {"kind", "pinged", "healthy", "error"?,
//	                           "last_fetch"?, "fetch_age_seconds"?,
//	                           "last_update"?, "errors"?, "last_error"?},
//	                "stats": {"default_routed", "mirrored",
//	                          "mirror_shortfalls", "mirror_shortfall_units",
//	                          "mirror_diverged", "seed_checks", "seeded",
//	                          "secondary_errors", "shadow_compared",
//	                          "shadow_mismatches",
//	                          "mismatches_by_kind": {"allowed_denied",
//	                            "denied_allowed", "remaining_differs",
//	                            "reset_differs"}}}],
//	  "policies": [{"name", "spec", "limits": [{"name", "spec", "algorithm",
//	                "max", "window", "burst"?}]}],
//	  "top_denied": {"k", "since", "denials",
//	                 "by_outcome": {"denied", "cached", "local_denied"},
//	                 "tracked",
//	                 "heaviest": [{"policy", "identifier", "count", "err"}]}
//	}
//
// Fields marked ? are left out when empty. Lists are [] when empty, never
// null. The doc comments of Page and the types it holds define each field.
package debugpage
