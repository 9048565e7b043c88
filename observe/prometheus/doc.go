// Package promobserver exports a throttler's decisions, backend calls,
// circuit breakers and rollout as Prometheus metrics, on
// github.com/prometheus/client_golang.
//
// A Collector is both a throttler.Observer and a prometheus.Collector:
//
//	c, err := promobserver.New(promobserver.WithBreakers(redisBackend.Breakers))
//	prometheus.MustRegister(c)
//	t, err := throttler.New(redisBackend, throttler.WithObserver(c))
//	http.Handle("/metrics", promhttp.Handler())
//
// # Metrics
//
// Every name starts with throttlekit_ (WithNamespace changes it):
//
//	throttlekit_decisions_total{policy, limit, outcome}        counter
//	throttlekit_near_limit_total{policy, limit}                counter
//	throttlekit_backend_call_duration_seconds{backend, op}     histogram
//	throttlekit_backend_errors_total{backend, op, kind}        counter
//	throttlekit_breaker_state{server, state}                   gauge, 1 for the current state
//	throttlekit_breaker_rejected_total{server}                 counter
//	throttlekit_rollout_new_ratio{rollout}                     gauge, 0 to 1
//	throttlekit_rollout_killed{rollout}                        gauge, 0 or 1
//	throttlekit_rollout_events_total{rollout, event}           counter
//	throttlekit_rollout_mismatches_total{rollout, kind}        counter
//	throttlekit_quota_remaining{policy, limit, subject}        gauge (WithQuotaGauge)
//	throttlekit_quota_limit{policy, limit, subject}            gauge (WithQuotaGauge)
//	throttlekit_quota_scrape_errors{policy, subject}           gauge (WithQuotaGauge)
//
// limit is the binding limit's name (the denying one for a denial, the
// tightest for an allowance; "10/s" unless the policy names it). outcome is
// one of observe.Outcomes: allowed, denied, cached (a denial from the deny
// cache), degraded_allowed and degraded_denied (the failure mode decided),
// local_allowed and local_denied (FailLocal). A near-limit decision is an
// allowed one that left its binding limit under a fraction of its quota,
// 20% unless WithNearLimit says otherwise. op is allow, peek, refund or
// reset; kind is one of observe.ErrorKinds. Decisions answered without a
// backend call (the deny cache) add no latency sample.
//
// Breaker and rollout metrics are read when Prometheus scrapes, from the
// functions and backends given with WithBreakers and WithRollout. A
// rollout's events are its Stats: default_routed, mirrored,
// mirror_shortfall, mirror_diverged (a mirrored decision whose secondary
// was apart before the write: zero once the stores have converged),
// secondary_error, seed_checked (a split decision that looked at the other
// store), seeded (one that carried state over), seed_unsupported,
// shadow_compared, shadow_mismatched (a compared decision that differs
// in any way) and flag_missing (the flag source answered without its flag:
// a typo in its name puts the kill switch in force); its
// mismatches by kind are allowed_denied, denied_allowed, remaining and
// reset, and one decision can differ in several.
//
// # Cardinality
//
// No metric is labelled by identifier: the number of identifiers is
// unbounded and each label value is a time series held in memory by the
// collector and the server. Labels take policy names, limit names,
// backend kinds, operations and server addresses, which a program fixes.
// The one exception is opt-in and bounded: WithQuotaGauge labels the
// remaining quota of at most MaxQuotaSubjects subjects the program names
// itself, such as the outbound quota a fleet of workers shares with a
// partner.
//
// # Cost
//
// Observe costs a decision two map lookups on copy-on-write maps and
// atomic adds: no allocation and no lock once a policy and limit have been
// seen (BenchmarkObserve). The first decision of a new policy, limit or
// operation takes a lock to add its series.
//
// # Module
//
// This package is a module of its own, github.com/throttlekit/throttlekit/observe/prometheus,
// so that a program that does not import it never inherits the Prometheus client in its
// go.mod: go get it beside the core. It is released and tested with the
// core at the same commit.
package promobserver
