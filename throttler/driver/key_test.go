package driver_test

import (
	"encoding/base32"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

func TestAlnumKey(t *testing.T) {
	assert.Equal(t, "", driver.AlnumKey(""))
	assert.Equal(t, "elpmashq6gp0", driver.AlnumKey("user:42"), "the example in the docs")
	for _, s := range []string{"a b", "a..b", ".", "..", "%41", "A", "a", ":fixed:60000", "{x}", "\x00", "\xff\xfe"} {
		k := driver.AlnumKey(s)
		assert.Regexp(t, `^[0-9a-v]+$`, k, "%q", s)
		assert.Equal(t, (8*len(s)+4)/5, len(k), "%q", s)
	}
	long := driver.AlnumKey(strings.Repeat("\xff", driver.MaxIdentifierLen))
	assert.Len(t, long, 1639, "the bound the docs give")
}

// TestAlnumKeyInjective decodes random and near-duplicate inputs back: two
// inputs with one encoding would decode to the same bytes. Upper-casing
// the output (a store comparing without case) keeps it decodable too.
func TestAlnumKeyInjective(t *testing.T) {
	dec := base32.HexEncoding.WithPadding(base32.NoPadding)
	r := rand.New(rand.NewPCG(1, 2))
	seen := map[string]string{}
	for i := range 5000 {
		b := make([]byte, r.IntN(40))
		for j := range b {
			b[j] = byte(r.IntN(256))
			if i%2 == 0 {
				b[j] = "a.:%A"[r.IntN(5)] // near duplicates
			}
		}
		s := string(b)
		k := driver.AlnumKey(s)
		got, err := dec.DecodeString(strings.ToUpper(k))
		require.NoError(t, err, "%q", s)
		require.Equal(t, s, string(got))
		if other, ok := seen[k]; ok {
			require.Equal(t, other, s, "two inputs share %q", k)
		}
		seen[k] = s
	}
}

// natsKey is what NATS KV accepts as a key: letters, digits and -/_=. with
// '.' separating tokens that are not empty.
var natsKey = regexp.MustCompile(`^[-/_=a-zA-Z0-9]+(\.[-/_=a-zA-Z0-9]+)*$`)

// TestAlnumKeyBuildsNATSKeys builds a key per (policy, identifier, limit)
// from the parts the throttler sends, the identifiers the conformance suite
// sends among them, as BACKENDS.md shows for NATS KV: every key is valid
// there, and EscapeKey's would not be.
func TestAlnumKeyBuildsNATSKeys(t *testing.T) {
	l1, err := driver.NewLimit("", driver.FixedWindow, 10, time.Minute, 0)
	require.NoError(t, err)
	l2, err := driver.NewLimit("per user", driver.GCRA, 10, time.Second, 50)
	require.NoError(t, err)
	p, err := driver.NewPolicy("core api", l1, l2)
	require.NoError(t, err)
	keys := map[string]bool{}
	for _, id := range []string{"a b", "a..b", ".", "..", "x.", "{user}:42", "\x00\xff", strings.Repeat("é", 300)} {
		for _, l := range p.Limits {
			k := "rl." + driver.AlnumKey(p.Name) + "." + driver.AlnumKey(id) + "." + driver.AlnumKey(l.Key)
			assert.Regexp(t, natsKey, k)
			assert.False(t, keys[k], "two states share %q", k)
			keys[k] = true
			assert.NotRegexp(t, natsKey, "rl."+p.Key+"."+driver.EscapeKey(id)+"."+l.Key, "EscapeKey was enough for %q", id)
		}
	}
}
