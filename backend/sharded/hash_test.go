package shardedbackend

import (
	"encoding/binary"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestScoreGoldenValues pins the routing hash. These values are the on-wire
// contract: if this test fails, every deployment that upgrades reshards.
func TestScoreGoldenValues(t *testing.T) {
	for _, c := range []struct {
		shard, identifier string
		want              uint64
	}{
		{"a", "user:42", 0xbc8096077e636a96},
		{"b", "user:42", 0x847a895337b03ebb},
		{"c", "user:42", 0x4d47d65b938804fb},
		{"a", "", 0xe3a388c38d9cc6fa},
		{"shard-1", "ip:203.0.113.9", 0xa44c965f3bad839f},
		{"eu.west_2", "token:abc", 0x1342612a8c2f4f35},
	} {
		assert.Equalf(t, c.want, Score(c.shard, c.identifier), "Score(%q, %q)", c.shard, c.identifier)
	}
}

// TestScoreIsTheSharedRendezvousHash: the shards route by the same
// function as the memcached server selector (internal/hrw), written out
// here from its definition so a change to either is caught.
func TestScoreIsTheSharedRendezvousHash(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		id := make([]byte, rng.IntN(40))
		for i := range id {
			id[i] = byte(rng.IntN(256))
		}
		name := "s" + strconv.Itoa(rng.IntN(1000))
		var pair [16]byte
		binary.LittleEndian.PutUint64(pair[:8], xxhash.Sum64(id))
		binary.LittleEndian.PutUint64(pair[8:], xxhash.Sum64String(name))
		require.Equal(t, xxhash.Sum64(pair[:]), Score(name, string(id)))
	}
}

func TestScoreSeparatesNameFromIdentifier(t *testing.T) {
	assert.NotEqual(t, Score("a", "bc"), Score("ab", "c"))
	// What routing needs: one identifier scores differently on every shard.
	assert.NotEqual(t, Score("a", "user:42"), Score("b", "user:42"))
	// The pair is hashed in order, so swapping name and identifier
	// changes the score.
	assert.NotEqual(t, Score("a", "b"), Score("b", "a"))
}

func identifiers(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = "user:" + strconv.Itoa(i)
	}
	return ids
}

// TestKeyMovementWhenAShardJoins measures what a fourth shard joining three
// moves: about a quarter of the identifiers, all of them to the new shard.
func TestKeyMovementWhenAShardJoins(t *testing.T) {
	const n = 100_000
	oldNames := []string{"a", "b", "c"}
	newNames := []string{"a", "b", "c", "d"}
	moved, betweenOld := 0, 0
	perShard := map[string]int{}
	for _, id := range identifiers(n) {
		before, after := Owner(oldNames, id), Owner(newNames, id)
		perShard[after]++
		if before == after {
			continue
		}
		moved++
		if after != "d" {
			betweenOld++
		}
	}
	share := float64(moved) / n
	t.Logf("moved %d of %d identifiers (%.2f%%); shares after: %v", moved, n, 100*share, perShard)
	assert.InDelta(t, 0.25, share, 0.02, "share of identifiers moved")
	assert.Zero(t, betweenOld, "identifiers moved between the old shards")
	for _, name := range newNames {
		assert.InDeltaf(t, 0.25, float64(perShard[name])/n, 0.02, "share of shard %q", name)
	}
}

// TestRoutingIgnoresOrder routes the same identifiers over every ordering
// of the same shard names.
func TestRoutingIgnoresOrder(t *testing.T) {
	orders := [][]string{
		{"a", "b", "c", "d"}, {"d", "c", "b", "a"}, {"b", "d", "a", "c"}, {"c", "a", "d", "b"},
	}
	ids := identifiers(20_000)
	want := make([]string, len(ids))
	for i, id := range ids {
		want[i] = Owner(orders[0], id)
	}
	for _, order := range orders[1:] {
		b := newMemoryLayout(t, order...)
		for i, id := range ids {
			require.Equalf(t, want[i], Owner(order, id), "Owner over %v, %q", order, id)
			require.Equalf(t, want[i], b.ShardFor(id), "ShardFor over %v, %q", order, id)
		}
	}
}

// TestRemovingAShardMovesOnlyItsIdentifiers: the other side of rendezvous
// hashing; a shard leaving moves its own identifiers and nothing else.
func TestRemovingAShardMovesOnlyItsIdentifiers(t *testing.T) {
	for _, id := range identifiers(20_000) {
		before := Owner([]string{"a", "b", "c", "d"}, id)
		after := Owner([]string{"a", "b", "d"}, id)
		if before != "c" {
			require.Equal(t, before, after, id)
		}
	}
}

func TestOwnerOfNoShards(t *testing.T) {
	assert.Equal(t, "", Owner(nil, "user:1"))
}

func BenchmarkRoute(b *testing.B) {
	backend := newMemoryLayout(b, "a", "b", "c", "d", "e", "f", "g", "h")
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		_ = backend.route("user:12345678")
	}
}
