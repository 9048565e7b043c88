package config

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/throttlekit/throttlekit/throttler"
)

// Bounds on the input.
const (
	// maxFileSize is the largest configuration file accepted, 4 MiB.
	maxFileSize = 4 << 20
	// maxDescriptorDepth is the deepest descriptor nesting accepted.
	maxDescriptorDepth = 32
	// maxYAMLDepth bounds the nesting of YAML collections (a descriptor
	// level takes two: its mapping and its descriptors list).
	maxYAMLDepth = 2*maxDescriptorDepth + 8
	// maxNodes bounds the YAML nodes walked in one file, aliases expanded
	// at each use, so that a few anchors cannot make a huge tree.
	maxNodes = 1 << 22
	// maxRequests is throttler's largest Max, 2^40.
	maxRequests = 1 << 40
)

// units maps envoy ratelimit's units to their windows.
var units = map[string]time.Duration{
	"second": time.Second,
	"minute": time.Minute,
	"hour":   time.Hour,
	"day":    24 * time.Hour,
	"week":   7 * 24 * time.Hour,
	"month":  30 * 24 * time.Hour,
	"year":   365 * 24 * time.Hour,
}

// algorithms maps the values of rate_limit.algorithm to throttler's.
var algorithms = map[string]throttler.Algorithm{
	"aligned": throttler.AlignedWindow,
	"fixed":   throttler.FixedWindow,
	"gcra":    throttler.GCRA,
	"sliding": throttler.SlidingWindow,
}

// envoyKeys are the mapping keys envoy ratelimit accepts anywhere in a
// file; it ignores those that mean nothing where they stand.
var envoyKeys = map[string]bool{
	"domain": true, "key": true, "value": true, "descriptors": true, "rate_limit": true,
	"unit": true, "requests_per_unit": true, "unlimited": true, "shadow_mode": true,
	"quota_mode": true, "name": true, "replaces": true, "detailed_metric": true,
	"value_to_metric": true, "share_threshold": true,
}

// additions are throttlekit's keys, valid in a rate_limit block only.
var additions = map[string]bool{"algorithm": true, "burst": true, "limits": true, "failure_mode": true}

// Parse loads a configuration from files, in order. The first error found
// is returned: an *Error wrapping ErrInvalidConfig, or an error wrapping
// throttler.ErrInvalidOption for a bad option.
func Parse(files []File, opts ...Option) (*Config, error) {
	o := options{algorithm: throttler.AlignedWindow}
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("%w: nil config.Option", throttler.ErrInvalidOption)
		}
		opt(&o)
		if o.err != nil {
			return nil, o.err
		}
	}
	c := &Config{domains: map[string]*node{}}
	for _, f := range files {
		if err := loadFile(c, f, o); err != nil {
			return nil, err
		}
	}
	for name, root := range c.domains {
		c.names = append(c.names, name)
		c.rules = collect(c.rules, root)
	}
	slices.Sort(c.names)
	slices.SortFunc(c.rules, func(a, b *Rule) int {
		return cmp.Or(strings.Compare(a.FullKey, b.FullKey), strings.Compare(a.File, b.File), cmp.Compare(a.Line, b.Line))
	})
	return c, nil
}

// collect appends the rules of the tree under n.
func collect(rules []*Rule, n *node) []*Rule {
	if n.rule != nil {
		rules = append(rules, n.rule)
	}
	for _, child := range n.children {
		rules = collect(rules, child)
	}
	return rules
}

// LoadDir loads every regular file (or symbolic link to one) directly in
// dir whose name ends in ".yaml" or ".yml" and does not start with '.', in
// name order, as envoy ratelimit loads the *.yaml files of
// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY. Subdirectories
// are not read, and names starting with '.' (such as the "..data" of a
// Kubernetes ConfigMap volume) are skipped. A directory without such files
// gives an empty Config. An error reading the directory or a file does not
// wrap ErrInvalidConfig; an error in a file's contents does.
func LoadDir(dir string, opts ...Option) (*Config, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("throttlekit/rls: reading configuration directory: %w", err)
	}
	var files []File
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !(strings.HasSuffix(name, ".yaml") || strings.HasSuffix(name, ".yml")) {
			continue
		}
		path := filepath.Join(dir, name)
		info, err := os.Stat(path) // follows symbolic links
		if err != nil {
			return nil, fmt.Errorf("throttlekit/rls: reading configuration: %w", err)
		}
		if !info.Mode().IsRegular() {
			continue
		}
		data, err := readLimited(path)
		if err != nil {
			return nil, err
		}
		files = append(files, File{Name: path, Data: data})
	}
	return Parse(files, opts...)
}

// readLimited reads a file, refusing one over maxFileSize.
func readLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("throttlekit/rls: reading configuration: %w", err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("throttlekit/rls: reading configuration: %w", err)
	}
	if len(data) > maxFileSize {
		return nil, &Error{File: path, Msg: fmt.Sprintf("file is larger than %d bytes", maxFileSize)}
	}
	return data, nil
}

// loader reads one file into a Config.
type loader struct {
	file  string
	o     options
	nodes int // YAML nodes walked so far
}

// loadFile parses one file and adds its domain to c.
func loadFile(c *Config, f File, o options) (err error) {
	if len(f.Data) > maxFileSize {
		return &Error{File: f.Name, Msg: fmt.Sprintf("file is larger than %d bytes", maxFileSize)}
	}
	doc, err := decode(f)
	if err != nil {
		return err
	}
	l := &loader{file: f.Name, o: o}
	defer func() {
		// The walk is written not to panic; this is a last guard so that no
		// input can take the process down.
		if r := recover(); r != nil {
			err = &Error{File: f.Name, Msg: fmt.Sprintf("internal error reading the file: %v", r)}
		}
	}()
	return l.root(c, doc)
}

// decode parses a file's single YAML document. It returns nil for a file
// without any document.
func decode(f File) (root *yaml.Node, err error) {
	defer func() {
		if r := recover(); r != nil {
			root, err = nil, &Error{File: f.Name, Msg: fmt.Sprintf("YAML parser failed: %v", r)}
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(f.Data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, nil
		}
		return nil, syntaxError(f.Name, err)
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case err == nil:
		return nil, errorf(f.Name, position{next.Line, next.Column}, "a file holds one YAML document; a second one starts here")
	case !errors.Is(err, io.EOF):
		return nil, syntaxError(f.Name, err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return nil, nil
	}
	return doc.Content[0], nil
}

// at returns the position of a node.
func at(n *yaml.Node) position {
	if n == nil {
		return position{}
	}
	return position{n.Line, n.Column}
}

// errorf returns an *Error at n.
func (l *loader) errorf(n *yaml.Node, format string, args ...any) *Error {
	return errorf(l.file, at(n), format, args...)
}

// resolve follows an alias and counts the node against maxNodes.
func (l *loader) resolve(n *yaml.Node) (*yaml.Node, error) {
	for hops := 0; n != nil && n.Kind == yaml.AliasNode; hops++ {
		if n.Alias == nil || hops > 8 {
			return nil, l.errorf(n, "alias %q names nothing", n.Value)
		}
		n = n.Alias
	}
	l.nodes++
	if l.nodes > maxNodes {
		return nil, l.errorf(n, "file expands to more than %d YAML nodes (aliases count at each use)", maxNodes)
	}
	return n, nil
}

// isNull reports whether a resolved node is YAML null.
func isNull(n *yaml.Node) bool {
	return n == nil || n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// pair is one key and value of a mapping.
type pair struct {
	name     string
	key, val *yaml.Node // val is resolved
}

// pairs returns the entries of a mapping, with YAML merge keys ("<<")
// applied: a key given in the mapping itself wins over a merged one, and
// earlier merged mappings win over later ones. A key given twice in one
// mapping is an error, and so is a key that is not a string.
func (l *loader) pairs(m *yaml.Node, depth int) ([]pair, error) {
	if depth > maxYAMLDepth {
		return nil, l.errorf(m, "YAML nests deeper than %d levels", maxYAMLDepth)
	}
	out := make([]pair, 0, len(m.Content)/2)
	seen := map[string]*yaml.Node{}
	var merged []*yaml.Node
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, err := l.resolve(m.Content[i])
		if err != nil {
			return nil, err
		}
		v, err := l.resolve(m.Content[i+1])
		if err != nil {
			return nil, err
		}
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			merged = append(merged, v)
			continue
		}
		if k.Kind != yaml.ScalarNode || k.ShortTag() != "!!str" {
			return nil, l.errorf(k, "a mapping key must be a string, not %s", describe(k))
		}
		if first, dup := seen[k.Value]; dup {
			return nil, l.errorf(k, "key %q given twice in one mapping (first at line %d)", k.Value, first.Line)
		}
		seen[k.Value] = k
		out = append(out, pair{name: k.Value, key: k, val: v})
	}
	for _, v := range merged {
		var sources []*yaml.Node
		switch v.Kind {
		case yaml.MappingNode:
			sources = []*yaml.Node{v}
		case yaml.SequenceNode:
			for _, s := range v.Content {
				s, err := l.resolve(s)
				if err != nil {
					return nil, err
				}
				if s.Kind != yaml.MappingNode {
					return nil, l.errorf(s, "a merge key (<<) takes mappings, not %s", describe(s))
				}
				sources = append(sources, s)
			}
		default:
			return nil, l.errorf(v, "a merge key (<<) takes a mapping or a list of mappings, not %s", describe(v))
		}
		for _, s := range sources {
			inner, err := l.pairs(s, depth+1)
			if err != nil {
				return nil, err
			}
			for _, p := range inner {
				if _, dup := seen[p.name]; !dup {
					seen[p.name] = p.key
					out = append(out, p)
				}
			}
		}
	}
	return out, nil
}

// describe names a node's kind for errors.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "null"
		case "!!str":
			return fmt.Sprintf("%q", n.Value)
		}
		return n.Value
	}
	return "this node"
}

// checkKey refuses a key envoy ratelimit does not know and, outside a
// rate_limit block, throttlekit's additions.
func (l *loader) checkKey(p pair, inRateLimit bool) error {
	if envoyKeys[p.name] {
		return nil
	}
	if additions[p.name] {
		if inRateLimit {
			return nil
		}
		return l.errorf(p.key, "%s is valid only in a rate_limit block", p.name)
	}
	return l.errorf(p.key, "unknown key %q", p.name)
}

// ignored checks the value of a key envoy ratelimit accepts but ignores
// where it stands, as envoy does: mappings hold known keys, lists hold
// mappings only, and scalars are no floating-point numbers.
func (l *loader) ignored(n *yaml.Node, depth int) error {
	if depth > maxYAMLDepth {
		return l.errorf(n, "YAML nests deeper than %d levels", maxYAMLDepth)
	}
	switch n.Kind {
	case yaml.MappingNode:
		ps, err := l.pairs(n, depth)
		if err != nil {
			return err
		}
		for _, p := range ps {
			if !envoyKeys[p.name] {
				return l.errorf(p.key, "unknown key %q", p.name)
			}
			if err := l.ignored(p.val, depth+1); err != nil {
				return err
			}
		}
	case yaml.SequenceNode:
		for _, e := range n.Content {
			e, err := l.resolve(e)
			if err != nil {
				return err
			}
			if e.Kind != yaml.MappingNode {
				return l.errorf(e, "a list here holds mappings only, not %s", describe(e))
			}
			if err := l.ignored(e, depth+1); err != nil {
				return err
			}
		}
	case yaml.ScalarNode:
		if n.ShortTag() == "!!float" {
			return l.errorf(n, "unexpected number %s", n.Value)
		}
	}
	return nil
}

// str reads a string field: any scalar but a floating-point number (which
// envoy ratelimit refuses); null is "".
func (l *loader) str(p pair) (string, error) {
	n := p.val
	if n.Kind != yaml.ScalarNode {
		return "", l.errorf(n, "%s must be a string, not %s", p.name, describe(n))
	}
	switch n.ShortTag() {
	case "!!null":
		return "", nil
	case "!!float":
		return "", l.errorf(n, "%s must be a string, not the number %s (quote it)", p.name, n.Value)
	}
	return n.Value, nil
}

// yaml11Bools are the YAML 1.1 words envoy ratelimit's parser reads as
// booleans besides true and false.
var yaml11Bools = map[string]bool{
	"y": true, "Y": true, "yes": true, "Yes": true, "YES": true, "on": true, "On": true, "ON": true,
	"n": false, "N": false, "no": false, "No": false, "NO": false, "off": false, "Off": false, "OFF": false,
}

// boolean reads a boolean field; null is false.
func (l *loader) boolean(p pair) (bool, error) {
	n := p.val
	if n.Kind == yaml.ScalarNode {
		switch n.ShortTag() {
		case "!!null":
			return false, nil
		case "!!bool":
			switch n.Value {
			case "true", "True", "TRUE":
				return true, nil
			case "false", "False", "FALSE":
				return false, nil
			}
		case "!!str":
			if b, ok := yaml11Bools[n.Value]; ok && n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle|yaml.LiteralStyle|yaml.FoldedStyle|yaml.TaggedStyle) == 0 {
				return b, nil
			}
		}
	}
	return false, l.errorf(n, "%s must be true or false, not %s", p.name, describe(n))
}

// integer reads a whole number from 0 to max; null is 0.
func (l *loader) integer(p pair, max uint64) (uint64, error) {
	n := p.val
	if n.Kind == yaml.ScalarNode {
		switch n.ShortTag() {
		case "!!null":
			return 0, nil
		case "!!int":
			plain := strings.ReplaceAll(n.Value, "_", "")
			if v, err := parseUint(plain); err == nil && v <= max {
				return v, nil
			}
		}
	}
	return 0, l.errorf(n, "%s must be a whole number from 0 to %d, not %s", p.name, max, describe(n))
}

// parseUint reads an integer as YAML does (0x, 0o, 0b prefixes, a leading
// '+'), refusing negative ones.
func parseUint(s string) (uint64, error) {
	return strconv.ParseUint(strings.TrimPrefix(s, "+"), 0, 64)
}
