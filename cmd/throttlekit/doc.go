// Command throttlekit is the administrator's tool for the state throttlekit
// stores: it shows what an identifier has used under a policy, resets it,
// explains which keys a policy writes, and deletes the keys of a layout
// that is no longer served.
//
//	throttlekit inspect  [flags] ID      usage of every limit on every side, consuming nothing
//	throttlekit reset    [flags] ID      forget the identifier's state on every side
//	throttlekit cleanup  --prefix P [flags]   delete a key prefix from Redis, paced and resumable
//	throttlekit explain  [flags] POLICY  a policy's limits and the keys they are stored under
//	throttlekit help [command]           (or any command with --help)
//
// Flags may come before or after the arguments; everything after "--" is an
// argument. Each command documents its flags under --help.
//
// # Backends
//
// inspect, reset and cleanup take the connection strings the library takes
// (cleanup only the Redis ones):
//
//	--redis URL            a standalone Redis, as go-redis's ParseURL reads it:
//	                       redis://[user:password@]host:port[/db][?dial_timeout=1s&...],
//	                       rediss:// for TLS, unix:///path/to/socket
//	--redis-cluster URL    a Redis Cluster, as go-redis's ParseClusterURL reads it:
//	                       redis://host1:7000?addr=host2:7000&addr=host3:7000
//	--redis-groups CONFIG  sharded primary/replica groups in package redisgroups's
//	                       syntax: a=redis://10.0.0.1:6379?replica=redis://10.0.0.2:6379,b=redis://...
//	--memcached SERVERS    memcached servers, host:port[,host:port...]
//	--prefix P             the key prefix (default: the backend's own, "throttlekit:"
//	                       for Redis, "tk" for memcached)
//	--timeout D            bound on each backend call (default 2s)
//
// Exactly one of the four connection flags names the backend. For a
// rollout (package rollout) give its two sides instead, each as
// KIND=VALUE, where KIND is redis, redis-cluster, redis-groups or memcached
// and VALUE is what that connection flag takes (split at the first '='):
//
//	--old memcached=10.0.0.1:11211,10.0.0.2:11211 --old-prefix tk
//	--new 'redis-groups=a=redis://10.0.0.3:6379?replica=redis://10.0.0.4:6379,b=redis://10.0.0.5:6379'
//	--new-prefix app-v2:
//
// --old-prefix and --new-prefix default to --prefix, then to the backend's
// own. inspect and reset then work on both sides, old first. Every client
// the command makes has go-redis's ContextTimeoutEnabled set; nothing is
// contacted before the command needs it, and passwords never appear in
// output or errors.
//
// Environment variables supply defaults. THROTTLEKIT_REDIS,
// THROTTLEKIT_REDIS_CLUSTER, THROTTLEKIT_REDIS_GROUPS, THROTTLEKIT_MEMCACHED,
// THROTTLEKIT_OLD and THROTTLEKIT_NEW are read only when the command line
// names no backend at all, so a flag replaces the environment's backend
// instead of adding a second one. THROTTLEKIT_PREFIX, THROTTLEKIT_OLD_PREFIX,
// THROTTLEKIT_NEW_PREFIX, THROTTLEKIT_POLICY and THROTTLEKIT_POLICY_NAME fill
// the flags of those names when they are not given. cleanup never reads
// THROTTLEKIT_PREFIX: the prefix it deletes is always typed.
//
// # Policies
//
// --policy takes the policy in the one notation the library prints and
// reads: Policy.String's output, which throttler.ParsePolicy reads back to
// an equal policy. It is the policy's name, a colon and a space, then
// comma-separated limits in throttler.ParseLimit's notation, MAX/WINDOW
// followed by options:
//
//	api: 10/s, 5000/h gcra burst=20
//	10/s   120/min   5000/h   300000/day   100/2h   5/250ms
//	60/min aligned           fixed window aligned on the epoch
//	100/min sliding          sliding-window counter
//	10/s gcra                GCRA, burst = max
//	10/s gcra burst=20       GCRA with a burst of 20
//	10/s name=per-sec        a limit named "per-sec" (name="a b" when it holds a space or a comma)
//
// A colon followed by a space or a tab ends the policy's name, so the name
// may hold other colons ("api:v2: 10/s"); Policy.String quotes a name that
// holds ": " itself. The name may instead be given with --policy-name (both
// must agree when both are given). It is never assumed: without it the
// command stops with a usage error, since stored keys hold the name and a
// guessed one would find no state.
//
// Stored keys (key layout 2, driver.KeyLayout) hold the policy's name and
// each limit's identity: its name when it was given one, its algorithm, its
// window and, for GCRA, its burst when one was set; never its max. An
// unnamed limit is shown by its notation ("10/s") but stored under its
// algorithm and window alone (":fixed:1000"), so the policy's name and the
// limits' names, algorithms, windows and bursts must be the application's
// for inspect and reset to find its state (its max may differ: a raised
// max applies to the open window); a mismatch finds nothing (exit status
// 4), which explain helps to check. A deployment still on layout 1 (an
// unnamed limit's notation, max included, in its key) is found by none of
// the commands; upgrade it as the rollout package's UpgradeKeys says.
//
// # inspect
//
// inspect peeks (throttler.Throttler.Peek) at every limit of the policy on
// every side and prints Used, Remaining, the quota and ResetAt. Nothing is
// consumed and no window opens. Peeks on redis-groups are answered by a
// replica when the group has one, which may lag its primary by the
// replication delay. A side that fails is reported in its row (or its
// "error" field) and the others are still shown.
//
// A limit that holds no state on any side that answered, while other
// limits do, is named in a warning on stderr with its key, and listed in
// limits_without_state: its window may have closed (normal for a short
// window), or its notation is not the application's. The exit status is
// then 0; it is 4 when no limit holds state on any side.
//
// With --old and --new, inspect says which side serves the identifier, by
// the rollout package's own hashing (rollout.Bucket, rollout.Split.Side):
// its bucket under --group-id (the rollout's group ID: the Unleash toggle's
// groupId, or rollout.WithStaticGroupID's value; rollout.DefaultStaticGroupID
// by default), the percentage from which the new side serves it, and, with
// --percent (the split in force), the side serving it now. --group-id and
// --percent without --old and --new are usage errors.
//
// # reset
//
// reset calls throttler.Throttler.Reset on every side: the identifier's
// keys under the policy are deleted and every limit is whole at once. A
// failing side does not stop the others.
//
// # cleanup
//
// cleanup deletes from Redis every key starting with --prefix, whatever
// its type (rate-limit windows, concurrency leases), after a migration has
// moved the live state to another prefix or layout:
//
//   - SCAN MATCH <prefix>* COUNT --count (1000) walks the keyspace; KEYS is
//     never used. The prefix's glob characters are escaped. On a Cluster
//     every primary is scanned (ClusterClient.ForEachMaster); with
//     --redis-groups every group's primary, whose replicas follow by
//     replication. --parallel (1) nodes are worked on at a time.
//   - Each batch is deleted by a Lua script run with EVALSHA that UNLINKs
//     the keys and checks, on the server, that each starts with the prefix.
//     A call holds at most 500 keys. On a Cluster the keys are grouped by
//     hash slot, one call per slot, pipelined, so that no call spans slots;
//     a call answered MOVED or ASK is retried through the cluster client,
//     NOSCRIPT by sending the script again.
//   - Deletions are paced to --rate keys per second over all nodes (20,000
//     by default, 0 for no pacing): each batch waits for the time its
//     predecessors' keys take at that rate.
//   - Progress goes to stderr: a progress bar (github.com/schollz/progressbar)
//     when stderr is a terminal, a count line every second otherwise
//     (--progress auto, bar, lines or none). The bar shows the part of the
//     keyspace the SCAN cursors have covered, estimated from the cursors
//     (Redis scans its table in reverse binary order of the buckets, so the
//     cursor's bits reversed tell how much of the table is behind it).
//   - The first SIGINT or SIGTERM stops the run after the batch in flight
//     (no batch is left half sent), the summary is printed, and the exit
//     status is 3; a second signal kills the process. Rerunning the same
//     command finishes the job: it scans anew and finds only the keys left.
//   - --dry-run scans and counts, and deletes nothing.
//
// cleanup refuses an empty prefix (it would delete every key), and unless
// --force is given, a prefix that would also match the keys of a live
// layout: one that the Redis backend's default prefix "throttlekit:", or a
// prefix given with --keep, starts with. Memcached has no cleanup: its
// items expire on their own, at most 33 seconds after their windows end.
//
// The summary reports: nodes, the keys on them when the scan began
// (keyspace, DBSIZE), the part of those the scan covered (scanned; exact
// for a node scanned to the end), the keys SCAN returned under the pattern
// (matched; SCAN may return a key twice when Redis resizes its table
// during the scan, so this can exceed the number of distinct keys), the
// keys the scripts deleted (deleted; exact), and the time taken.
//
// # explain
//
// explain parses a policy exactly as inspect does and prints each limit's
// name, max, window, algorithm, burst (the GCRA capacity), GCRA emission
// interval and storage key (layout 2: "<escaped name>:<algorithm>:<window
// ms>" and, for a GCRA limit with a burst set, ":<burst>"; an unnamed
// limit's key starts with the colon, as in ":fixed:1000"), then what the
// backends store for an example identifier (--id, "user:42"):
//
//   - Redis (redisbackend.Backend.Key, redisbackend.Fields): one hash per
//     identifier and policy, <prefix>v3:{<escaped id>}:<policy key>, with
//     the Cluster hash slot of the identifier's hash tag and, with
//     --redis-groups, the group that owns it. Each limit of key K holds the
//     fields eK (the window's end, or the GCRA theoretical arrival time)
//     and uK (its count), plus pK (the previous window's count) for a
//     sliding window; a GCRA limit has eK alone;
//   - memcached: <prefix>:<policy>:<id> "|" kind ":" limit key, kind w for
//     a window item, c for its counter, g for a GCRA item, s for a sliding
//     window's item, as memcachedbackend.ItemKeys names them.
//
// It contacts no server.
//
// # Output
//
// Each command prints a table for people on stdout, or with --json one JSON
// document (indented, one per run) for scripts. Errors and progress go to
// stderr. The JSON documents below are a stable interface: fields may be
// added, never renamed or removed. Times are RFC 3339 in UTC with
// milliseconds; durations are integers in milliseconds (_ms) or
// microseconds (_us).
//
// inspect:
//
//	{
//	  "command": "inspect",
//	  "identifier": "user:42",
//	  "policy": {"name": "api", "notation": "api: 10/s, 5000/h", "capacity": 10}, // notation: Policy.String, read back by --policy
//	  "at": "2030-01-02T03:04:05.678Z",       // when the peek was made
//	  "found": true,                          // some side holds state (a limit with used > 0)
//	  "limits_without_state": ["1000/day sliding"], // when found: limits with no state on any side
//	  "rollout": {                            // with --old and --new
//	    "group_id": "throttlekit-rollout", "bucket": 37,
//	    "new_from_percent": 37,               // the new side serves the identifier from this percentage on
//	    "percent": 10, "serving": "old"       // with --percent
//	  },
//	  "sides": [{
//	    "side": "old",                        // "main" for a single backend, else "old" / "new"
//	    "backend": "memcached",               // redis, redis-cluster, redis-groups, memcached
//	    "target": "10.0.0.1:11211",           // addresses, or "groups a,b"; no password
//	    "prefix": "tk",                       // the key prefix in effect
//	    "group": "a",                         // redis-groups: the group that owns the identifier
//	    "ok": true,
//	    "error": "...",                       // when ok is false; limits is then absent
//	    "limits": [{
//	      "name": "10/s", "algorithm": "fixed", "window_ms": 1000,
//	      "limit": 10,                        // the quota: max, or the burst for gcra
//	      "used": 3, "remaining": 7,
//	      "reset_at": "2030-01-02T03:04:06.000Z", "reset_in_ms": 322
//	    }]
//	  }]
//	}
//
// reset:
//
//	{"command": "reset", "identifier": "user:42", "policy": {...},
//	 "sides": [{"side": "old", "backend": "memcached", "target": "...", "prefix": "tk",
//	            "group": "a",               // redis-groups: the group that owns the identifier
//	            "ok": true, "error": "..."}]}
//
// cleanup:
//
//	{
//	  "command": "cleanup", "backend": "redis-cluster", "target": "10.0.0.1:7000,...",
//	  "prefix": "app-v1:", "pattern": "app-v1:*", "dry_run": false,
//	  "status": "done",                       // "done", "interrupted" or "failed"
//	  "nodes": 3, "keyspace": 1100000, "scanned": 1100000, "scan_calls": 1101,
//	  "matched": 1000000, "deleted": 1000000, "elapsed_ms": 8378,
//	  "errors": ["10.0.0.2:7000: SCAN: ..."]  // when status is "failed"
//	}
//
// explain:
//
//	{
//	  "command": "explain",
//	  "policy": {"name": "api", "notation": "api: 10/s, 5000/h gcra burst=20", "capacity": 10},
//	  "identifier": "user:42",
//	  "limits": [{
//	    "name": "5000/h gcra burst=20", "notation": "5000/h gcra burst=20", "algorithm": "gcra",
//	    "max": 5000, "window": "1h", "window_ms": 3600000,
//	    "burst": 20,                          // as given; 0 when not set
//	    "capacity": 20,                       // the largest cost: max, or the burst for gcra
//	    "emission_interval_us": 720000,      // GCRA only; 0 for window algorithms
//	    "key": ":gcra:3600000:20",            // layout 2: <escaped name>:<algorithm>:<window ms>[:<burst>], no name when unnamed
//	    "redis_key": "throttlekit:v3:{user%3A42}:api", // one hash per identifier and policy
//	    "redis_fields": ["e:gcra:3600000:20"], // the limit's fields in it: e and u (fixed), e, u and p (sliding), e (gcra)
//	    "memcached_keys": {"gcra": "tk:api:user%3A42|g::gcra:3600000:20"}
//	                                          // fixed windows: "window" and "counter" (ending ":<end>:<token>");
//	                                          // sliding windows: "sliding"
//	  }],
//	  "redis": {"prefix": "throttlekit:", "hash_tag": "{user%3A42}", "slot": 2308,
//	            "group": "a"},                // with --redis-groups
//	  "memcached": {"prefix": "tk", "route": "tk:api:user%3A42"}
//	}
//
// policy.capacity is the largest cost a request under the policy can be
// allowed: the smallest of its limits' capacities.
//
// # Exit status
//
//	0  success
//	1  a backend failed or could not be reached (the output says which side)
//	2  usage error: bad flags or arguments; nothing was done
//	3  interrupted by SIGINT or SIGTERM (cleanup prints its summary first)
//	4  inspect: no side holds any state for the identifier (every limit at full quota)
package main
