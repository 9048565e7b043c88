// Package localserver starts and stops real redis-server and memcached
// processes on free loopback ports, for integration tests and for demo
// programs, and a real Unleash server (the unleash-server npm package on
// Node.js, with a PostgreSQL cluster of its own: [StartUnleash]). It never
// fakes a server: every helper launches the actual binary and talks to it
// over 127.0.0.1.
//
// # Binaries
//
// Binaries are found with [exec.LookPath]. The environment variables
// REDIS_SERVER, REDIS_CLI and MEMCACHED may name a different binary (a path or
// a name looked up in PATH). When a binary cannot be found, the process-level
// functions ([StartRedis], [StartRedisReplica], [StartRedisSentinel],
// [StartRedisCluster], [StartMemcached]) return an error matching [ErrBinaryNotFound] with
// [errors.Is], and [Available] reports false.
//
// # Process-level API
//
// [StartRedis] starts a standalone Redis, [StartRedisReplica] starts a replica
// of an existing one, [StartRedisSentinel] starts a Redis Sentinel that
// monitors a primary and can fail over to its replicas, [StartRedisCluster]
// starts a Redis Cluster (created with `redis-cli --cluster create`), and
// [StartMemcached] starts a memcached. Each
// server can be stopped gracefully with Stop and brought back on the same
// address with Start, which is what recovery tests need; Close stops the
// server for good (memcached is simply killed, as it has nothing to save) and
// removes the temporary directory it owns. Stop and Close are safe to call
// more than once and from several goroutines.
//
// Redis is started with settings suited to tests: no RDB snapshots or AOF,
// protected mode off, DEBUG enabled (so tests can run
// `DEBUG SET-ACTIVE-EXPIRE 0`), no delay before diskless replication, and a
// log file in its temporary directory. Because persistence is off, data does
// not survive Stop/Start unless the caller passes persistence options in
// [RedisOptions.Args].
//
// # Sentinel
//
// A [RedisSentinel] is the same redis-server binary run with --sentinel. It
// monitors one primary with a quorum of 1, so it alone decides that the
// primary is down and promotes a replica; it declares a primary down after
// [SentinelDownAfter] without an answer, which makes a failover take a few
// seconds. A typical failover test starts a primary, its replicas and then
// the sentinel, points a Sentinel-aware client at [RedisSentinel.Addr],
// stops the primary and calls [RedisSentinel.WaitMaster] with the replica's
// address.
//
// # Test helpers
//
// [RedisT], [RedisReplicaT], [RedisSentinelT], [RedisClusterT] and
// [MemcachedT] wrap the process-level functions for tests: they register
// Close with [testing.TB.Cleanup] and fail the test on errors. When a binary
// is missing they skip the test, unless the environment variable CI is
// non-empty or THROTTLEKIT_REQUIRE_SERVERS=1, in which case they fail it, so
// that CI never silently skips server-backed tests.
//
// # Process lifetime
//
// On Linux, every child is started with a parent-death signal (SIGKILL), so a
// crashed or killed test binary does not leave servers behind. (The kernel
// ties that signal to the OS thread that started the child; the Go runtime
// only retires threads when a goroutine exits while locked to its thread with
// [runtime.LockOSThread], which ordinary tests do not do.) On other systems
// there is no such guarantee and callers must Close what they start.
//
// Ports are chosen by binding 127.0.0.1:0 and releasing the port just before
// the server starts. If another process grabs the port in between, the start
// is retried on a new port. The readiness check compares the process id
// reported by the server with the child's, so a foreign server that happens
// to own the port is never mistaken for ours.
package localserver
