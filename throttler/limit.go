package throttler

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/throttlekit/throttlekit/internal/quoted"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// Algorithm selects how a Limit counts: FixedWindow (the default),
// AlignedWindow, GCRA or SlidingWindow.
type Algorithm = driver.Algorithm

// The algorithms. docs/SPEC.md gives their exact arithmetic.
const (
	// FixedWindow opens a window at the first request that finds none open;
	// it closes Window later. It is GitHub's algorithm and the default.
	FixedWindow = driver.FixedWindow
	// AlignedWindow's windows end at the multiples of Window since the Unix
	// epoch, so every identifier's window closes together.
	AlignedWindow = driver.AlignedWindow
	// GCRA allows a smooth rate of Max per Window with a burst capacity of
	// Burst (Max when zero).
	GCRA = driver.GCRA
	// SlidingWindow counts two adjacent windows aligned on the epoch,
	// weighting the previous one by how much of it the last Window still
	// covers: smooth like GCRA, with the "Max per Window" meaning of a
	// fixed window. Max × Window in milliseconds must stay below 2^52.
	SlidingWindow = driver.SlidingWindow
)

// Limit is a quota of Max units per Window, counted by Algorithm. Build one
// with Per and its shorthands or ParseLimit, or as a literal; it is
// validated when it joins a policy. Max and Burst may be 1 to 2^40, Window
// 1 ms to 400 days in whole milliseconds.
type Limit struct {
	// Name identifies the limit within its policy and in stored keys. An
	// unnamed limit (empty Name) is shown by its notation, as in "10/s",
	// and stored under its window and algorithm only (and, for GCRA, its
	// Burst when set), so that raising or lowering Max keeps the state of
	// the open window. A Name that is itself a limit notation, such as the
	// "10/s" Policy.Limits reports for an unnamed limit, names nothing: the
	// limit counts as unnamed, so a policy rebuilt from another's Limits,
	// with Max changed or not, keeps its stored state. Give a name to keep
	// apart two limits of one window and algorithm in one policy.
	Name string
	// Max is the number of units per window.
	Max int64
	// Window is the window length.
	Window time.Duration
	// Algorithm selects the counting rule; the zero value is FixedWindow.
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

// Named returns a copy of l with the given name.
func (l Limit) Named(name string) Limit { l.Name = name; return l }

// Using returns a copy of l counted by algorithm a.
func (l Limit) Using(a Algorithm) Limit { l.Algorithm = a; return l }

// WithBurst returns a copy of l as a GCRA limit with burst capacity b.
func (l Limit) WithBurst(b int64) Limit { l.Algorithm = GCRA; l.Burst = b; return l }

// String returns the limit in the notation ParseLimit reads back to an
// equal Limit, such as "10/s", "100/2h", "50/min aligned", "10/s gcra
// burst=20" or, for a named limit, "10/s name=per-sec" (the name comes
// last). A Name that is a limit notation names nothing and is left out.
func (l Limit) String() string {
	n := driver.Notation(l.Algorithm, l.Max, l.Window, l.Burst)
	if l.Name == "" || isNotation(l.Name) {
		return n
	}
	return n + " name=" + quoteIfNeeded(l.Name, plainLimitName)
}

// plainLimitName reports whether a limit name reads back unquoted: no
// space, comma or double quote, and nothing unprintable.
func plainLimitName(name string) bool {
	return !strings.ContainsAny(name, " ,\"") && printable(name)
}

// printable reports whether s holds only printable runes, none of them a
// white space other than the ASCII space.
func printable(s string) bool {
	for _, r := range s {
		if !strconv.IsPrint(r) {
			return false
		}
	}
	return true
}

// quoteIfNeeded returns name as it is when plain accepts it, else as a
// double-quoted Go string ("a b" becomes "\"a b\"").
func quoteIfNeeded(name string, plain func(string) bool) string {
	if plain(name) {
		return name
	}
	return strconv.Quote(name)
}

// splitOutside splits s at every byte sep accepts that stands outside a
// double-quoted string; an unterminated quote runs to the end of s, where
// the name it opens is refused.
func splitOutside(s string, sep func(byte) bool) []string {
	parts, _ := quoted.Split(s, sep)
	return parts
}

// notationFields splits a limit's notation into its fields: at white space
// outside quotes, without empty fields.
func notationFields(s string) []string {
	var fields []string
	for _, f := range splitOutside(s, func(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }) {
		if f != "" {
			fields = append(fields, f)
		}
	}
	return fields
}

// compile validates l and returns the backend's view of it: unnamed when
// its Name is empty or a limit notation (see Limit.Name).
func (l Limit) compile() (driver.Limit, error) {
	name := l.Name
	if isNotation(name) {
		name = ""
	}
	return driver.NewLimit(name, l.Algorithm, l.Max, l.Window, l.Burst)
}

// isNotation reports whether name reads as a limit in ParseLimit's
// notation without a name of its own, as "10/s" or "5/min gcra" do.
func isNotation(name string) bool {
	if name == "" || name[0] < '0' || name[0] > '9' {
		return false
	}
	l, err := parseLimit(name)
	return err == nil && l.Name == ""
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

// ParseLimit reads a limit written as "MAX/WINDOW", optionally followed by
// options separated by spaces:
//
//	10/s   120/min   5000/h   300000/day   1500000/week   100/2h   5/250ms
//	60/min aligned          fixed window aligned on the epoch
//	10/s gcra               GCRA with burst = max
//	10/s gcra burst=50      GCRA with burst 50
//	100/min sliding         sliding-window counter
//	10/s name=burst         a limit named "burst"
//
// Units: ms, s (sec, second), m (min, minute), h (hr, hour), d (day),
// w (wk, week), with plurals. There is no month: calendar months have no
// fixed length; write 30d. Each option may appear once, and at most one
// algorithm may be named ("10/s aligned gcra" is an error). Errors wrap
// ErrInvalidLimit and name the offending part.
//
// Without name=, the limit is unnamed: shown by its notation, stored under
// its window and algorithm only, so that raising Max keeps the open window
// (see Limit.Name). A NAME is kept as written (case included); it must not
// be empty, nor be a limit notation itself ("name=10/s" would name
// nothing). A name that holds a space, a comma, a double quote or an
// unprintable character is written as a double-quoted Go string:
// name="per user, per second". String writes it so. Name limits to keep apart two of one
// window and algorithm in one policy: without names, ParsePolicy rejects
// the pair, whose states would share one key.
func ParseLimit(s string) (Limit, error) {
	l, err := parseLimit(s)
	if err != nil {
		return Limit{}, err
	}
	if l.Name != "" && isNotation(l.Name) {
		return Limit{}, driver.Errorf("%w: %q: name %q is a limit notation: it would name nothing", ErrInvalidLimit, s, l.Name)
	}
	if _, err := l.compile(); err != nil {
		return Limit{}, err
	}
	return l, nil
}

// parseLimit is ParseLimit without the checks that need the whole limit:
// the notation and its options, read.
func parseLimit(s string) (Limit, error) {
	fail := func(why string) (Limit, error) {
		return Limit{}, driver.Errorf("%w: %q: %s", ErrInvalidLimit, s, why)
	}
	fields := notationFields(s)
	if len(fields) == 0 {
		return fail("empty")
	}
	if key, value, ok := strings.Cut(fields[0], "="); ok && (key == "" || isNotation(key)) {
		return fail(`want MAX/WINDOW first, such as "10/s", then options such as name=NAME`)
	} else if ok {
		// "burst=5/min" is a name written before the limit, as some
		// configurations do; say how this notation names it.
		return fail(fmt.Sprintf(`a limit starts with MAX/WINDOW; to name this one %q, write "%s name=%s"`, key, value, key))
	}
	maxText, windowText, ok := strings.Cut(fields[0], "/")
	if !ok {
		return fail(`want MAX/WINDOW, such as "10/s"`)
	}
	max, err := strconv.ParseInt(maxText, 10, 64)
	if err != nil || max < 1 {
		return fail(fmt.Sprintf("max %q must be a positive whole number", maxText))
	}
	window, err := parseWindow(windowText)
	if err != nil {
		return fail(err.Error())
	}
	l := Per(max, window)
	algorithm, burst, named := "", false, false
	for _, opt := range fields[1:] {
		key, value, hasValue := strings.Cut(opt, "=")
		key = strings.ToLower(key)
		switch {
		case (key == "fixed" || key == "aligned" || key == "gcra" || key == "sliding") && !hasValue:
			if algorithm != "" {
				if algorithm == key {
					return fail(fmt.Sprintf("option %q given twice", key))
				}
				return fail(fmt.Sprintf("options %q and %q conflict: a limit has one algorithm", algorithm, key))
			}
			algorithm = key
			l.Algorithm = map[string]Algorithm{"fixed": FixedWindow, "aligned": AlignedWindow, "gcra": GCRA, "sliding": SlidingWindow}[key]
		case key == "burst" && hasValue:
			if burst {
				return fail(`option "burst" given twice`)
			}
			burst = true
			b, err := strconv.ParseInt(value, 10, 64)
			if err != nil || b < 1 {
				return fail(fmt.Sprintf("burst %q must be a positive whole number", value))
			}
			l.Burst = b
		case key == "name" && hasValue:
			if named {
				return fail(`option "name" given twice`)
			}
			named = true
			if strings.HasPrefix(value, `"`) {
				unquoted, err := strconv.Unquote(value)
				if err != nil {
					return fail(fmt.Sprintf("name %s is not a whole double-quoted string", value))
				}
				value = unquoted
			} else if strings.ContainsAny(value, `",`) {
				return fail(fmt.Sprintf(`name %s holds a comma or a double quote: quote the whole name, as name=%q`, value, value))
			}
			if value == "" {
				return fail("name must not be empty")
			}
			l.Name = value
		default:
			return fail(fmt.Sprintf("unknown option %q (want fixed, aligned, gcra, sliding, burst=N or name=NAME)", opt))
		}
	}
	if burst && l.Algorithm != GCRA {
		return fail("burst applies only to gcra")
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
			return 0, driver.Errorf("window count %q must be a positive whole number", text[:i])
		}
		count = n
	}
	unit, ok := unitAliases[strings.ToLower(text[i:])]
	if !ok {
		return 0, driver.Errorf("unknown window unit %q (want ms, s, min, h, day or week)", text[i:])
	}
	if count > int64(driver.MaxWindow/unit) {
		return 0, driver.Errorf("window longer than %v", driver.MaxWindow)
	}
	return time.Duration(count) * unit, nil
}
