package hrw

import (
	"encoding/binary"

	"github.com/cespare/xxhash/v2"
)

// Hash returns the 64-bit xxHash of s.
func Hash(s string) uint64 { return xxhash.Sum64String(s) }

// Score returns the weight of a node for a key, from their hashes. The
// node with the highest score owns the key.
func Score(keyHash, nodeHash uint64) uint64 {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], keyHash)
	binary.LittleEndian.PutUint64(b[8:], nodeHash)
	return xxhash.Sum64(b[:])
}
