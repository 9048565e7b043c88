package hrw

import (
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
		{"", 0xef46db3751d8e999},
		{"a", 0xd24ec4f1a98c6e5b},
		{"user:42", 0xdc1fea7da8d2d1c2},
	} {
		if got := Hash(tt.in); got != tt.want {
			t.Errorf("Hash(%q) = %#x, want %#x", tt.in, got, tt.want)
		}
	}
	if got, want := Score(Hash("user:42"), Hash("shard-a")), uint64(0x4b3219075519e241); got != want {
		t.Errorf("Score = %#x, want %#x", got, want)
	}
}

// TestHashIsXXH64 checks Hash against xxHash's published value for the
// empty input.
func TestHashIsXXH64(t *testing.T) {
	if got, want := Hash(""), uint64(0xef46db3751d8e999); got != want {
		t.Errorf("Hash(\"\") = %#x, want XXH64 of nothing %#x", got, want)
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
