package shardedbackend

import "github.com/throttlekit/throttlekit/internal/hrw"

// The routing hash is part of the on-wire contract: every process that
// shares a set of shards must compute the same owner for an identifier, or
// two processes would count one identifier on two shards. It is therefore
// defined once in this module (internal/hrw, shared with the memcached
// server selector) on xxHash, whose output is fixed by its specification,
// rather than on hash/maphash (seeded at random per process). Golden values
// in the tests pin it.
// Changing it reshards every identifier.

// Score returns the rendezvous (highest-random-weight) score of the shard
// named shard for identifier. An identifier belongs to the shard with the
// highest score; two shards with equal scores (a 64-bit collision) are
// ordered by name, the smaller name winning.
//
// With H(s) = XXH64(s), the 64-bit xxHash with seed 0, and le64 the
// little-endian bytes of a 64-bit word:
//
//	Score(shard, identifier) = XXH64(le64(H(identifier)) || le64(H(shard)))
//
// xxHash spreads every input bit over the whole word, so identifiers that
// differ only in their last bytes (user:41, user:42) still land evenly. An
// identifier is hashed once, whatever the number of shards. The function is
// identical in every process and on every platform, and it is part of the
// contract of this package: changing it moves identifiers between shards.
func Score(shard, identifier string) uint64 {
	return hrw.Score(hrw.Hash(identifier), hrw.Hash(shard))
}

// Owner returns the name of the shard, among names, that owns identifier
// under rendezvous hashing (see Score), or "" when names is empty. The
// answer does not depend on the order of names. It is what a Backend over
// shards of these names routes by, and lets a deployment tool tell which
// identifiers a change of layout moves.
func Owner(names []string, identifier string) string {
	best, bestScore := -1, uint64(0)
	for i, name := range names {
		s := Score(name, identifier)
		if best < 0 || s > bestScore || s == bestScore && name < names[best] {
			best, bestScore = i, s
		}
	}
	if best < 0 {
		return ""
	}
	return names[best]
}
