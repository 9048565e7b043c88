// Package keyslot computes the Redis Cluster hash slot of a key, for the
// tools and tests that group keys by slot without asking a server.
package keyslot
