package middleware

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"

	"github.com/throttlekit/throttlekit/internal/quoted"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// IdentifierFunc names what a request is limited by: its client IP, its API
// token, its user. An empty string means the subject does not apply to this
// request (no user is signed in, no token was sent): the subject is skipped,
// neither charged nor shown in the headers.
type IdentifierFunc func(r *http.Request) string

// ForwardingHeader selects the header trusted proxies use to pass on the
// client's address.
type ForwardingHeader int

const (
	// XForwardedFor is the de facto X-Forwarded-For list of addresses.
	XForwardedFor ForwardingHeader = iota
	// Forwarded is RFC 7239's Forwarded header; its for= parameters are read.
	Forwarded
)

// String returns the header's name.
func (f ForwardingHeader) String() string {
	if f == Forwarded {
		return "Forwarded"
	}
	return "X-Forwarded-For"
}

// ClientIPOptions configures ClientIP.
type ClientIPOptions struct {
	// TrustedProxies are the networks of the proxies whose forwarding header
	// is believed. Empty (the default) trusts nobody: the identifier is the
	// connection's peer address and forwarding headers are ignored. Invalid
	// prefixes trust nothing.
	TrustedProxies []netip.Prefix
	// Header is the one forwarding header the trusted proxies set. Only one
	// is read: a proxy that appends to X-Forwarded-For passes a client's
	// forged Forwarded header through untouched, and the other way round.
	Header ForwardingHeader
	// IPv6PrefixLen, from 1 to 127, limits IPv6 clients by their network of
	// that length (64 is usual: one subscriber often holds a whole /64)
	// instead of by address. 0, the default, uses the whole address.
	IPv6PrefixLen int
}

// TrustProxies parses CIDR prefixes ("10.0.0.0/8", "2001:db8::/32") and
// single addresses ("192.0.2.7", "::1") into a TrustedProxies list. The
// error wraps driver.ErrInvalidOption.
func TrustProxies(cidrs ...string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(cidrs))
	for _, c := range cidrs {
		c = strings.TrimSpace(c)
		if p, err := netip.ParsePrefix(c); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(c)
		if err != nil || a.Zone() != "" {
			return nil, driver.Errorf("%w: trusted proxy %q is neither a CIDR prefix nor an address", driver.ErrInvalidOption, c)
		}
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// ClientIP returns an IdentifierFunc that names the client's IP address.
//
// The connection's peer (Request.RemoteAddr) is the client unless it is a
// trusted proxy. Then the forwarding header is walked from the right, the
// entry the nearest proxy added first, skipping every trusted address; the
// first untrusted address is the client. If every entry is trusted, the
// leftmost is the client. Entries left of the client are never parsed: they
// are whatever the client chose to send. A malformed entry met on the walk
// (unparseable, "unknown", an obfuscated RFC 7239 node), a malformed
// Forwarded header, or an absent header makes the peer address the
// identifier: nothing a client sends can make it anyone else.
//
// IPv4-mapped IPv6 addresses are written as IPv4 and zones are dropped, so
// one client has one identifier. A RemoteAddr that holds no IP address (a
// Unix socket) is used as it is.
func ClientIP(opts ClientIPOptions) IdentifierFunc {
	c := clientIP{header: opts.Header, ipv6Bits: opts.IPv6PrefixLen}
	for _, p := range opts.TrustedProxies {
		if !p.IsValid() {
			continue
		}
		if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		c.trusted = append(c.trusted, p.Masked())
	}
	return c.identify
}

type clientIP struct {
	trusted  []netip.Prefix
	header   ForwardingHeader
	ipv6Bits int
}

func (c clientIP) identify(r *http.Request) string {
	peer, ok := parseHost(r.RemoteAddr)
	if !ok {
		return strings.TrimSpace(r.RemoteAddr)
	}
	client := peer
	if c.isTrusted(peer) {
		if a, ok := c.walk(r.Header); ok {
			client = a
		}
	}
	return c.format(client)
}

func (c clientIP) isTrusted(a netip.Addr) bool {
	for _, p := range c.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// walk finds the client in the forwarding header, as ClientIP describes.
func (c clientIP) walk(h http.Header) (netip.Addr, bool) {
	var hops []string
	var ok bool
	if c.header == Forwarded {
		hops, ok = forwardedFor(h.Values("Forwarded"))
	} else {
		hops, ok = xForwardedFor(h.Values("X-Forwarded-For"))
	}
	if !ok || len(hops) == 0 {
		return netip.Addr{}, false
	}
	for i := len(hops) - 1; i >= 0; i-- {
		a, ok := parseHost(hops[i])
		if !ok {
			return netip.Addr{}, false
		}
		if i == 0 || !c.isTrusted(a) {
			return a, true
		}
	}
	return netip.Addr{}, false
}

func (c clientIP) format(a netip.Addr) string {
	if a.Is6() && c.ipv6Bits > 0 && c.ipv6Bits < 128 {
		return netip.PrefixFrom(a, c.ipv6Bits).Masked().String()
	}
	return a.String()
}

// parseHost reads an address written as "ip", "ip:port", "[ipv6]" or
// "[ipv6]:port"; it returns the address unmapped and without zone.
func parseHost(s string) (netip.Addr, bool) {
	s = strings.TrimSpace(s)
	if s == "" {
		return netip.Addr{}, false
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return normalize(ap.Addr()), true
	}
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		s = s[1 : len(s)-1]
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, false
	}
	return normalize(a), true
}

func normalize(a netip.Addr) netip.Addr { return a.Unmap().WithZone("") }

// xForwardedFor splits X-Forwarded-For lines into their entries, in order.
// An empty entry makes the header malformed.
func xForwardedFor(lines []string) ([]string, bool) {
	var hops []string
	for _, line := range lines {
		for _, e := range strings.Split(line, ",") {
			e = strings.TrimSpace(e)
			if e == "" {
				return nil, false
			}
			hops = append(hops, e)
		}
	}
	return hops, true
}

// forwardedFor returns the for= node of each element of RFC 7239 Forwarded
// lines, in order. An element without for=, or any syntax error, makes the
// header malformed: a comma inside a quoted string cannot be told from a
// separator once quoting has gone wrong.
func forwardedFor(lines []string) ([]string, bool) {
	var hops []string
	for _, line := range lines {
		elements, ok := splitQuoted(line, ',')
		if !ok {
			return nil, false
		}
		for _, el := range elements {
			node, found := "", false
			pairs, ok := splitQuoted(el, ';')
			if !ok {
				return nil, false
			}
			for _, pair := range pairs {
				name, value, hasValue := strings.Cut(strings.TrimSpace(pair), "=")
				if !hasValue {
					return nil, false
				}
				if !strings.EqualFold(strings.TrimSpace(name), "for") {
					continue
				}
				v, ok := unquote(strings.TrimSpace(value))
				if !ok || found {
					return nil, false
				}
				node, found = v, true
			}
			if !found {
				return nil, false
			}
			hops = append(hops, node)
		}
	}
	return hops, true
}

// splitQuoted splits s at sep outside double-quoted strings, honouring
// backslash escapes inside them. It reports false for an unterminated
// string.
func splitQuoted(s string, sep byte) ([]string, bool) {
	parts, closed := quoted.Split(s, quoted.Byte(sep))
	if !closed {
		return nil, false
	}
	return parts, true
}

// unquote returns an RFC 7230 token or quoted-string value, unescaped.
func unquote(v string) (string, bool) {
	if !strings.HasPrefix(v, `"`) {
		return v, v != "" && !strings.ContainsAny(v, "\" \t")
	}
	if len(v) < 2 || !strings.HasSuffix(v, `"`) {
		return "", false
	}
	var b strings.Builder
	inner := v[1 : len(v)-1]
	for i := 0; i < len(inner); i++ {
		c := inner[i]
		if c == '\\' {
			if i+1 == len(inner) {
				return "", false
			}
			i++
			c = inner[i]
		} else if c == '"' {
			return "", false
		}
		b.WriteByte(c)
	}
	return b.String(), true
}

// Header returns an IdentifierFunc that names the request by the value of
// header name (an API key, say), trimmed of spaces. A missing or blank
// header means the subject does not apply. Wrap it in Hashed to keep raw
// secrets out of the store's keys.
func Header(name string) IdentifierFunc {
	return func(r *http.Request) string { return strings.TrimSpace(r.Header.Get(name)) }
}

// User returns an IdentifierFunc that names the authenticated user as found
// by lookup in the request's context, typically put there by an
// authentication middleware that runs first. lookup's false, or an empty
// name, means no user: the subject does not apply.
func User(lookup func(context.Context) (string, bool)) IdentifierFunc {
	return func(r *http.Request) string {
		if lookup == nil {
			return ""
		}
		id, ok := lookup(r.Context())
		if !ok {
			return ""
		}
		return id
	}
}

// ContextValue returns an IdentifierFunc that names the request by the
// context value stored under key: a string, a fmt.Stringer or an integer.
// Any other value, or none, means the subject does not apply.
func ContextValue(key any) IdentifierFunc {
	return func(r *http.Request) string {
		switch v := r.Context().Value(key).(type) {
		case string:
			return v
		case fmt.Stringer:
			return v.String()
		case int:
			return strconv.Itoa(v)
		case int64:
			return strconv.FormatInt(v, 10)
		case uint64:
			return strconv.FormatUint(v, 10)
		}
		return ""
	}
}

// Hashed returns an IdentifierFunc that names the request by the SHA-256 of
// what f names, in hex, so that API tokens never reach the store or its
// logs in the clear. An empty name stays empty.
func Hashed(f IdentifierFunc) IdentifierFunc {
	return func(r *http.Request) string {
		id := f(r)
		if id == "" {
			return ""
		}
		sum := sha256.Sum256([]byte(id))
		return hex.EncodeToString(sum[:])
	}
}

// Unless returns an IdentifierFunc that names the request as f does, but
// only when other names nothing. Unless(ClientIP(...), userFunc) limits
// anonymous requests by IP and leaves signed-in users to their own
// subject, as GitHub does.
func Unless(f, other IdentifierFunc) IdentifierFunc {
	return func(r *http.Request) string {
		if other(r) != "" {
			return ""
		}
		return f(r)
	}
}
