package throttler

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Algorithm selects how a Limit counts.
type Algorithm int

const (
	// FixedWindow is a fixed window anchored at the first request that
	// finds no open window; it closes Window later. It is the default and
	// the algorithm GitHub's API limiter uses.
	FixedWindow Algorithm = iota
	// AlignedWindow is a fixed window aligned on the multiples of Window
	// since the Unix epoch, so every identifier's window closes together.
	AlignedWindow
	// GCRA is the generic cell rate algorithm: a smooth rate of Max per
	// Window with a burst capacity of Burst.
	GCRA
)

// String returns the algorithm's name as ParseLimit accepts it.
func (a Algorithm) String() string {
	switch a {
	case FixedWindow:
		return "fixed"
	case AlignedWindow:
		return "aligned"
	case GCRA:
		return "gcra"
	}
	return "Algorithm(" + strconv.Itoa(int(a)) + ")"
}

// Bounds on a Limit's fields.
const (
	// MinWindow is the shortest window a limit may have.
	MinWindow = time.Millisecond
	// MaxWindow is the longest window a limit may have (400 days).
	MaxWindow = 400 * 24 * time.Hour
	// MaxQuota bounds Max and Burst. It keeps every stored number an exact
	// integer in a float64, which is what Redis Lua computes with.
	MaxQuota = int64(1) << 40
	// maxGCRASpanMicros bounds Burst times the emission interval, so that a
	// theoretical arrival time stays far below 2^53 microseconds.
	maxGCRASpanMicros = int64(10 * MaxWindow / time.Microsecond)
)

// Limit is a quota of Max units per Window, counted by Algorithm. The zero
// Algorithm is FixedWindow. Build limits with PerSecond, PerMinute, Per and
// friends, or with ParseLimit; a Limit is validated when it joins a Policy.
type Limit struct {
	// Name identifies the limit within its policy and in stored keys. When
	// empty, the policy names it after its notation (String), e.g. "10/s".
	Name string
	// Max is the number of units per window, 1 to MaxQuota.
	Max int64
	// Window is the window length: whole milliseconds from MinWindow to
	// MaxWindow.
	Window time.Duration
	// Algorithm selects the counting rule.
	Algorithm Algorithm
	// Burst is the GCRA capacity; zero means Max. It must be zero for the
	// fixed-window algorithms.
	Burst int64
}

// Per returns a fixed-window limit of max units per window.
func Per(max int64, window time.Duration) Limit { return Limit{Max: max, Window: window} }

// PerSecond returns a fixed-window limit of max units per second.
func PerSecond(max int64) Limit { return Per(max, time.Second) }

// PerMinute returns a fixed-window limit of max units per minute.
func PerMinute(max int64) Limit { return Per(max, time.Minute) }

// PerHour returns a fixed-window limit of max units per hour.
func PerHour(max int64) Limit { return Per(max, time.Hour) }

// PerDay returns a fixed-window limit of max units per 24 hours.
func PerDay(max int64) Limit { return Per(max, 24*time.Hour) }

// PerWeek returns a fixed-window limit of max units per 7 days.
func PerWeek(max int64) Limit { return Per(max, 7*24*time.Hour) }

// Named returns a copy of l with the given name.
func (l Limit) Named(name string) Limit { l.Name = name; return l }

// Using returns a copy of l counted by algorithm a.
func (l Limit) Using(a Algorithm) Limit { l.Algorithm = a; return l }

// WithBurst returns a copy of l as a GCRA limit with burst capacity b.
func (l Limit) WithBurst(b int64) Limit { l.Algorithm = GCRA; l.Burst = b; return l }

// capacity is the largest cost a single request may have.
func (l Limit) capacity() int64 {
	if l.Algorithm == GCRA && l.Burst > 0 {
		return l.Burst
	}
	return l.Max
}

// Validate reports whether l can be enforced. The error wraps
// ErrInvalidLimit.
func (l Limit) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s: %s", ErrInvalidLimit, l.String(), fmt.Sprintf(format, args...))
	}
	switch {
	case l.Max < 1 || l.Max > MaxQuota:
		return bad("max must be between 1 and %d", MaxQuota)
	case l.Window < MinWindow || l.Window > MaxWindow:
		return bad("window must be between %v and %v", MinWindow, MaxWindow)
	case l.Window%time.Millisecond != 0:
		return bad("window must be a whole number of milliseconds")
	case l.Algorithm < FixedWindow || l.Algorithm > GCRA:
		return bad("unknown algorithm %d", int(l.Algorithm))
	case l.Burst < 0 || l.Burst > MaxQuota:
		return bad("burst must be between 0 (meaning max) and %d", MaxQuota)
	case l.Burst != 0 && l.Algorithm != GCRA:
		return bad("burst applies only to GCRA")
	}
	if l.Algorithm == GCRA {
		t := emissionMicros(l)
		if b := l.capacity(); b > maxGCRASpanMicros/t {
			return bad("burst times emission interval exceeds %v", time.Duration(maxGCRASpanMicros)*time.Microsecond)
		}
	}
	return nil
}

// emissionMicros is the GCRA emission interval T = ceil(Window / Max) in
// microseconds, rounded up so the rate never exceeds the nominal one.
func emissionMicros(l Limit) int64 {
	w := int64(l.Window / time.Microsecond)
	return (w + l.Max - 1) / l.Max
}

// String returns the limit in the notation ParseLimit reads, e.g. "10/s",
// "100/2h", "50/min aligned" or "10/s gcra burst=20".
func (l Limit) String() string {
	var b strings.Builder
	b.WriteString(strconv.FormatInt(l.Max, 10))
	b.WriteByte('/')
	b.WriteString(formatWindow(l.Window))
	switch l.Algorithm {
	case FixedWindow:
	case GCRA:
		b.WriteString(" gcra")
		if l.Burst != 0 {
			b.WriteString(" burst=")
			b.WriteString(strconv.FormatInt(l.Burst, 10))
		}
	default:
		b.WriteByte(' ')
		b.WriteString(l.Algorithm.String())
	}
	return b.String()
}

// windowUnits lists the units of the notation, longest first so that
// formatWindow picks the largest unit that divides a window.
var windowUnits = []struct {
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

// unitAliases maps every unit spelling ParseLimit accepts to its length.
var unitAliases = map[string]time.Duration{
	"ms": time.Millisecond, "msec": time.Millisecond, "millisecond": time.Millisecond, "milliseconds": time.Millisecond,
	"s": time.Second, "sec": time.Second, "secs": time.Second, "second": time.Second, "seconds": time.Second,
	"m": time.Minute, "min": time.Minute, "mins": time.Minute, "minute": time.Minute, "minutes": time.Minute,
	"h": time.Hour, "hr": time.Hour, "hrs": time.Hour, "hour": time.Hour, "hours": time.Hour,
	"d": 24 * time.Hour, "day": 24 * time.Hour, "days": 24 * time.Hour,
	"w": 7 * 24 * time.Hour, "wk": 7 * 24 * time.Hour, "week": 7 * 24 * time.Hour, "weeks": 7 * 24 * time.Hour,
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

// ParseLimit reads a limit written as "MAX/WINDOW", optionally followed by
// options separated by spaces:
//
//	10/s   120/min   5000/h   300000/day   1500000/week   100/2h   5/250ms
//	60/min aligned          fixed window aligned on the epoch
//	10/s gcra               GCRA with burst = max
//	10/s gcra burst=50      GCRA with burst 50
//
// Units: ms, s (sec, second), m (min, minute), h (hr, hour), d (day),
// w (wk, week), with plurals. There is no month: calendar months have no
// fixed length; write 30d. Errors wrap ErrInvalidLimit.
func ParseLimit(s string) (Limit, error) {
	fail := func(why string) (Limit, error) {
		return Limit{}, fmt.Errorf("%w: %q: %s", ErrInvalidLimit, s, why)
	}
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return fail("empty")
	}
	maxText, windowText, ok := strings.Cut(fields[0], "/")
	if !ok {
		return fail(`want MAX/WINDOW, such as "10/s"`)
	}
	max, err := strconv.ParseInt(maxText, 10, 64)
	if err != nil || max < 1 {
		return fail("max must be a positive whole number")
	}
	window, err := parseWindow(windowText)
	if err != nil {
		return fail(err.Error())
	}
	l := Per(max, window)
	for _, opt := range fields[1:] {
		key, value, hasValue := strings.Cut(strings.ToLower(opt), "=")
		switch {
		case key == "fixed" && !hasValue:
			l.Algorithm = FixedWindow
		case key == "aligned" && !hasValue:
			l.Algorithm = AlignedWindow
		case key == "gcra" && !hasValue:
			l.Algorithm = GCRA
		case key == "burst" && hasValue:
			b, err := strconv.ParseInt(value, 10, 64)
			if err != nil || b < 1 {
				return fail("burst must be a positive whole number")
			}
			l.Burst = b
		default:
			return fail(fmt.Sprintf("unknown option %q (want aligned, gcra or burst=N)", opt))
		}
	}
	if l.Burst != 0 && l.Algorithm != GCRA {
		return fail("burst applies only to gcra")
	}
	if err := l.Validate(); err != nil {
		return Limit{}, err
	}
	return l, nil
}

func parseWindow(text string) (time.Duration, error) {
	i := 0
	for i < len(text) && text[i] >= '0' && text[i] <= '9' {
		i++
	}
	count := int64(1)
	if i > 0 {
		n, err := strconv.ParseInt(text[:i], 10, 64)
		if err != nil || n < 1 {
			return 0, fmt.Errorf("window count %q must be a positive whole number", text[:i])
		}
		count = n
	}
	unit, ok := unitAliases[strings.ToLower(text[i:])]
	if !ok {
		return 0, fmt.Errorf("unknown window unit %q (want ms, s, min, h, day or week)", text[i:])
	}
	if count > int64(MaxWindow/unit) {
		return 0, fmt.Errorf("window longer than %v", MaxWindow)
	}
	return time.Duration(count) * unit, nil
}
