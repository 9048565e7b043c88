// Package examples holds no code of its own: each directory below it is a
// runnable program that README.md shows verbatim, one per backend and
// deployment (in process, Redis standalone, Cluster and Sentinel, memcached,
// sharded Redis groups, a rollout with a static source and with Unleash),
// one wiring metrics, logs and the debug page (observability),
// one for outbound calls: a fleet of workers sharing a partner's
// five-window quota with AllowUpTo and Wait (partner-quota),
// and one for concurrency limits (concurrency).
// examples_test.go builds every program, runs it against real servers it
// starts on loopback ports, checks its output, and checks that README.md
// still shows each program as it is.
package examples
