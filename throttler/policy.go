package throttler

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// FailureMode says what a decision becomes when the backend fails.
type FailureMode int

const (
	// FailOpen allows the request when the backend fails (the default): an
	// outage of the limiter's store does not become an outage of the API.
	FailOpen FailureMode = iota
	// FailClosed denies the request when the backend fails.
	FailClosed
)

// String returns "open" or "closed".
func (m FailureMode) String() string {
	if m == FailClosed {
		return "closed"
	}
	return "open"
}

// Policy is a named, ordered set of limits decided together, all or nothing,
// for one identifier. Build it with NewPolicy or ParsePolicy; it is immutable
// and safe for concurrent use.
type Policy struct {
	name      string
	limits    []Limit
	keys      []string
	failure   FailureMode
	timeout   time.Duration
	minWindow time.Duration
}

// PolicyOption configures a Policy.
type PolicyOption func(*Policy)

// WithFailureMode sets what a decision becomes when the backend fails; the
// default is FailOpen.
func WithFailureMode(m FailureMode) PolicyOption { return func(p *Policy) { p.failure = m } }

// WithCallTimeout bounds each backend call made for this policy, overriding
// the throttler's timeout (DefaultTimeout unless set with WithTimeout).
func WithCallTimeout(d time.Duration) PolicyOption { return func(p *Policy) { p.timeout = d } }

// NewPolicy returns a policy named name over limits. Unnamed limits are named
// after their notation ("10/s"). The error wraps ErrInvalidPolicy or
// ErrInvalidLimit.
func NewPolicy(name string, limits []Limit, opts ...PolicyOption) (*Policy, error) {
	if name == "" {
		return nil, fmt.Errorf("%w: empty name", ErrInvalidPolicy)
	}
	if len(limits) == 0 {
		return nil, fmt.Errorf("%w: %q has no limits", ErrInvalidPolicy, name)
	}
	p := &Policy{name: name, limits: make([]Limit, len(limits)), keys: make([]string, len(limits))}
	seen := make(map[string]bool, len(limits))
	for i, l := range limits {
		if err := l.Validate(); err != nil {
			return nil, fmt.Errorf("policy %q: %w", name, err)
		}
		if l.Name == "" {
			l.Name = l.String()
		}
		if seen[l.Name] {
			return nil, fmt.Errorf("%w: %q has two limits named %q", ErrInvalidPolicy, name, l.Name)
		}
		seen[l.Name] = true
		p.limits[i] = l
		p.keys[i] = limitKey(l)
		if p.minWindow == 0 || l.Window < p.minWindow {
			p.minWindow = l.Window
		}
	}
	for _, opt := range opts {
		opt(p)
	}
	if p.failure != FailOpen && p.failure != FailClosed {
		return nil, fmt.Errorf("%w: %q: unknown failure mode %d", ErrInvalidPolicy, name, int(p.failure))
	}
	if p.timeout < 0 {
		return nil, fmt.Errorf("%w: %q: negative call timeout", ErrInvalidPolicy, name)
	}
	return p, nil
}

// ParsePolicy returns a policy from a comma-separated list of limits in
// ParseLimit's notation, such as "10/s, 120/min, 240/h".
func ParsePolicy(name, limits string, opts ...PolicyOption) (*Policy, error) {
	var ls []Limit
	for _, part := range strings.Split(limits, ",") {
		l, err := ParseLimit(part)
		if err != nil {
			return nil, fmt.Errorf("policy %q: %w", name, err)
		}
		ls = append(ls, l)
	}
	return NewPolicy(name, ls, opts...)
}

// Name returns the policy's name.
func (p *Policy) Name() string { return p.name }

// Len returns the number of limits.
func (p *Policy) Len() int { return len(p.limits) }

// Limit returns the i-th limit, named.
func (p *Policy) Limit(i int) Limit { return p.limits[i] }

// Limits returns a copy of the policy's limits, in order.
func (p *Policy) Limits() []Limit { return append([]Limit(nil), p.limits...) }

// LimitKey returns the storage identity of the i-th limit: its escaped name,
// algorithm, window in milliseconds and, for GCRA, its burst. Two limits
// whose keys differ never share stored state; raising Max keeps the key, so
// a raised limit applies to the current window at once. Backends join it
// with PolicyKey and the escaped identifier to name stored state.
func (p *Policy) LimitKey(i int) string { return p.keys[i] }

// PolicyKey returns the policy's name escaped with EscapeKey.
func (p *Policy) PolicyKey() string { return EscapeKey(p.name) }

// FailureMode returns what a decision becomes when the backend fails.
func (p *Policy) FailureMode() FailureMode { return p.failure }

// CallTimeout returns the policy's own per-call timeout, or 0 when it uses
// the throttler's.
func (p *Policy) CallTimeout() time.Duration { return p.timeout }

// String returns the policy in ParsePolicy's notation, prefixed by its name:
// "api: 10/s, 5000/h".
func (p *Policy) String() string {
	parts := make([]string, len(p.limits))
	for i, l := range p.limits {
		parts[i] = l.String()
	}
	return p.name + ": " + strings.Join(parts, ", ")
}

func limitKey(l Limit) string {
	k := EscapeKey(l.Name) + ":" + l.Algorithm.String() + ":" + strconv.FormatInt(l.Window.Milliseconds(), 10)
	if l.Algorithm == GCRA {
		k += ":" + strconv.FormatInt(l.capacity(), 10)
	}
	return k
}

// validate reports whether p is usable: non-nil and built by NewPolicy.
func (p *Policy) validate() error {
	if p == nil || len(p.limits) == 0 {
		return fmt.Errorf("%w: nil or zero policy (build it with NewPolicy)", ErrInvalidPolicy)
	}
	return nil
}
