// Package examples holds no code of its own: each directory below it is a
// runnable program, one per backend and deployment (in process, Redis
// standalone, Cluster and Sentinel, memcached, sharded Redis groups, a
// rollout with a static source and with Unleash, the way in from a
// hand-written limiter), the common path of an HTTP API limited per user on
// Redis with anonymous requests limited by IP (per-user-redis), one wiring
// metrics, logs and the debug page (observability), one for outbound calls:
// a fleet of workers sharing a partner's five-window quota with AllowUpTo
// and Wait (partner-quota), and one for concurrency limits (concurrency).
//
// examples_test.go builds every program, runs it against real servers it
// starts on loopback ports and checks its output. It also checks that
// README.md or a guide under docs/ shows each program verbatim or links to
// its directory, and that every page showing a program ("// Command NAME"
// at the top of a go block) shows it as the file is.
package examples
