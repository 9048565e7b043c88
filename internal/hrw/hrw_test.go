package hrw

import (
	"hash/fnv"
	"strconv"
	"testing"
)

// TestGoldenValues pins the function: a change here moves keys between
// nodes in every deployment.
func TestGoldenValues(t *testing.T) {
	for _, tt := range []struct {
		in   string
		want uint64
	}{
		{"", 0xefd01f60ba992926},
		{"a", 0x82a2a958a9bece5b},
		{"user:42", 0x998817bee6718248},
	} {
		if got := Hash(tt.in); got != tt.want {
			t.Errorf("Hash(%q) = %#x, want %#x", tt.in, got, tt.want)
		}
	}
	if got, want := Score(Hash("user:42"), Hash("shard-a")), uint64(0x9b0aaf0bb54c9491); got != want {
		t.Errorf("Score = %#x, want %#x", got, want)
	}
}

// TestHashIsFNV1aThenFmix64 checks the FNV-1a half against the standard
// library and the finalizer against MurmurHash3's published fmix64 of 1.
func TestHashIsFNV1aThenFmix64(t *testing.T) {
	for _, s := range []string{"", "a", "user:42", "\x00\xff"} {
		f := fnv.New64a()
		f.Write([]byte(s))
		if got, want := Hash(s), fmix64(f.Sum64()); got != want {
			t.Errorf("Hash(%q) = %#x, want fmix64(FNV-1a) = %#x", s, got, want)
		}
	}
	if got, want := fmix64(1), uint64(0xb456bcfc34c2cb2c); got != want {
		t.Errorf("fmix64(1) = %#x, want %#x", got, want)
	}
}

// TestEvenShares: 100,000 keys over four nodes land within a point of 25%.
func TestEvenShares(t *testing.T) {
	nodes := []uint64{Hash("a"), Hash("b"), Hash("c"), Hash("d")}
	counts := make([]int, len(nodes))
	const n = 100000
	for i := 0; i < n; i++ {
		k := Hash("user:" + strconv.Itoa(i))
		best := 0
		for j := range nodes {
			if Score(k, nodes[j]) > Score(k, nodes[best]) {
				best = j
			}
		}
		counts[best]++
	}
	for j, c := range counts {
		if share := float64(c) / n; share < 0.24 || share > 0.26 {
			t.Errorf("node %d holds %.2f%% of keys", j, 100*share)
		}
	}
}
