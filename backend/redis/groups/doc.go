// Package redisgroups is the go-redis half of client-side sharding: it
// reads a layout of named primary/replica Redis groups from one connection
// string, opens a client and a redisbackend.Backend per server, and routes
// identifiers over the groups with shardedbackend (rendezvous hashing on
// the group names, so replacing a server moves no identifier).
//
//	b, err := redisgroups.Open("a=redis://10.0.0.1:6379?replica=redis://10.0.0.2:6379,b=redis://10.0.0.3:6379")
//	th, err := throttler.New(b)
//	defer b.Close()
//
// Decisions, refunds and resets go to the owning group's primary; peeks to
// one of its replicas, whose stale windows the throttler ignores. A group
// whose primary is down degrades only the identifiers it owns. Errors wrap
// driver.ErrInvalidOption and never contain any part of a password.
package redisgroups
