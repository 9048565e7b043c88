// Package hrw is the rendezvous (highest random weight) hashing that both
// the memcached server selector and the sharded backend route by: every key
// goes to the node with the highest Score(Hash(key), Hash(node)).
//
// # The function
//
//	Hash(s)        = fmix64(FNV-1a-64(s))
//	Score(key, node) = fmix64(key ^ node)
//
// FNV-1a is the 64-bit variant (offset 14695981039346656037, prime
// 1099511628211); fmix64 is MurmurHash3's 64-bit finalizer (shifts of 33,
// multipliers 0xff51afd7ed558ccd and 0xc4ceb9fe1a85ec53). FNV-1a alone mixes
// its last bytes poorly into the high bits, and keys often differ only
// there (user:41, user:42); the finalizer spreads every input bit over the
// whole word, so nodes get even shares, and applying it again to the XOR
// makes one key's scores for different nodes independent. A key is hashed
// once, whatever the number of nodes.
//
// The function is identical in every process and on every platform. It is
// part of the routing contract of its users: changing it moves keys between
// nodes.
package hrw

// Hash returns fmix64 of the 64-bit FNV-1a hash of s.
func Hash(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return fmix64(h)
}

// Score returns the weight of a node for a key, from their hashes. The
// node with the highest score owns the key.
func Score(keyHash, nodeHash uint64) uint64 { return fmix64(keyHash ^ nodeHash) }

// fmix64 is MurmurHash3's 64-bit finalizer.
func fmix64(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}
