package config

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/throttlekit/throttlekit/throttler"
)

// root loads a file's top-level mapping: its domain and descriptors.
func (l *loader) root(c *Config, doc *yaml.Node) error {
	if doc == nil {
		return &Error{File: l.file, Msg: "file has no domain"}
	}
	doc, err := l.resolve(doc)
	if err != nil {
		return err
	}
	if isNull(doc) {
		return l.errorf(doc, "file has no domain")
	}
	if doc.Kind != yaml.MappingNode {
		return l.errorf(doc, "the top level must be a mapping of domain and descriptors, not %s", describe(doc))
	}
	ps, err := l.pairs(doc, 1)
	if err != nil {
		return err
	}
	var domain string
	var domainAt *yaml.Node
	var list *pair
	for i, p := range ps {
		if err := l.checkKey(p, false); err != nil {
			return err
		}
		switch p.name {
		case "domain":
			if domain, err = l.str(p); err != nil {
				return err
			}
			domainAt = p.val
		case "descriptors":
			list = &ps[i]
		default:
			if err := l.ignored(p.val, 2); err != nil {
				return err
			}
		}
	}
	if domain == "" {
		if domainAt == nil {
			return l.errorf(doc, "file has no domain")
		}
		return l.errorf(domainAt, "domain is empty")
	}
	root := c.domains[domain]
	if root == nil {
		root = &node{children: map[string]*node{}, file: l.file, line: domainAt.Line}
		c.domains[domain] = root
	} else if !l.o.merge {
		return l.errorf(domainAt, "domain %q is also defined in %s (at line %d); merging domains across files is off", domain, root.file, root.line)
	}
	if list == nil {
		return nil
	}
	return l.descriptors(root, domain+".", *list, 1)
}

// descriptors loads a list of descriptors under parent. prefix is the
// parent's full key and a '.'; level is 1 for the top-level list.
func (l *loader) descriptors(parent *node, prefix string, p pair, level int) error {
	if isNull(p.val) {
		return nil
	}
	if p.val.Kind != yaml.SequenceNode {
		return l.errorf(p.val, "descriptors must be a list, not %s", describe(p.val))
	}
	if level > maxDescriptorDepth {
		return l.errorf(p.key, "descriptors nest deeper than %d levels", maxDescriptorDepth)
	}
	for _, e := range p.val.Content {
		e, err := l.resolve(e)
		if err != nil {
			return err
		}
		if e.Kind != yaml.MappingNode {
			return l.errorf(e, "a descriptor must be a mapping, not %s", describe(e))
		}
		if err := l.descriptor(parent, prefix, e, level); err != nil {
			return err
		}
	}
	return nil
}

// flags are a descriptor's boolean settings.
type flags struct {
	shadowMode, quotaMode, detailedMetric, valueToMetric, shareThreshold bool
}

// descriptor loads one descriptor mapping m under parent.
func (l *loader) descriptor(parent *node, prefix string, m *yaml.Node, level int) error {
	depth := 2*level + 1
	ps, err := l.pairs(m, depth)
	if err != nil {
		return err
	}
	var key, value string
	var keyAt, shareAt *yaml.Node
	var rateLimit, children *pair
	var f flags
	for i, p := range ps {
		if err := l.checkKey(p, false); err != nil {
			return err
		}
		var flag *bool
		switch p.name {
		case "key":
			if key, err = l.str(p); err != nil {
				return err
			}
			keyAt = p.val
		case "value":
			if value, err = l.str(p); err != nil {
				return err
			}
		case "rate_limit":
			rateLimit = &ps[i]
		case "descriptors":
			children = &ps[i]
		case "shadow_mode":
			flag = &f.shadowMode
		case "quota_mode":
			flag = &f.quotaMode
		case "detailed_metric":
			flag = &f.detailedMetric
		case "value_to_metric":
			flag = &f.valueToMetric
		case "share_threshold":
			flag = &f.shareThreshold
			shareAt = p.val
		default:
			if err := l.ignored(p.val, depth+1); err != nil {
				return err
			}
		}
		if flag != nil {
			if *flag, err = l.boolean(p); err != nil {
				return err
			}
		}
	}
	if key == "" {
		if keyAt == nil {
			return l.errorf(m, "descriptor has no key")
		}
		return l.errorf(keyAt, "descriptor key is empty")
	}
	composite := key
	if value != "" {
		composite += "_" + value
	}
	full := prefix + composite
	if first := parent.children[composite]; first != nil {
		return l.errorf(m, "descriptor %q is defined twice at this level (first in %s at line %d)", full, first.file, first.line)
	}
	wildcard := strings.HasSuffix(composite, "*")
	if f.shareThreshold && !wildcard {
		return l.errorf(shareAt, "share_threshold applies to wildcard values only (ending in '*'), and %q is none", composite)
	}
	n := &node{
		children:       map[string]*node{},
		valueToMetric:  f.valueToMetric,
		shareThreshold: f.shareThreshold,
		file:           l.file,
		line:           m.Line,
	}
	if rateLimit != nil && !isNull(rateLimit.val) {
		if n.rule, err = l.rateLimit(*rateLimit, full, f, depth+1); err != nil {
			return err
		}
	}
	if wildcard {
		parent.wildcards = append(parent.wildcards, composite)
	}
	parent.children[composite] = n
	if children != nil {
		return l.descriptors(n, full+".", *children, level+1)
	}
	return nil
}

// rateLimit reads a rate_limit block into the rule for fullKey.
func (l *loader) rateLimit(p pair, fullKey string, f flags, depth int) (*Rule, error) {
	m := p.val
	if m.Kind != yaml.MappingNode {
		return nil, l.errorf(m, "rate_limit must be a mapping, not %s", describe(m))
	}
	ps, err := l.pairs(m, depth)
	if err != nil {
		return nil, err
	}
	r := &Rule{
		FullKey:        fullKey,
		File:           l.file,
		Line:           p.key.Line,
		ShadowMode:     f.shadowMode,
		QuotaMode:      f.quotaMode,
		DetailedMetric: f.detailedMetric,
		ValueToMetric:  f.valueToMetric,
		ShareThreshold: f.shareThreshold,
	}
	var (
		unit, algorithm               string
		unitAt, rpuAt, burstAt, algAt *yaml.Node
		rpu, burst                    uint64
		replaces                      *pair
		extra                         []throttler.Limit
		extraAt                       []*yaml.Node
		additionsGiven                []pair
	)
	for _, q := range ps {
		if err := l.checkKey(q, true); err != nil {
			return nil, err
		}
		if additions[q.name] && !isNull(q.val) {
			additionsGiven = append(additionsGiven, q)
		}
		switch q.name {
		case "unit":
			if unit, err = l.str(q); err != nil {
				return nil, err
			}
			unitAt = q.val
		case "requests_per_unit":
			if rpu, err = l.integer(q, math.MaxUint32); err != nil {
				return nil, err
			}
			if !isNull(q.val) {
				rpuAt = q.val
			}
		case "unlimited":
			if r.Unlimited, err = l.boolean(q); err != nil {
				return nil, err
			}
		case "name":
			if r.Name, err = l.str(q); err != nil {
				return nil, err
			}
		case "replaces":
			replaces = &q
		case "algorithm":
			if algorithm, err = l.str(q); err != nil {
				return nil, err
			}
			if algorithm != "" {
				if _, ok := algorithms[strings.ToLower(algorithm)]; !ok {
					return nil, l.errorf(q.val, "algorithm must be aligned, fixed, gcra or sliding, not %q", algorithm)
				}
				algAt = q.val
			}
		case "burst":
			if burst, err = l.integer(q, maxRequests); err != nil {
				return nil, err
			}
			if !isNull(q.val) {
				if burst == 0 {
					return nil, l.errorf(q.val, "burst must be from 1 to %d, not 0", uint64(maxRequests))
				}
				burstAt = q.val
			}
		case "limits":
			if extra, extraAt, err = l.limits(q); err != nil {
				return nil, err
			}
		case "failure_mode":
			mode, err := l.str(q)
			if err != nil {
				return nil, err
			}
			switch lower := strings.ToLower(mode); lower {
			case "", "open", "closed":
				r.FailureMode = lower
			default:
				return nil, l.errorf(q.val, "failure_mode must be open or closed, not %q", mode)
			}
		default:
			if err := l.ignored(q.val, depth+1); err != nil {
				return nil, err
			}
		}
	}
	if replaces != nil {
		if r.Replaces, err = l.replaces(*replaces, r.Name, depth+1); err != nil {
			return nil, err
		}
	}
	window, validUnit := units[strings.ToLower(unit)]
	if r.Unlimited {
		// envoy ratelimit refuses a valid unit beside unlimited and ignores
		// anything else there.
		if validUnit {
			return nil, l.errorf(unitAt, "an unlimited rate_limit takes no unit")
		}
		if len(additionsGiven) > 0 {
			return nil, l.errorf(additionsGiven[0].key, "an unlimited rate_limit takes no %s", additionsGiven[0].name)
		}
		r.RequestsPerUnit = uint32(rpu)
		return r, nil
	}
	r.RequestsPerUnit = uint32(rpu)
	var limits []throttler.Limit
	var limitsAt []*yaml.Node
	switch {
	case unit == "" && len(extra) > 0:
		// A rule made of listed limits only.
		if rpuAt != nil {
			return nil, l.errorf(rpuAt, "requests_per_unit needs a unit")
		}
		if algAt != nil {
			return nil, l.errorf(algAt, "algorithm applies to the unit's limit, and there is no unit; name the algorithm in each limit instead (as \"10/s gcra\")")
		}
		if burstAt != nil {
			return nil, l.errorf(burstAt, "burst applies to the unit's limit, and there is no unit; give it in the limit instead (as \"10/s gcra burst=20\")")
		}
	case !validUnit:
		if unit == "" {
			return nil, l.errorf(cmpNode(unitAt, p.key), "rate_limit needs a unit (second, minute, hour, day, week, month or year)")
		}
		return nil, l.errorf(unitAt, "invalid unit %q: want second, minute, hour, day, week, month or year", unit)
	case rpu == 0:
		r.Unit = strings.ToLower(unit)
		if len(extra) > 0 {
			return nil, l.errorf(cmpNode(rpuAt, p.key), "requests_per_unit 0 blocks every request and cannot be combined with limits")
		}
		if burstAt != nil {
			return nil, l.errorf(burstAt, "burst has no effect when requests_per_unit is 0 (every request is blocked)")
		}
		r.Blocks = true
		return r, nil
	default:
		r.Unit = strings.ToLower(unit)
		alg := l.o.algorithm
		if algorithm != "" {
			alg = algorithms[strings.ToLower(algorithm)]
		}
		lim := throttler.Per(int64(rpu), window).Using(alg)
		if burstAt != nil {
			if alg != throttler.GCRA {
				return nil, l.errorf(burstAt, "burst applies to the gcra algorithm only, and this rule's is %s", algName(alg))
			}
			lim = lim.WithBurst(int64(burst))
		}
		limits = append(limits, lim)
		limitsAt = append(limitsAt, cmpNode(rpuAt, p.key))
	}
	limits = append(limits, extra...)
	limitsAt = append(limitsAt, extraAt...)
	for j := range limits {
		for i := 0; i < j; i++ {
			if limits[i].Window == limits[j].Window && limits[i].Algorithm == limits[j].Algorithm {
				return nil, l.errorf(limitsAt[j], "limit %s has the same window and algorithm as %s in this rule", limits[j], limits[i])
			}
		}
	}
	// NewPolicy gets a copy: the Rule's Limits stay as built, whatever the
	// policy does with its own.
	policy, err := throttler.NewPolicy(fullKey, slices.Clone(limits))
	if err != nil {
		return nil, l.errorf(p.key, "rate_limit: %v", err)
	}
	r.Limits, r.Policy = limits, policy
	return r, nil
}

// cmpNode returns the first non-nil node.
func cmpNode(a, b *yaml.Node) *yaml.Node {
	if a != nil {
		return a
	}
	return b
}

// algName is an algorithm's name in a rate_limit block.
func algName(a throttler.Algorithm) string {
	for name, v := range algorithms {
		if v == a {
			return name
		}
	}
	return fmt.Sprint(a)
}

// limits reads a rate_limit's limits: a list of throttler.ParseLimit
// notations. null and [] give none.
func (l *loader) limits(p pair) ([]throttler.Limit, []*yaml.Node, error) {
	if isNull(p.val) {
		return nil, nil, nil
	}
	if p.val.Kind != yaml.SequenceNode {
		return nil, nil, l.errorf(p.val, "limits must be a list of limits such as \"10/s\", not %s", describe(p.val))
	}
	var out []throttler.Limit
	var at []*yaml.Node
	for _, e := range p.val.Content {
		e, err := l.resolve(e)
		if err != nil {
			return nil, nil, err
		}
		if e.Kind != yaml.ScalarNode || e.ShortTag() != "!!str" {
			return nil, nil, l.errorf(e, "a limit must be a string such as \"10/s\", not %s", describe(e))
		}
		lim, err := throttler.ParseLimit(e.Value)
		if err != nil {
			return nil, nil, l.errorf(e, "limit %q: %v", e.Value, err)
		}
		out = append(out, lim)
		at = append(at, e)
	}
	return out, at, nil
}

// replaces reads a rate_limit's replaces: a list of mappings with a name,
// none of them empty or the rule's own name.
func (l *loader) replaces(p pair, own string, depth int) ([]string, error) {
	if isNull(p.val) {
		return nil, nil
	}
	if p.val.Kind != yaml.SequenceNode {
		return nil, l.errorf(p.val, "replaces must be a list of mappings with a name, not %s", describe(p.val))
	}
	var names []string
	for _, e := range p.val.Content {
		e, err := l.resolve(e)
		if err != nil {
			return nil, err
		}
		if e.Kind != yaml.MappingNode {
			return nil, l.errorf(e, "a replaces entry must be a mapping with a name, not %s", describe(e))
		}
		ps, err := l.pairs(e, depth+1)
		if err != nil {
			return nil, err
		}
		name := ""
		for _, q := range ps {
			if err := l.checkKey(q, false); err != nil {
				return nil, err
			}
			if q.name == "name" {
				if name, err = l.str(q); err != nil {
					return nil, err
				}
			} else if err := l.ignored(q.val, depth+2); err != nil {
				return nil, err
			}
		}
		if name == "" {
			return nil, l.errorf(e, "a replaces entry needs a name")
		}
		if name == own {
			return nil, l.errorf(e, "rate_limit %q replaces itself", name)
		}
		names = append(names, name)
	}
	return names, nil
}
