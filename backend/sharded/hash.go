package sharded

// The routing hash is part of the on-wire contract: every process that
// shares a set of shards must compute the same owner for an identifier, or
// two processes would count one identifier on two shards. It is therefore
// written out here rather than taken from hash/maphash (seeded at random per
// process) or any package whose output might change with a version bump.
// Changing a single constant below reshards every identifier.

const (
	// FNV-1a, 64 bits (FNV's published offset basis and prime).
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211

	// nameSeparator ends the shard name in the hashed bytes. Shard names
	// never contain it (see validName), so the pair (name, identifier)
	// maps to one byte string: "a"+"bc" and "ab"+"c" hash apart.
	nameSeparator = 0x00
)

// Score returns the rendezvous (highest-random-weight) score of the shard
// named shard for identifier. An identifier belongs to the shard with the
// highest score; two shards with equal scores (a 64-bit collision) are
// ordered by name, the smaller name winning.
//
// The score is MurmurHash3's 64-bit finalizer (fmix64) applied to the
// FNV-1a 64 hash of the shard name's bytes, one zero byte, and the
// identifier's bytes:
//
//	h = 14695981039346656037
//	for each byte c of name, then 0x00, then identifier:
//	    h = (h XOR c) * 1099511628211           (mod 2^64)
//	h ^= h >> 33; h *= 0xff51afd7ed558ccd
//	h ^= h >> 33; h *= 0xc4ceb93fe53e1a49
//	h ^= h >> 33
//
// FNV-1a alone mixes its last bytes poorly into the high bits, and
// identifiers often differ only in their last bytes (user:41, user:42); the
// finalizer spreads every input bit over the whole word, so the shares of
// the shards come out even. The function is identical in every process and
// on every platform, and it is part of the contract of this package:
// changing it moves identifiers between shards.
func Score(shard, identifier string) uint64 {
	return finish(continueFNV(seed(shard), identifier))
}

// seed returns the FNV-1a state after the shard name and the separator,
// which a shard computes once so that routing hashes only the identifier.
func seed(shard string) uint64 {
	h := continueFNV(fnvOffset64, shard)
	h ^= nameSeparator
	h *= fnvPrime64
	return h
}

// continueFNV feeds s to the FNV-1a state h.
func continueFNV(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime64
	}
	return h
}

// finish is MurmurHash3's fmix64.
func finish(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb93fe53e1a49
	h ^= h >> 33
	return h
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
