package memcachedbackend

import (
	"context"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// nastyIdentifiers are identifiers memcached could not take as they are,
// or that differ only where a careless encoding would merge them.
func nastyIdentifiers() []string {
	long := strings.Repeat("x", driver.MaxIdentifierLen-1)
	ff := strings.Repeat("\xff", driver.MaxIdentifierLen)
	return []string{
		long + "a", long + "b", // 1024 bytes, differing in the last byte
		ff, ff[:driver.MaxIdentifierLen-1] + "\xfe",
		"with space", "with\nnewline", "with\x00nul", "with\rcr", "\x7f", "tab\there",
		"a b", "a_b", "a%20b", "a%2520b",
		"pipe|route", "hash#mark", "colon:sep", "{tag}",
		"#" + strings.Repeat("0", 64), // looks like a hashed part
		"a", "A",
	}
}

func TestKeysAreLegalForEveryInput(t *testing.T) {
	longName := strings.Repeat("n", 500)
	policies := []*throttler.Policy{
		mustPolicy(t, "p", "10/s, 5/min aligned, 3/s gcra burst=9"),
		mustPolicy(t, longName, "10/s"),
		mustPolicy(t, "p p\x00", "10/s"),
	}
	named, err := throttler.NewPolicy("named", []throttler.Limit{
		throttler.PerSecond(5).Named(longName + "1"),
		throttler.PerSecond(5).Named(longName + "2"),
		throttler.PerSecond(5).Named("a b\n"),
	})
	require.NoError(t, err)
	policies = append(policies, named)
	extremes := []window{{end: math.MinInt64, token: "ffffffffffffffff"}, {end: math.MaxInt64, token: "0000000000000000"}}

	seen := map[string]string{}
	for _, prefix := range []string{DefaultPrefix, strings.Repeat("p ", 9) + "pppp"} {
		b, err := New(dummyClient(), WithPrefix(prefix))
		require.NoError(t, err)
		for _, p := range policies {
			for _, id := range nastyIdentifiers() {
				k := newKeys(b.prefix, testkit.Compile(t, p), id)
				for i := range len(p.Limits()) {
					for _, key := range []string{k.window(i), k.cas(i), k.counter(i, extremes[0]), k.counter(i, extremes[1])} {
						require.True(t, legalKey(key), "illegal key %q (%d bytes)", key, len(key))
						whose := prefix + "\x00" + p.Name() + "\x00" + id + "\x00" + testkit.Compile(t, p).Limits[i].Key
						if prev, dup := seen[key]; dup {
							require.Equal(t, prev, whose, "two subjects share key %q", key)
						}
						seen[key] = whose
					}
				}
			}
		}
	}
	// Two limits whose names differ only after the plain budget: hashed
	// apart.
	k := newKeys(DefaultPrefix, testkit.Compile(t, named), "u")
	assert.NotEqual(t, k.window(0), k.window(1))
	assert.True(t, strings.Contains(k.window(0), "|w:#"), "long limit part hashed: %s", k.window(0))
}

func TestHashedAndPlainPartsNeverCollide(t *testing.T) {
	p := mustPolicy(t, "p", "1/s")
	long := strings.Repeat("y", 200)
	hashed := newKeys("tk", testkit.Compile(t, p), long).route
	require.True(t, strings.HasPrefix(hashed, "#"), "a long route is hashed: %s", hashed)
	require.Len(t, hashed, 65)
	for _, id := range nastyIdentifiers() {
		if r := newKeys("tk", testkit.Compile(t, p), id).route; !strings.HasPrefix(r, "#") {
			assert.NotContains(t, r, "#", "a plain route never holds the hash marker")
		}
	}
	// An identifier spelling a hashed route is escaped, so it differs.
	assert.NotEqual(t, hashed, newKeys("tk", testkit.Compile(t, p), hashed).route)
	assert.NotEqual(t, hashed, newKeys("", testkit.Compile(t, p), hashed[1:]).route)
}

func TestNastyIdentifiersKeepSeparateState(t *testing.T) {
	b, _ := newTestBackend(t, sharedAddrs(t, 1))
	thr, _ := newThrottler(t, b)
	ctx := context.Background()
	p := mustPolicy(t, "sep", "1/min, 1/min gcra")
	ids := nastyIdentifiers()
	for _, id := range ids {
		r, err := thr.Allow(ctx, p, id)
		require.NoError(t, err)
		require.False(t, r.Degraded, "%q: %v", id, r.Err)
		assert.True(t, r.Allowed, "first request of %q: no state shared with another identifier", id)
	}
	for _, id := range ids {
		r, err := thr.Allow(ctx, p, id)
		require.NoError(t, err)
		assert.False(t, r.Allowed, "second request of %q sees its own state", id)
	}
}

func TestParseWindowRejectsForeignValues(t *testing.T) {
	for _, v := range []string{"", "1", "1 ", "x 0123456789abcdef", "1 0123456789ABCDEF", "1 0123456789abcde", "1 0123456789abcdef0"} {
		_, ok := parseWindow([]byte(v))
		assert.False(t, ok, "%q", v)
	}
	w, ok := parseWindow(window{end: -5, token: "0123456789abcdef"}.encode())
	require.True(t, ok)
	assert.Equal(t, int64(-5), w.end)
	n, ok := parseInt([]byte("42   "))
	assert.True(t, ok, "decr pads with spaces")
	assert.Equal(t, int64(42), n)
}

// legalKey reports whether memcached accepts key: at most MaxKeyLen bytes,
// none of them a space or a control byte.
func legalKey(key string) bool {
	if len(key) == 0 || len(key) > MaxKeyLen {
		return false
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}

// ItemKeys names the items a backend with the same prefix stores, for
// every algorithm, and refuses what New would refuse.
func TestItemKeys(t *testing.T) {
	p := testkit.Compile(t, testkit.Policy(t, "core", "10/s, 100/min aligned, 50/h gcra, 300/10min sliding"))
	items, err := ItemKeys("app", p, "user 7")
	require.NoError(t, err)
	k := newKeys(driver.EscapeKey("app"), p, "user 7")
	require.Equal(t, k.route, items.Route)
	require.Len(t, items.Limits, 4)
	for i := range 2 {
		require.Equal(t, LimitItems{Window: k.window(i), CounterStem: k.item(kindCounter, i)}, items.Limits[i])
		require.Equal(t, k.counter(i, window{end: 42, token: "0123456789abcdef"}), items.Limits[i].CounterStem+":42:0123456789abcdef")
	}
	require.Equal(t, LimitItems{State: k.route + "|g:" + k.limits[2]}, items.Limits[2])
	require.Equal(t, LimitItems{State: k.route + "|s:" + k.limits[3]}, items.Limits[3])

	// Key layout 2: an unnamed limit's part is its algorithm and window
	// alone, so a Max raised or lowered keeps the items; a named one
	// starts with its escaped name, and a GCRA burst set explicitly ends
	// it.
	require.Equal(t, "app:core:user%207", items.Route)
	require.Equal(t, "app:core:user%207|w::fixed:1000", items.Limits[0].Window)
	require.Equal(t, "app:core:user%207|c::fixed:1000", items.Limits[0].CounterStem)
	require.Equal(t, "app:core:user%207|w::aligned:60000", items.Limits[1].Window)
	require.Equal(t, "app:core:user%207|g::gcra:3600000", items.Limits[2].State)
	require.Equal(t, "app:core:user%207|s::sliding:600000", items.Limits[3].State)
	raised, err := ItemKeys("app", testkit.Compile(t, testkit.Policy(t, "core", "20/s, 100/min aligned, 50/h gcra, 300/10min sliding")), "user 7")
	require.NoError(t, err)
	require.Equal(t, items, raised, "Max is no part of a key")
	named, err := throttler.NewPolicy("core", []throttler.Limit{
		throttler.PerSecond(10).Named("per second"),
		throttler.PerHour(50).WithBurst(9),
	})
	require.NoError(t, err)
	namedItems, err := ItemKeys("app", testkit.Compile(t, named), "user 7")
	require.NoError(t, err)
	require.Equal(t, "app:core:user%207|w:per%20second:fixed:1000", namedItems.Limits[0].Window)
	require.Equal(t, "app:core:user%207|g::gcra:3600000:9", namedItems.Limits[1].State)

	def, err := ItemKeys("", p, "u")
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(def.Route, DefaultPrefix+":"), def.Route)

	_, err = ItemKeys(strings.Repeat("x", MaxPrefixLen+1), p, "u")
	require.ErrorIs(t, err, driver.ErrInvalidOption)
	_, err = ItemKeys("app", nil, "u")
	require.ErrorIs(t, err, driver.ErrInvalidPolicy)
}
