package throttler

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// Policy is a named, ordered set of limits decided together, all or
// nothing, for one identifier: "10/s, 120/min, 5000/h", say. Build it with
// NewPolicy or ParsePolicy; it is immutable and safe for concurrent use.
//
// Stored state is keyed by the policy's name and each limit's identity:
// its name when it has one, its algorithm, its window and, for GCRA, its
// burst when set; never its Max. Redefining a policy therefore keeps the
// state of the limits it keeps (a raised or lowered Max applies to the
// open window at once, named limit or not) and leaves the state of the
// ones it drops untouched.
type Policy struct {
	compiled *driver.Policy
	limits   []Limit
	over     settings // WithCallTimeout and WithFailureMode, when given
}

// NewPolicy returns a policy named name over limits. Unnamed limits are
// shown by their notation ("10/s": their Name in Limits, in results and
// in errors) and stored under their window and algorithm only (see
// Limit.Name). Two limits of one identity, such as two unnamed limits of
// one window and algorithm, are rejected: name them to keep them apart.
// opts may hold WithCallTimeout and WithFailureMode, which override the
// throttler's. The error wraps ErrInvalidPolicy, ErrInvalidLimit or
// ErrInvalidOption.
func NewPolicy(name string, limits []Limit, opts ...Option) (*Policy, error) {
	compiled := make([]driver.Limit, len(limits))
	for i, l := range limits {
		c, err := l.compile()
		if err != nil {
			return nil, driver.Errorf("policy %q: %w", name, err)
		}
		compiled[i] = c
	}
	dp, err := driver.NewPolicy(name, compiled...)
	if err != nil {
		return nil, err
	}
	p := &Policy{compiled: dp, limits: make([]Limit, len(limits)), over: settings{forPolicy: true}}
	for i, l := range limits {
		l.Name = compiled[i].Name
		p.limits[i] = l
	}
	if err := applyOptions(&p.over, opts); err != nil {
		return nil, driver.Errorf("policy %q: %w", name, err)
	}
	return p, nil
}

// ParsePolicy returns a policy from a comma-separated list of limits in
// ParseLimit's notation, such as "10/s, 120/min, 240/h" or
// "10/s name=burst, 1000/h", optionally preceded by the policy's name and
// a colon and a space, as String prints it: "api: 10/s name=burst, 1000/h".
// The prefix ends at the first colon followed by a space or a tab, so a
// name may hold colons ("api:v2: 10/s"); a name that holds ": " itself, a
// double quote or white space at either end is written as a double-quoted
// Go string, as String writes it. Limit names may be quoted too (see
// ParseLimit), and commas within quotes separate nothing. name may be empty when the text has a prefix; when
// both are given they must agree. ParsePolicy(p.Name(), p.String()), or
// ParsePolicy("", p.String()), returns a policy equal to p but for the
// options given to NewPolicy, which the notation does not hold.
func ParsePolicy(name, limits string, opts ...Option) (*Policy, error) {
	inline, rest, ok, err := cutPolicyName(limits)
	if err != nil {
		return nil, err
	}
	if ok {
		if name != "" && name != inline {
			return nil, fmt.Errorf("%w: named %q, and %q in %q", ErrInvalidPolicy, name, inline, limits)
		}
		name, limits = inline, rest
	}
	if name == "" {
		return nil, fmt.Errorf(`%w: no name: give it as the argument or as "NAME: " before the limits`, ErrInvalidPolicy)
	}
	var ls []Limit
	for _, part := range splitOutside(limits, func(c byte) bool { return c == ',' }) {
		l, err := ParseLimit(part)
		if err != nil {
			return nil, driver.Errorf("policy %q: %w", name, err)
		}
		ls = append(ls, l)
	}
	return NewPolicy(name, ls, opts...)
}

// cutPolicyName splits "NAME: limits" at the first colon followed by a
// space or a tab, provided no double quote comes before it (a quoted limit
// name may hold ": "). A name that holds one of those, or white space at
// either end, comes as a double-quoted Go string, as String writes it.
func cutPolicyName(text string) (name, limits string, ok bool, err error) {
	text = strings.TrimSpace(text)
	if strings.HasPrefix(text, `"`) {
		quoted, qerr := strconv.QuotedPrefix(text)
		rest := strings.TrimPrefix(text, quoted)
		if qerr != nil || !strings.HasPrefix(rest, ":") {
			return "", "", false, fmt.Errorf("%w: %s: a quoted policy name must be whole and followed by a colon", ErrInvalidPolicy, text)
		}
		name, _ = strconv.Unquote(quoted)
		return name, rest[1:], true, nil
	}
	for i := 0; i+1 < len(text) && text[i] != '"'; i++ {
		if text[i] == ':' && (text[i+1] == ' ' || text[i+1] == '\t') {
			return text[:i], text[i+2:], true, nil
		}
	}
	return "", text, false, nil
}

// plainPolicyName reports whether a policy name reads back unquoted before
// ": ": printable, trimmed, and holding no double quote and no colon
// followed by a space or a tab.
func plainPolicyName(name string) bool {
	return printable(name) && name == strings.TrimSpace(name) && !strings.ContainsAny(name, `"`) &&
		!strings.Contains(name, ": ") && !strings.Contains(name, ":\t")
}

// Name returns the policy's name; "" for a nil or zero Policy.
func (p *Policy) Name() string {
	if p.validate() != nil {
		return ""
	}
	return p.compiled.Name
}

// Limits returns a copy of the policy's limits, in order, each named: an
// unnamed limit by its notation, which names nothing when given back to
// NewPolicy (see Limit.Name). nil for a nil or zero Policy.
func (p *Policy) Limits() []Limit {
	if p == nil {
		return nil
	}
	return append([]Limit(nil), p.limits...)
}

// String returns the policy in ParsePolicy's notation, prefixed by its
// name: "api: 10/s name=per-sec, 5000/h gcra burst=20". ParsePolicy reads
// it back to an equal policy: the same name, limits, limit names,
// algorithms and bursts, and so the same stored keys.
func (p *Policy) String() string {
	if p.validate() != nil {
		return "<nil policy>"
	}
	parts := make([]string, len(p.limits))
	for i, l := range p.limits {
		parts[i] = l.String()
	}
	return quoteIfNeeded(p.compiled.Name, plainPolicyName) + ": " + strings.Join(parts, ", ")
}

// validate reports whether p is usable: non-nil and built by NewPolicy.
func (p *Policy) validate() error {
	if p == nil || !p.compiled.Valid() {
		return driver.Errorf("%w: nil or zero policy (build it with NewPolicy)", ErrInvalidPolicy)
	}
	return nil
}

// failureMode and callTimeout resolve the policy's settings against the
// throttler's defaults.
func (p *Policy) failureMode(def FailureMode) FailureMode {
	if p.over.failureSet {
		return p.over.failure
	}
	return def
}

func (p *Policy) callTimeout(def time.Duration) time.Duration {
	if p.over.timeoutSet {
		return p.over.timeout
	}
	return def
}
