package memcachedbackend

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// Key layout limits. memcached accepts keys of at most MaxKeyLen bytes; the
// budget below keeps the longest key this package builds under it:
//
//	route (<= maxRoutePart) + "|c:" + limit (<= maxLimitPart)
//	+ ":" + window end (<= 20 bytes with its sign) + ":" + token (16 hex)
//	= 120 + 3 + 65 + 1 + 20 + 1 + 16 = 226 bytes.
const (
	// MaxKeyLen is memcached's limit on the length of a key.
	MaxKeyLen = 250
	// RouteSeparator ends the routing part of every key this package
	// builds. RendezvousSelector hashes only what precedes it, so every
	// key of one identifier under one policy lands on one server. It is
	// never produced by driver.EscapeKey nor by the hex of a hash.
	RouteSeparator = '|'

	// hashMarker starts a part replaced by its SHA-256: EscapeKey never
	// produces '#', so a hashed part can never equal a plain one.
	hashMarker = '#'
	// maxRoutePart and maxLimitPart bound the plain forms; longer parts
	// are hashed ("#" + 64 hex digits, 65 bytes).
	maxRoutePart = 120
	maxLimitPart = 65
)

// The kinds of item kept for one limit.
const (
	kindWindow  = "w" // fixed window: "end token" of the open window
	kindCounter = "c" // fixed window: units used in one window
	kindGCRA    = "g" // GCRA: theoretical arrival time in µs
	kindSliding = "s" // sliding window: "used:end:prev"
)

// keys holds the stored names of one identifier's state under one policy.
type keys struct {
	// limits[i] is the key part naming the policy's i-th limit.
	limits []string
	// casKinds[i] is the kind of the i-th limit's compare-and-swap item
	// (GCRA or sliding window); empty for fixed windows.
	casKinds []string
	// route is the routing part shared by every key of the subject.
	route string
}

// newKeys builds the key parts for id under p, with prefix already escaped.
func newKeys(prefix string, p *driver.Policy, id string) keys {
	route := prefix + ":" + p.Key + ":" + driver.EscapeKey(id)
	k := keys{route: shorten(route, maxRoutePart), limits: make([]string, len(p.Limits)),
		casKinds: make([]string, len(p.Limits))}
	for i := range k.limits {
		k.limits[i] = shorten(p.Limits[i].Key, maxLimitPart)
		switch p.Limits[i].Algorithm {
		case driver.GCRA:
			k.casKinds[i] = kindGCRA
		case driver.SlidingWindow:
			k.casKinds[i] = kindSliding
		}
	}
	return k
}

// shorten returns s, or its hashed form when s is longer than max bytes.
func shorten(s string, max int) string {
	if len(s) <= max {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	return string(hashMarker) + hex.EncodeToString(sum[:])
}

// item returns the key of the i-th limit's item of the given kind.
func (k keys) item(kind string, i int) string {
	return k.route + string(RouteSeparator) + kind + ":" + k.limits[i]
}

// window returns the key of the i-th limit's window item.
func (k keys) window(i int) string { return k.item(kindWindow, i) }

// cas returns the key of the i-th limit's compare-and-swap item: its GCRA
// or sliding-window state.
func (k keys) cas(i int) string { return k.item(k.casKinds[i], i) }

// counter returns the key of the counter of one window incarnation.
func (k keys) counter(i int, w window) string {
	return k.item(kindCounter, i) + ":" + strconv.FormatInt(w.end, 10) + ":" + w.token
}

// window is one incarnation of a fixed window: its end in Unix ms and the
// random token of the request that opened it. The token tells apart two
// incarnations with the same end (an aligned window reopened after its
// counter was evicted, or an anchored one reopened within the same
// millisecond), so a counter is never shared by two incarnations.
type window struct {
	end   int64
	token string
}

// tokenLen is the length of a window token: 64 random bits in hex.
const tokenLen = 16

// encode returns the window item's value.
func (w window) encode() []byte {
	return []byte(strconv.FormatInt(w.end, 10) + " " + w.token)
}

// forwardPrefix starts the value of a counter whose window a Seed
// replaced: the prefix, then the successor's "end token" (see "Seeding").
// memcached refuses to incr or decr a value that is not a number, so
// nobody can count in a forwarded counter.
const forwardPrefix = "fwd "

// forward returns the value of a counter forwarded to incarnation w.
func (w window) forward() []byte {
	return append([]byte(forwardPrefix), w.encode()...)
}

// parseForward reads a forwarded counter's value; ok is false when v is
// not one.
func parseForward(v []byte) (w window, ok bool) {
	rest, found := strings.CutPrefix(string(v), forwardPrefix)
	if !found {
		return window{}, false
	}
	return parseWindow([]byte(rest))
}

// parseWindow reads a window item's value; ok is false when it is not one
// this package wrote.
func parseWindow(v []byte) (w window, ok bool) {
	endText, token, found := strings.Cut(string(v), " ")
	if !found || len(token) != tokenLen || !isLowerHex(token) {
		return window{}, false
	}
	end, err := strconv.ParseInt(endText, 10, 64)
	if err != nil {
		return window{}, false
	}
	return window{end: end, token: token}, true
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// parseInt reads a counter or TAT value; memcached counters are unsigned
// 64-bit decimals, possibly padded with spaces after a decr.
func parseInt(v []byte) (int64, bool) {
	n, err := strconv.ParseInt(strings.TrimRight(string(v), " "), 10, 64)
	return n, err == nil
}

// routeOf returns the routing part of a key: what precedes RouteSeparator,
// or the whole key when it has none.
func routeOf(key string) string {
	if i := strings.IndexByte(key, RouteSeparator); i >= 0 {
		return key[:i]
	}
	return key
}

// Items names the memcached items that hold one identifier's state under
// a policy, as a Backend with the same prefix stores them: what an
// operator's tool looks up or deletes (cmd/throttlekit's explain prints
// them).
type Items struct {
	// Route is the part every key of the identifier starts with; the
	// server selector places the identifier's items by it.
	Route string
	// Limits holds, for each of the policy's limits in order, the keys of
	// its items.
	Limits []LimitItems
}

// LimitItems names the items of one limit. A fixed window (anchored or
// aligned) has Window and CounterStem; a GCRA or sliding-window limit has
// State alone.
type LimitItems struct {
	// Window is the fixed window's item, "end token" of the window open.
	Window string
	// CounterStem starts the keys of the window's counters: the counter
	// of the window ending at end (Unix ms) and opened with token is
	// CounterStem ":" end ":" token, holding the units used in it.
	CounterStem string
	// State is the compare-and-swap item of a GCRA limit (the theoretical
	// arrival time in Unix µs) or of a sliding window ("used:end:prev").
	State string
}

// ItemKeys returns the items a Backend made with WithPrefix(prefix)
// stores for identifier under p ("" for DefaultPrefix). It contacts no
// server. The error wraps driver.ErrInvalidOption for a prefix New would
// refuse, and driver.ErrInvalidPolicy for a nil or zero policy.
func ItemKeys(prefix string, p *driver.Policy, identifier string) (Items, error) {
	if prefix == "" {
		prefix = DefaultPrefix
	}
	if len(driver.EscapeKey(prefix)) > MaxPrefixLen {
		return Items{}, driver.Errorf("%w: prefix longer than %d bytes once escaped", driver.ErrInvalidOption, MaxPrefixLen)
	}
	if !p.Valid() {
		return Items{}, driver.Errorf("%w: nil or zero policy", driver.ErrInvalidPolicy)
	}
	k := newKeys(driver.EscapeKey(prefix), p, identifier)
	out := Items{Route: k.route, Limits: make([]LimitItems, len(p.Limits))}
	for i := range p.Limits {
		if k.casKinds[i] != "" {
			out.Limits[i].State = k.cas(i)
			continue
		}
		out.Limits[i].Window = k.window(i)
		out.Limits[i].CounterStem = k.item(kindCounter, i)
	}
	return out, nil
}
