package config

import (
	"fmt"
	"slices"
	"strings"

	"github.com/throttlekit/throttlekit/throttler"
)

// Entry is one (key, value) pair of a request's descriptor.
type Entry struct{ Key, Value string }

// File is one configuration file: its name, used in errors and in
// Rule.File, and its contents.
type File struct {
	Name string
	Data []byte
}

// Option changes how Parse and LoadDir read a configuration.
type Option func(*options)

type options struct {
	merge     bool
	algorithm throttler.Algorithm
	err       error
}

// MergeDomains says whether one domain may be defined in several files, as
// envoy ratelimit's MERGE_DOMAIN_CONFIG does. When on, the descriptors of
// every file naming the domain are loaded into one tree, in file order, and
// a composite key defined twice at one level is still an error. When off
// (the default), a second file naming a domain is an error that names
// both files.
func MergeDomains(on bool) Option {
	return func(o *options) { o.merge = on }
}

// DefaultAlgorithm sets the algorithm of the unit's limit of the rules
// whose rate_limit names none. The default is throttler.AlignedWindow:
// envoy ratelimit's windows are aligned on the clock, each starting at a
// multiple of the unit since the Unix epoch. An algorithm throttler does
// not know makes Parse and LoadDir fail with throttler.ErrInvalidOption.
func DefaultAlgorithm(a throttler.Algorithm) Option {
	return func(o *options) {
		switch a {
		case throttler.AlignedWindow, throttler.FixedWindow, throttler.GCRA, throttler.SlidingWindow:
			o.algorithm = a
		default:
			o.err = fmt.Errorf("%w: config.DefaultAlgorithm(%d): unknown algorithm", throttler.ErrInvalidOption, int(a))
		}
	}
}

// Config is a loaded configuration: a tree of descriptors per domain. It is
// immutable and safe for concurrent use. The *Rule values it hands out are
// shared: callers must not modify them.
type Config struct {
	domains map[string]*node
	names   []string // sorted domain names
	rules   []*Rule  // sorted by FullKey
}

// node is one descriptor of the tree, or a domain's root.
type node struct {
	children  map[string]*node // by composite key: key, or key + "_" + value
	wildcards []string         // composite keys of children ending in '*', in load order
	rule      *Rule

	valueToMetric  bool
	shareThreshold bool

	// Where the descriptor was defined, for duplicate errors.
	file string
	line int
}

// Rule is one rate_limit block of a configuration.
type Rule struct {
	// FullKey is envoy ratelimit's key for the rule: the domain, then the
	// key or key_value of each descriptor from the top level down to the
	// rule's, joined with '.', as in "messaging.message_type_marketing.to_number".
	FullKey string
	// File and Line locate the rate_limit block.
	File string
	Line int
	// Name is rate_limit.name, the name other rules' replaces refer to.
	Name string
	// Replaces lists the names in rate_limit.replaces.
	Replaces []string
	// Unit is the unit in lower case, as in "minute"; "" when the rule is
	// unlimited or made of listed limits only.
	Unit string
	// RequestsPerUnit is rate_limit.requests_per_unit.
	RequestsPerUnit uint32
	// Unlimited is rate_limit.unlimited: matching requests are allowed
	// without being counted.
	Unlimited bool
	// ShadowMode, QuotaMode, DetailedMetric, ValueToMetric and
	// ShareThreshold are the flags of the rule's descriptor.
	ShadowMode, QuotaMode, DetailedMetric, ValueToMetric, ShareThreshold bool
	// Limits are throttlekit's limits for the rule: the unit's limit (an
	// unnamed throttler.Per(RequestsPerUnit, unit) using the rule's
	// algorithm) first, then those listed under limits. Nil when the rule
	// is Unlimited or Blocks.
	Limits []throttler.Limit
	// Policy is throttler.NewPolicy(FullKey, Limits); nil when Limits is.
	Policy *throttler.Policy
	// Blocks is set for requests_per_unit 0 without listed limits: every
	// request is over the limit and nothing is stored.
	Blocks bool
	// FailureMode is rate_limit.failure_mode: "", "open" or "closed".
	FailureMode string
}

// Match is what Lookup found for one descriptor.
type Match struct {
	// Rule is the rule that applies, nil when none does (envoy ratelimit
	// then answers OK without a limit).
	Rule *Rule
	// CacheKey is envoy ratelimit's cache key for the descriptor without
	// its prefix and without the trailing "_" and window start: the domain,
	// then "_" + key + "_" + value for each entry, where an entry matched
	// through a share_threshold wildcard shows the wildcard (as "files/*")
	// instead of its value. envoy's Redis key is PREFIX + CacheKey + "_" +
	// the window start in Unix seconds. Set only when Rule is.
	CacheKey string
	// MetricKey is the key envoy ratelimit files the match's statistics
	// under: Rule.FullKey, or its detailed_metric, value_to_metric or
	// share_threshold variant. Set only when Rule is.
	MetricKey string
}

// Domains returns the names of the configured domains, sorted.
func (c *Config) Domains() []string {
	return slices.Clone(c.names)
}

// HasDomain reports whether domain is configured.
func (c *Config) HasDomain(domain string) bool {
	_, ok := c.domains[domain]
	return ok
}

// Rules returns every rule of every domain, sorted by FullKey.
func (c *Config) Rules() []*Rule {
	return slices.Clone(c.rules)
}

// How a descriptor entry matched a node.
const (
	byValue    = iota // key_value, exactly
	byWildcard        // through a composite key ending in '*'
	byKey             // key alone
)

// step records how one entry of a descriptor matched.
type step struct {
	node     *node
	how      int
	wildcard string // the composite key matched, for byWildcard
	shared   string // the wildcard pattern shown for the entry (share_threshold), or ""
}

// Lookup returns the rule that applies to a descriptor of domain, as envoy
// ratelimit's GetLimit finds it (the descriptor's own limit override
// aside). At each level, the entry's key_value is tried first, then the
// level's wildcard keys in file order, then the key alone; the search goes
// one level deeper only while the node found has descriptors below it, and
// a rule applies only if it belongs to the node the last entry matched.
// An unknown domain, or a descriptor without entries, gives Match{}.
func (c *Config) Lookup(domain string, entries []Entry) Match {
	parent := c.domains[domain]
	if parent == nil || len(entries) == 0 {
		return Match{}
	}
	var buf [8]step
	steps := buf[:0]
	var rule *Rule
	anyShared := false
	for i, e := range entries {
		composite := e.Key + "_" + e.Value
		st := step{how: byValue, node: parent.children[composite]}
		if st.node == nil {
			for _, w := range parent.wildcards {
				if strings.HasPrefix(composite, w[:len(w)-1]) {
					st = step{how: byWildcard, node: parent.children[w], wildcard: w}
					break
				}
			}
		}
		if st.node == nil {
			st = step{how: byKey, node: parent.children[e.Key]}
		}
		if st.how == byWildcard && st.node.shareThreshold {
			st.shared = strings.TrimPrefix(st.wildcard, e.Key+"_")
			anyShared = true
		}
		steps = append(steps, st)
		if st.node != nil && st.node.rule != nil && i == len(entries)-1 {
			rule = st.node.rule
		}
		if st.node == nil || len(st.node.children) == 0 {
			break
		}
		parent = st.node
	}
	if rule == nil {
		return Match{}
	}
	return Match{Rule: rule, CacheKey: cacheKey(domain, entries, steps), MetricKey: metricKey(domain, rule, entries, steps, anyShared)}
}

// cacheKey builds envoy ratelimit's cache key, less prefix and window.
func cacheKey(domain string, entries []Entry, steps []step) string {
	n := len(domain)
	for _, e := range entries {
		n += 2 + len(e.Key) + len(e.Value)
	}
	var b strings.Builder
	b.Grow(n + 8)
	b.WriteString(domain)
	for i, e := range entries {
		b.WriteByte('_')
		b.WriteString(e.Key)
		b.WriteByte('_')
		if steps[i].shared != "" {
			b.WriteString(steps[i].shared)
		} else {
			b.WriteString(e.Value)
		}
	}
	return b.String()
}

// metricKey builds the key envoy ratelimit's statistics of a match use.
// Every entry has a step here: a rule is only found at the last one.
func metricKey(domain string, rule *Rule, entries []Entry, steps []step, anyShared bool) string {
	var b strings.Builder
	b.Grow(len(rule.FullKey) + 16*len(entries))
	b.WriteString(domain)
	for i, e := range entries {
		st := steps[i]
		b.WriteByte('.')
		b.WriteString(e.Key)
		var value string
		switch {
		case rule.DetailedMetric && anyShared:
			// detailed_metric under share_threshold: every value, but the
			// shared wildcard in place of the values it covers.
			value = e.Value
			if st.shared != "" {
				value = st.shared
			}
		case rule.DetailedMetric:
			// detailed_metric: key_value for every entry, even when the
			// value is empty.
			b.WriteByte('_')
			b.WriteString(e.Value)
			continue
		case st.how == byWildcard && st.shared != "":
			value = st.shared
		case st.how == byWildcard && st.node.valueToMetric:
			value = e.Value
		case st.how == byWildcard:
			value = strings.TrimPrefix(st.wildcard, e.Key+"_")
		case st.how == byValue:
			value = e.Value
		case st.node.valueToMetric:
			value = e.Value
		}
		if value != "" {
			b.WriteByte('_')
			b.WriteString(value)
		}
	}
	return b.String()
}
