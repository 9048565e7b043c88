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
//
// # Configuration string
//
// Open and Parse read a layout from one string, for instance
// an environment variable:
//
//	a=redis://10.0.0.1:6379?replica=redis://10.0.0.2:6379,b=redis://10.0.0.3:6379?replica=redis://10.0.0.4:6379
//
// Grammar (whitespace around entries, names and URLs is ignored):
//
//	config  = group *( "," group )
//	group   = name "=" url
//	name    = 1*64( ALPHA / DIGIT / "." / "_" / "-" )
//	url     = a URL go-redis's ParseURL reads (redis://, rediss://, unix://),
//	          whose query may also hold "replica=" parameters, one per replica
//
// The other query parameters of a group URL are go-redis options
// (dial_timeout, read_timeout, max_retries, db...); they apply to the
// primary and to every replica of the group, as do the primary's database
// and, unless a replica URL has its own, its user name and password.
// context_timeout_enabled may be given, but only as true: every client has
// it set. A replica URL holds only a scheme (redis or rediss beside a TCP
// primary, unix beside a socket), optional user info and an address,
// written as it would be on its own (or percent-encoded whole). A ','
// inside a URL is written %2C.
//
// Every malformed or ambiguous configuration is an error wrapping
// driver.ErrInvalidOption that names the offending entry by its position and
// says what is wrong, quoting no part of the string (a password with an
// unescaped ',', '#', '/', '?' or '@' would split it anywhere): no
// groups, an empty entry, a missing '=', an empty, invalid or duplicate
// name, a URL go-redis rejects (scheme, port, database, unknown
// parameter), a context_timeout_enabled other than true or 1, a replica URL
// with a path, query or fragment, a replica with its primary's address,
// and one address used twice, within a group or by two groups. Addresses
// are compared as written; host names are not resolved.
package redisgroups
