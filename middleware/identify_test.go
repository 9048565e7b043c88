package middleware_test

import (
	"context"
	"github.com/throttlekit/throttlekit/throttler/driver"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/middleware"
)

func request(remote string, header http.Header) *http.Request {
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r.RemoteAddr = remote
	for name, values := range header {
		for _, v := range values {
			r.Header.Add(name, v)
		}
	}
	return r
}

func xff(values ...string) http.Header { return http.Header{"X-Forwarded-For": values} }
func fwd(values ...string) http.Header { return http.Header{"Forwarded": values} }

func mustTrust(t *testing.T, cidrs ...string) []netip.Prefix {
	t.Helper()
	p, err := middleware.TrustProxies(cidrs...)
	require.NoError(t, err)
	return p
}

// TestClientIPForwardedFor walks X-Forwarded-For from trusted and untrusted
// peers, well-formed and not.
func TestClientIPForwardedFor(t *testing.T) {
	trusted := mustTrust(t, "10.0.0.0/8", "192.0.2.1", "2001:db8:ff::/48")
	identify := middleware.ClientIP(middleware.ClientIPOptions{TrustedProxies: trusted})
	const proxy = "10.0.0.1:4000"
	tests := []struct {
		name, remote string
		header       http.Header
		want         string
	}{
		{"untrusted peer, no header", "203.0.113.9:1234", nil, "203.0.113.9"},
		{"untrusted peer, spoofed header", "203.0.113.9:1234", xff("198.51.100.7"), "203.0.113.9"},
		{"trusted peer, no header", proxy, nil, "10.0.0.1"},
		{"trusted peer, one hop", proxy, xff("198.51.100.7"), "198.51.100.7"},
		{"single trusted address", "192.0.2.1:80", xff("198.51.100.7"), "198.51.100.7"},
		{"next to single trusted address", "192.0.2.2:80", xff("198.51.100.7"), "192.0.2.2"},
		{"client spoof left of the real client", proxy, xff("1.1.1.1, 198.51.100.7, 10.0.0.5"), "198.51.100.7"},
		{"every hop trusted", proxy, xff("10.0.0.9, 10.0.0.5"), "10.0.0.9"},
		{"several header lines", proxy, xff("1.1.1.1", "198.51.100.7"), "198.51.100.7"},
		{"garbage left of the client is never read", proxy, xff("garbage, 198.51.100.7"), "198.51.100.7"},
		{"malformed hop", proxy, xff("garbage"), "10.0.0.1"},
		{"malformed hop after a trusted one", proxy, xff("garbage, 10.0.0.5"), "10.0.0.1"},
		{"empty entry", proxy, xff("198.51.100.7,,10.0.0.5"), "10.0.0.1"},
		{"empty header", proxy, xff(""), "10.0.0.1"},
		{"ipv4 with port", proxy, xff("198.51.100.7:5555"), "198.51.100.7"},
		{"ipv6 bare", proxy, xff("2001:db8::1"), "2001:db8::1"},
		{"ipv6 bracketed with port", proxy, xff("[2001:db8::1]:80"), "2001:db8::1"},
		{"ipv6 bracketed", proxy, xff("[2001:db8::1]"), "2001:db8::1"},
		{"ipv6 zone dropped", proxy, xff("fe80::1%eth0"), "fe80::1"},
		{"mapped ipv4 unmapped", proxy, xff("::ffff:198.51.100.7"), "198.51.100.7"},
		{"mapped trusted peer", "[::ffff:10.0.0.1]:80", xff("198.51.100.7"), "198.51.100.7"},
		{"trusted ipv6 proxy", "[2001:db8:ff::1]:443", xff("198.51.100.7, 2001:db8:ff::2"), "198.51.100.7"},
		{"port out of range", proxy, xff("198.51.100.7:99999"), "10.0.0.1"},
		{"unknown", proxy, xff("unknown"), "10.0.0.1"},
		{"forwarded ignored in xff mode", proxy, fwd("for=198.51.100.7"), "10.0.0.1"},
		{"remote without port", "203.0.113.9", nil, "203.0.113.9"},
		{"remote ipv6", "[2001:db8::9]:1234", nil, "2001:db8::9"},
		{"unix socket", "@", xff("198.51.100.7"), "@"},
		{"no remote address", "", nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, identify(request(tc.remote, tc.header)))
		})
	}
}

// TestClientIPForwarded reads RFC 7239 Forwarded for= nodes.
func TestClientIPForwarded(t *testing.T) {
	identify := middleware.ClientIP(middleware.ClientIPOptions{
		TrustedProxies: mustTrust(t, "10.0.0.0/8"), Header: middleware.Forwarded})
	const proxy = "10.0.0.1:4000"
	tests := []struct {
		name   string
		header http.Header
		want   string
	}{
		{"token", fwd("for=198.51.100.7"), "198.51.100.7"},
		{"quoted ipv4 with port", fwd(`for="198.51.100.7:4711"`), "198.51.100.7"},
		{"quoted ipv6 with port", fwd(`for="[2001:db8:cafe::17]:4711"`), "2001:db8:cafe::17"},
		{"quoted ipv6", fwd(`for="[2001:db8:cafe::17]"`), "2001:db8:cafe::17"},
		{"name is case-insensitive", fwd("For=198.51.100.7;proto=https"), "198.51.100.7"},
		{"other parameters", fwd("proto=https;for=198.51.100.7;by=10.0.0.1;host=example.com"), "198.51.100.7"},
		{"chain", fwd("for=1.1.1.1, for=198.51.100.7, for=10.0.0.5"), "198.51.100.7"},
		{"several lines", fwd("for=1.1.1.1", "for=198.51.100.7"), "198.51.100.7"},
		{"quoted comma and escape", fwd(`for=1.1.1.1;host="a,b\"c", for=198.51.100.7`), "198.51.100.7"},
		{"every hop trusted", fwd("for=10.0.0.9, for=10.0.0.5"), "10.0.0.9"},
		{"unknown node", fwd("for=unknown"), "10.0.0.1"},
		{"obfuscated node", fwd("for=_hidden"), "10.0.0.1"},
		{"unterminated quote", fwd(`for="198.51.100.7`), "10.0.0.1"},
		{"client's broken quote swallows the proxy's entry", fwd(`for="`, "for=198.51.100.7"), "10.0.0.1"},
		{"element without for", fwd("proto=https"), "10.0.0.1"},
		{"for twice in one element", fwd("for=1.2.3.4;for=198.51.100.7"), "10.0.0.1"},
		{"pair without value", fwd("for"), "10.0.0.1"},
		{"empty value", fwd("for="), "10.0.0.1"},
		{"stray quote in token", fwd(`for=1.2"3.4`), "10.0.0.1"},
		{"dangling escape", fwd(`for="1.2.3.4\`), "10.0.0.1"},
		{"bare ipv6 tolerated", fwd(`for="2001:db8::1"`), "2001:db8::1"},
		{"x-forwarded-for ignored in forwarded mode", xff("198.51.100.7"), "10.0.0.1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, identify(request(proxy, tc.header)))
		})
	}
}

// TestClientIPv6Prefix groups IPv6 clients by network.
func TestClientIPv6Prefix(t *testing.T) {
	identify := middleware.ClientIP(middleware.ClientIPOptions{IPv6PrefixLen: 64})
	assert.Equal(t, "2001:db8:1:2::/64", identify(request("[2001:db8:1:2:3:4:5:6]:80", nil)))
	assert.Equal(t, "2001:db8:1:2::/64", identify(request("[2001:db8:1:2:ffff::1]:80", nil)))
	assert.Equal(t, "203.0.113.9", identify(request("203.0.113.9:80", nil)), "IPv4 untouched")
	assert.Equal(t, "203.0.113.9", identify(request("[::ffff:203.0.113.9]:80", nil)), "mapped IPv4 untouched")
}

func TestTrustProxies(t *testing.T) {
	got, err := middleware.TrustProxies("10.1.2.3/8", " 192.0.2.7 ", "::1", "2001:db8::/32")
	require.NoError(t, err)
	assert.Equal(t, []netip.Prefix{
		netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.0.2.7/32"),
		netip.MustParsePrefix("::1/128"), netip.MustParsePrefix("2001:db8::/32"),
	}, got)
	for _, bad := range []string{"", "10.0.0.0/33", "example.com", "fe80::1%eth0", "10.0.0.0/8/8"} {
		_, err := middleware.TrustProxies(bad)
		assert.ErrorIs(t, err, driver.ErrInvalidOption, bad)
	}
	// A zero prefix trusts nothing rather than everything.
	identify := middleware.ClientIP(middleware.ClientIPOptions{TrustedProxies: []netip.Prefix{{}}})
	assert.Equal(t, "10.0.0.1", identify(request("10.0.0.1:1", xff("198.51.100.7"))))
}

// TestClientIPNeverPanics feeds random bytes to both header parsers from a
// trusted peer: the answer is always the peer or a parsed address.
func TestClientIPNeverPanics(t *testing.T) {
	trusted := mustTrust(t, "10.0.0.0/8")
	parsers := []middleware.IdentifierFunc{
		middleware.ClientIP(middleware.ClientIPOptions{TrustedProxies: trusted}),
		middleware.ClientIP(middleware.ClientIPOptions{TrustedProxies: trusted, Header: middleware.Forwarded}),
	}
	alphabet := []byte(`0123456789abcdef.:[]%,;="\ _forFOR` + "\t\x00\xff")
	rng := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		b := make([]byte, rng.IntN(40))
		for i := range b {
			b[i] = alphabet[rng.IntN(len(alphabet))]
		}
		for _, identify := range parsers {
			h := http.Header{"X-Forwarded-For": {string(b)}, "Forwarded": {string(b)}}
			got := identify(request("10.0.0.1:1", h))
			if got != "10.0.0.1" {
				_, err := netip.ParseAddr(got)
				assert.NoError(t, err, "header %q gave %q", b, got)
			}
		}
	}
}

// FuzzClientIP checks the same property on fuzzed input; plain `go test`
// runs its seeds.
func FuzzClientIP(f *testing.F) {
	for _, seed := range []string{"198.51.100.7", `for="[2001:db8::1]:1", for=1.2.3.4`, `for="`, ",,", "unknown"} {
		f.Add(seed)
	}
	trusted, err := middleware.TrustProxies("10.0.0.0/8")
	if err != nil {
		f.Fatal(err)
	}
	xffIP := middleware.ClientIP(middleware.ClientIPOptions{TrustedProxies: trusted})
	fwdIP := middleware.ClientIP(middleware.ClientIPOptions{TrustedProxies: trusted, Header: middleware.Forwarded})
	f.Fuzz(func(t *testing.T, v string) {
		h := http.Header{"X-Forwarded-For": {v}, "Forwarded": {v}}
		for _, identify := range []middleware.IdentifierFunc{xffIP, fwdIP} {
			got := identify(request("10.0.0.1:1", h))
			if got == "10.0.0.1" {
				continue
			}
			if _, err := netip.ParseAddr(got); err != nil {
				t.Fatalf("header %q gave %q", v, got)
			}
		}
	})
}

type stringer struct{ s string }

func (s stringer) String() string { return s.s }

type ctxKey struct{}

func TestContextIdentifiers(t *testing.T) {
	with := func(v any) *http.Request {
		r := httptest.NewRequest(http.MethodGet, "/", nil)
		return r.WithContext(context.WithValue(r.Context(), ctxKey{}, v))
	}
	id := middleware.ContextValue(ctxKey{})
	assert.Equal(t, "u1", id(with("u1")))
	assert.Equal(t, "u2", id(with(stringer{"u2"})))
	assert.Equal(t, "42", id(with(42)))
	assert.Equal(t, "43", id(with(int64(43))))
	assert.Equal(t, "44", id(with(uint64(44))))
	assert.Equal(t, "", id(with(3.5)), "unsupported type: not applicable")
	assert.Equal(t, "", id(httptest.NewRequest(http.MethodGet, "/", nil)))

	user := middleware.User(func(ctx context.Context) (string, bool) {
		s, ok := ctx.Value(ctxKey{}).(string)
		return s, ok
	})
	assert.Equal(t, "alice", user(with("alice")))
	assert.Equal(t, "", user(with(1)))
	assert.Equal(t, "", middleware.User(nil)(with("alice")))

	hdr := middleware.Header("X-Api-Key")
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	assert.Equal(t, "", hdr(r))
	r.Header.Set("X-Api-Key", "  key  ")
	assert.Equal(t, "key", hdr(r))
	hashed := middleware.Hashed(hdr)
	assert.Equal(t, "2c70e12b7a0646f92279f427c7b38e7334d8e5389cff167a1dc30e73f826b683", hashed(r))
	assert.Equal(t, "", hashed(httptest.NewRequest(http.MethodGet, "/", nil)))

	unless := middleware.Unless(hdr, user)
	assert.Equal(t, "key", unless(r))
	r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, "alice"))
	assert.Equal(t, "", unless(r))
	assert.Equal(t, "Forwarded", middleware.Forwarded.String())
	assert.Equal(t, "X-Forwarded-For", strings.TrimSpace(middleware.XForwardedFor.String()))
}
