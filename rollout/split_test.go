package rollout

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestMurmur3Vectors checks the hash against github.com/twmb/murmur3
// SeedSum32(0, ...), the implementation the Unleash client uses, on inputs
// that exercise every tail length.
func TestMurmur3Vectors(t *testing.T) {
	for in, want := range map[string]uint32{
		"":      0,
		"a":     0x3c2569b2,
		"ab":    0x9bbfd75f,
		"abc":   0xb3dd93fa,
		"hello": 0x248bfa47,
		"The quick brown fox jumps over the lazy dog": 0x2e4ff723,
		"ratelimit-new-backend:user:42":               0x32b4a050,
	} {
		assert.Equal(t, want, murmur3x86_32([]byte(in)), "murmur3(%q)", in)
	}
	long := string(make([]byte, 500)) // past the stack buffer
	assert.Equal(t, int(murmur3x86_32([]byte("g:"+long))%100)+1, Bucket("g", long))
}
