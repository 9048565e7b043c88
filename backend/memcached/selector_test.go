package memcachedbackend

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// placement returns, for each key, the server PickServer chose.
func placement(t *testing.T, s memcache.ServerSelector, keys []string) []string {
	t.Helper()
	out := make([]string, len(keys))
	for i, k := range keys {
		a, err := s.PickServer(k)
		require.NoError(t, err)
		out[i] = a.String()
	}
	return out
}

// subjectKeys returns the window keys of n identifiers under one policy.
func subjectKeys(t *testing.T, n int) []string {
	t.Helper()
	p := mustPolicy(t, "api", "10/s")
	keys := make([]string, n)
	for i := range keys {
		keys[i] = newKeys(DefaultPrefix, testkit.Compile(t, p), fmt.Sprintf("user:%d", i)).window(0)
	}
	return keys
}

func TestRendezvousAddingAServerMovesAQuarter(t *testing.T) {
	servers := []string{"10.0.0.1:11211", "10.0.0.2:11211", "10.0.0.3:11211", "10.0.0.4:11211"}
	keys := subjectKeys(t, 100_000)
	sel, err := NewRendezvousSelector(servers[:3]...)
	require.NoError(t, err)
	before := placement(t, sel, keys)
	require.NoError(t, sel.SetServers(servers...))
	after := placement(t, sel, keys)

	moved, count := 0, map[string]int{}
	for i := range keys {
		count[after[i]]++
		if before[i] != after[i] {
			moved++
			assert.Equal(t, "10.0.0.4:11211", after[i], "a key moves only to the newcomer")
		}
	}
	frac := float64(moved) / float64(len(keys))
	t.Logf("moved %.2f%% of %d identifiers", 100*frac, len(keys))
	assert.InDelta(t, 0.25, frac, 0.02)
	for s, n := range count {
		assert.InDelta(t, 0.25, float64(n)/float64(len(keys)), 0.02, "share of %s", s)
	}

	// gomemcache's default selector, for comparison, moves most keys.
	var list memcache.ServerList
	require.NoError(t, list.SetServers(servers[:3]...))
	before = placement(t, &list, keys)
	require.NoError(t, list.SetServers(servers...))
	after = placement(t, &list, keys)
	moved = 0
	for i := range keys {
		if before[i] != after[i] {
			moved++
		}
	}
	t.Logf("gomemcache ServerList moved %.2f%%", 100*float64(moved)/float64(len(keys)))

	// Losing a server moves only the keys it held.
	keys = keys[:10_000]
	sel4, err := NewRendezvousSelector(servers...)
	require.NoError(t, err)
	full := placement(t, sel4, keys)
	require.NoError(t, sel4.SetServers(servers[0], servers[1], servers[3]))
	less := placement(t, sel4, keys)
	for i := range keys {
		if full[i] != "10.0.0.3:11211" {
			require.Equal(t, full[i], less[i])
		}
	}
}

func TestRendezvousRoutesBySubject(t *testing.T) {
	sel, err := NewRendezvousSelector("10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1")
	require.NoError(t, err)
	p := mustPolicy(t, "api", "10/s, 100/min aligned, 5/s gcra")
	servers := map[string]bool{}
	for i := range 200 {
		k := newKeys(DefaultPrefix, testkit.Compile(t, p), fmt.Sprintf("user:%d", i))
		all := []string{k.window(0), k.window(1), k.cas(2),
			k.counter(0, window{end: 1, token: "0123456789abcdef"}), k.counter(1, window{end: 2, token: "fedcba9876543210"})}
		first, err := sel.PickServer(all[0])
		require.NoError(t, err)
		servers[first.String()] = true
		for _, key := range all[1:] {
			a, err := sel.PickServer(key)
			require.NoError(t, err)
			require.Equal(t, first.String(), a.String(), "every key of one subject on one server")
		}
	}
	assert.Len(t, servers, 3, "subjects spread over every server")

	// The order servers are listed in does not matter.
	other, err := NewRendezvousSelector("10.0.0.3:1", "10.0.0.1:1", "10.0.0.2:1")
	require.NoError(t, err)
	keys := subjectKeys(t, 1000)
	assert.Equal(t, placement(t, sel, keys), placement(t, other, keys))
}

func TestRendezvousSelectorErrors(t *testing.T) {
	_, err := NewRendezvousSelector("10.0.0.1:1", "10.0.0.1:1")
	assert.ErrorIs(t, err, driver.ErrInvalidOption)
	_, err = NewRendezvousSelector("not an address")
	assert.ErrorIs(t, err, driver.ErrInvalidOption)

	var empty RendezvousSelector
	_, err = empty.PickServer("k")
	assert.ErrorIs(t, err, memcache.ErrNoServers)

	sel, err := NewRendezvousSelector("10.0.0.1:1", "/tmp/memcached.sock")
	require.NoError(t, err)
	var seen []string
	require.NoError(t, sel.Each(func(a net.Addr) error { seen = append(seen, a.Network()+" "+a.String()); return nil }))
	assert.Equal(t, []string{"tcp 10.0.0.1:1", "unix /tmp/memcached.sock"}, seen)
	// A failed SetServers leaves the list alone.
	assert.ErrorIs(t, sel.SetServers("bad address"), driver.ErrInvalidOption)
	a, err := sel.PickServer("x")
	require.NoError(t, err)
	assert.Contains(t, []string{"10.0.0.1:1", "/tmp/memcached.sock"}, a.String())
}

func TestRouteOf(t *testing.T) {
	p := mustPolicy(t, "p", "1/s")
	k := newKeys("tk", testkit.Compile(t, p), "a|b")
	assert.Equal(t, "tk:p:a%7Cb", routeOf(k.window(0)), "a '|' in an identifier is escaped")
	assert.Equal(t, "foreign-key", routeOf("foreign-key"))
	assert.Equal(t, driver.EscapeKey("|#"), "%7C%23")
}

// A server list that cannot reach a server (what an unset environment
// variable gives, a typo in a port) is refused by NewClient and by the
// selector, with the entry and what is wrong with it, never accepted as a
// client whose every call fails.
func TestNewClientRefusesUnusableServers(t *testing.T) {
	for _, tc := range []struct {
		name    string
		servers []string
		want    string
	}{
		{"no servers", nil, "memcached: servers: empty list"},
		{"empty entry", []string{""}, `memcached: servers[0] "": empty (an unset variable?)`},
		{"empty port", []string{"127.0.0.1:"}, `memcached: servers[0] "127.0.0.1:": no port`},
		{"no port", []string{"10.0.0.1:11211", "10.0.0.2"}, `memcached: servers[1] "10.0.0.2": want host:port`},
		{"no host", []string{":11211"}, `memcached: servers[0] ":11211": no host`},
		{"port zero", []string{"127.0.0.1:0"}, `port "0" is not a number from 1 to 65535`},
		{"port too large", []string{"127.0.0.1:65536"}, `port "65536" is not a number from 1 to 65535`},
		{"port not a number", []string{"127.0.0.1:memcache"}, `port "memcache" is not a number`},
		{"listed twice", []string{"127.0.0.1:11211", "127.0.0.1:11211"}, `servers[1]: "127.0.0.1:11211" listed twice`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := NewClient(time.Second, tc.servers...)
			assert.Nil(t, c)
			require.ErrorIs(t, err, driver.ErrInvalidOption)
			assert.Contains(t, err.Error(), tc.want)
			assert.Equal(t, 1, strings.Count(err.Error(), "throttlekit:"), err.Error())
			_, err = NewRendezvousSelector(tc.servers...)
			assert.ErrorIs(t, err, driver.ErrInvalidOption)
		})
	}
	for _, ok := range [][]string{{"127.0.0.1:11211"}, {"[::1]:11211"}, {"localhost:1", "/run/memcached.sock"}} {
		_, err := NewClient(time.Second, ok...)
		assert.NoError(t, err, "%q", ok)
	}
}
