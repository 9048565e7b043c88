package throttler

import (
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
// "10/s name=burst, 1000/h".
func ParsePolicy(name, limits string, opts ...Option) (*Policy, error) {
	var ls []Limit
	for _, part := range strings.Split(limits, ",") {
		l, err := ParseLimit(part)
		if err != nil {
			return nil, driver.Errorf("policy %q: %w", name, err)
		}
		ls = append(ls, l)
	}
	return NewPolicy(name, ls, opts...)
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

// String returns the policy in ParsePolicy's notation, prefixed by its name:
// "api: 10/s, 5000/h".
func (p *Policy) String() string {
	if p.validate() != nil {
		return "<nil policy>"
	}
	parts := make([]string, len(p.limits))
	for i, l := range p.limits {
		parts[i] = l.String()
	}
	return p.compiled.Name + ": " + strings.Join(parts, ", ")
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
