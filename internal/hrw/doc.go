// Package hrw is the rendezvous (highest random weight) hashing that both
// the memcached server selector and the sharded backend route by: every key
// goes to the node with the highest Score(Hash(key), Hash(node)).
//
// # The function
//
//	Hash(s)          = XXH64(s, seed 0)
//	Score(key, node) = XXH64(le64(key) || le64(node), seed 0)
//
// XXH64 is the maintained github.com/cespare/xxhash/v2, which go-redis
// already brings into the module. It mixes every input bit into the whole
// word, so keys that differ only in their last bytes (user:41, user:42)
// spread evenly, and hashing the pair makes one key's scores for different
// nodes independent. A key is hashed once, whatever the number of nodes.
//
// The function is identical in every process and on every platform, and
// golden values pin it: it is part of the routing contract of its users,
// and changing it moves keys between nodes.
package hrw
