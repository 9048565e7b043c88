package driver

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Algorithm selects how a limit counts.
type Algorithm int

const (
	// FixedWindow is a fixed window anchored at the first request that
	// finds no open window; it closes Window later (GitHub's algorithm).
	FixedWindow Algorithm = iota
	// AlignedWindow is a fixed window aligned on the multiples of Window
	// since the Unix epoch, so every identifier's window closes together.
	AlignedWindow
	// GCRA is the generic cell rate algorithm: a smooth rate of Max per
	// Window with a burst capacity.
	GCRA
	// SlidingWindow is the sliding-window counter: two adjacent windows
	// aligned on the multiples of Window, the previous one's count weighted
	// by the share of it that the window ending at now still covers. Smooth
	// like GCRA, with the "Max per Window" meaning of a fixed window.
	SlidingWindow
)

// String returns the algorithm's name in the limit notation: "fixed",
// "aligned", "gcra" or "sliding".
func (a Algorithm) String() string {
	switch a {
	case FixedWindow:
		return "fixed"
	case AlignedWindow:
		return "aligned"
	case GCRA:
		return "gcra"
	case SlidingWindow:
		return "sliding"
	}
	return "Algorithm(" + strconv.Itoa(int(a)) + ")"
}

// Bounds on what a throttler decides. Every stored time and count stays an
// exact integer in a float64, which is what Redis Lua computes with.
const (
	// MaxIdentifierLen is the longest identifier, in bytes.
	MaxIdentifierLen = 1024
	// MinWindow is the shortest window a limit may have.
	MinWindow = time.Millisecond
	// MaxWindow is the longest window a limit may have (400 days).
	MaxWindow = 400 * 24 * time.Hour
	// MaxQuota bounds Max and the GCRA burst.
	MaxQuota = int64(1) << 40
	// MaxUnixMilli is the latest clock reading a throttler decides with,
	// 2200-01-01T00:00:00Z in Unix milliseconds; the earliest is the epoch.
	// Its Unix microseconds stay below 2^53.
	MaxUnixMilli = int64(7258118400000)
	// maxGCRASpanMicros bounds burst times the emission interval, so that a
	// theoretical arrival time stays far below 2^53 microseconds.
	maxGCRASpanMicros = int64(10 * MaxWindow / time.Microsecond)
	// maxSlidingProduct bounds Max × WindowMillis of a sliding window, so
	// that its weighted count, computed as the exact integer
	// Used×Window + Prev×(End - now), stays below 2^53.
	maxSlidingProduct = int64(1)<<52 - 1
)

// ClockInRange reports whether now lies between the Unix epoch and
// MaxUnixMilli, both included. It compares the whole reading: UnixMilli
// floors, so a reading up to 999,999 ns after the bound has the bound's
// millisecond and a comparison of milliseconds alone would accept it.
func ClockInRange(now time.Time) bool {
	ms := now.UnixMilli()
	if ms < 0 || ms > MaxUnixMilli {
		return false
	}
	return ms < MaxUnixMilli || now.Nanosecond()%int(time.Millisecond) == 0
}

// Limit is one limit of a Policy as a backend reads it: the user's quota
// and, precomputed by NewLimit, every figure the algorithms need. Backends
// treat it as read-only.
type Limit struct {
	// Name identifies the limit within its policy.
	Name string
	// Algorithm selects the counting rule.
	Algorithm Algorithm
	// Max is the number of units per window.
	Max int64
	// Window is the window length, whole milliseconds.
	Window time.Duration
	// Capacity is the largest cost one request may have: Max for fixed
	// windows, the burst for GCRA.
	Capacity int64
	// WindowMillis is Window in milliseconds.
	WindowMillis int64
	// EmissionMicros is GCRA's emission interval T = ceil(Window / Max) in
	// microseconds, rounded up so the rate never exceeds the nominal one.
	// It is computed for every algorithm.
	EmissionMicros int64
	// Burst is the GCRA burst as the limit was defined: 0 when it follows
	// Max (Capacity is then Max), and always 0 for the other algorithms.
	Burst int64
	// Named reports that the limit was given a name; an unnamed limit's
	// Name is its notation, as in "10/s".
	Named bool
	// Key is the limit's storage identity: its name when it was given one
	// (escaped with EscapeKey; empty for an unnamed limit), its algorithm,
	// its window in milliseconds and, for GCRA, its burst when one was set:
	//
	//	<escaped name>:<algorithm>:<window ms>[:<burst>]
	//
	// Max is never part of it, so raising or lowering Max keeps the state of
	// the open window, for every algorithm, named or not (docs/SPEC.md,
	// Policies redefined 1). Two limits whose keys differ never share
	// stored state. KeyV1 gives the key of the layout before version 2.
	// It holds ':' and, from a name, any byte EscapeKey writes ('%', '.'):
	// a store whose keys refuse those encodes it whole, with AlnumKey.
	Key string
}

// KeyLayout is the version of the limit key layout Limit.Key follows.
// Version 1 held an unnamed limit's notation, Max included, and a GCRA
// limit's capacity; version 2 holds neither (see Limit.Key).
const KeyLayout = 2

// KeyV1 returns the key layout 1 gave l: its name (an unnamed limit's
// notation, Max included), algorithm and window and, for GCRA, its
// capacity. Stores written before layout 2 hold their states under it; a
// key-layout rollout reads them there (see the rollout package).
func KeyV1(l *Limit) string {
	k := EscapeKey(l.Name) + ":" + l.Algorithm.String() + ":" + strconv.FormatInt(l.WindowMillis, 10)
	if l.Algorithm == GCRA {
		k += ":" + strconv.FormatInt(l.Capacity, 10)
	}
	return k
}

// NewLimit returns the limit of max units per window counted by alg, with
// the given GCRA burst (0 means max; it must be 0 for fixed windows). An
// unnamed limit (an empty name, or its own notation) is shown by its
// notation, as in "10/s", and stored under its window and algorithm alone.
// The error wraps ErrInvalidLimit.
func NewLimit(name string, alg Algorithm, max int64, window time.Duration, burst int64) (Limit, error) {
	l := Limit{Name: name, Algorithm: alg, Max: max, Window: window, Capacity: max}
	if alg == GCRA && burst != 0 {
		l.Capacity = burst
	}
	bad := func(format string, args ...any) (Limit, error) {
		return Limit{}, Errorf("%w: %s: %s", ErrInvalidLimit, Notation(alg, max, window, burst), fmt.Sprintf(format, args...))
	}
	switch {
	case max < 1 || max > MaxQuota:
		return bad("max must be between 1 and %d", MaxQuota)
	case window < MinWindow || window > MaxWindow:
		return bad("window must be between %v and %v", MinWindow, MaxWindow)
	case window%time.Millisecond != 0:
		return bad("window must be a whole number of milliseconds")
	case alg < FixedWindow || alg > SlidingWindow:
		return bad("unknown algorithm %d", int(alg))
	case burst < 0 || burst > MaxQuota:
		return bad("burst must be between 0 (meaning max) and %d", MaxQuota)
	case burst != 0 && alg != GCRA:
		return bad("burst applies only to gcra")
	}
	l.WindowMillis = window.Milliseconds()
	if alg == SlidingWindow && max > maxSlidingProduct/l.WindowMillis {
		return bad("max times window in milliseconds exceeds %d, so the weighted count would not be exact", maxSlidingProduct)
	}
	l.EmissionMicros = (int64(window/time.Microsecond) + max - 1) / max
	if alg == GCRA && l.Capacity > maxGCRASpanMicros/l.EmissionMicros {
		return bad("burst times emission interval exceeds %v", time.Duration(maxGCRASpanMicros)*time.Microsecond)
	}
	// A limit named after its own notation is an unnamed one, so that a
	// policy rebuilt from the limits another reports keeps their keys.
	l.Burst, l.Named = burst, l.Name != "" && l.Name != Notation(alg, max, window, burst)
	if !l.Named {
		l.Name = Notation(alg, max, window, burst)
	}
	var key []byte
	if l.Named {
		key = AppendEscapedKey(key, l.Name)
	}
	key = append(key, ':')
	key = append(key, alg.String()...)
	key = append(key, ':')
	key = strconv.AppendInt(key, l.WindowMillis, 10)
	if burst != 0 {
		key = append(key, ':')
		key = strconv.AppendInt(key, burst, 10)
	}
	l.Key = string(key)
	return l, nil
}

// Notation writes a limit the way the throttler's parser reads it: "10/s",
// "100/2h", "50/min aligned", "10/s gcra burst=20".
func Notation(alg Algorithm, max int64, window time.Duration, burst int64) string {
	var b strings.Builder
	b.WriteString(strconv.FormatInt(max, 10))
	b.WriteByte('/')
	b.WriteString(formatWindow(window))
	switch alg {
	case FixedWindow:
	case GCRA:
		b.WriteString(" gcra")
		if burst != 0 {
			b.WriteString(" burst=")
			b.WriteString(strconv.FormatInt(burst, 10))
		}
	default:
		b.WriteByte(' ')
		b.WriteString(alg.String())
	}
	return b.String()
}

// WindowUnits lists the window units of the limit notation with their
// lengths, longest first.
var windowUnits = [...]struct {
	name string
	d    time.Duration
}{
	{"week", 7 * 24 * time.Hour},
	{"day", 24 * time.Hour},
	{"h", time.Hour},
	{"min", time.Minute},
	{"s", time.Second},
	{"ms", time.Millisecond},
}

func formatWindow(d time.Duration) string {
	if d <= 0 {
		return d.String()
	}
	for _, u := range windowUnits {
		if d%u.d == 0 {
			if n := d / u.d; n != 1 {
				return strconv.FormatInt(int64(n), 10) + u.name
			}
			return u.name
		}
	}
	return d.String()
}

// Policy is a named, ordered set of limits decided together, as a backend
// reads it. The throttler builds one per user policy, once; backends treat
// it as read-only and may cache per-policy work keyed by its pointer.
type Policy struct {
	// Name is the policy's name.
	Name string
	// Key is the name escaped with EscapeKey (a store that needs letters
	// and digits only uses AlnumKey(Name) instead).
	Key string
	// Limits holds the limits, in order.
	Limits []Limit
	// Capacity is the smallest of the limits' capacities: the largest cost
	// any request under the policy can ever be allowed.
	Capacity int64
}

// NewPolicy returns the policy named name over limits, each built by
// NewLimit. The error wraps ErrInvalidPolicy.
func NewPolicy(name string, limits ...Limit) (*Policy, error) {
	if name == "" {
		return nil, Errorf("%w: empty name", ErrInvalidPolicy)
	}
	if len(limits) == 0 {
		return nil, Errorf("%w: %q has no limits", ErrInvalidPolicy, name)
	}
	p := &Policy{Name: name, Key: EscapeKey(name), Limits: append([]Limit(nil), limits...)}
	seen := make(map[string]bool, len(limits))
	keys := make(map[string]string, len(limits))
	for i, l := range p.Limits {
		if l.Key == "" || l.EmissionMicros == 0 {
			return nil, Errorf("%w: %q: limit %d was not built by NewLimit", ErrInvalidPolicy, name, i)
		}
		if seen[l.Name] {
			return nil, Errorf("%w: %q has two limits named %q", ErrInvalidPolicy, name, l.Name)
		}
		seen[l.Name] = true
		if other, dup := keys[l.Key]; dup {
			return nil, Errorf("%w: %q: limits %q and %q count the same window with the same algorithm; name them to keep them apart", ErrInvalidPolicy, name, other, l.Name)
		}
		keys[l.Key] = l.Name
		if i == 0 || l.Capacity < p.Capacity {
			p.Capacity = l.Capacity
		}
	}
	return p, nil
}

// Valid reports whether p was built by NewPolicy (a nil or zero Policy is
// not).
func (p *Policy) Valid() bool { return p != nil && len(p.Limits) > 0 && p.Capacity > 0 }
