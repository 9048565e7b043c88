package main

import (
	"flag"
	"strings"

	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// defaultPolicyName names the policy when neither --policy-name nor a
// "NAME:" prefix in --policy does. Stored keys hold the policy's name, so
// it must be the name the application gives the policy.
const defaultPolicyName = "api"

// policyFlags are --policy and --policy-name.
type policyFlags struct {
	spec, name string
}

func addPolicyFlags(fs *flag.FlagSet, withSpec bool) *policyFlags {
	p := &policyFlags{}
	if withSpec {
		fs.StringVar(&p.spec, "policy", "", `the policy's limits, as the application writes them: "10/s, 5000/h" (ParsePolicy notation), optionally "NAME: 10/s, 5000/h" and "LIMITNAME=10/s" for named limits (env `+envPolicy+`)`)
	}
	fs.StringVar(&p.name, "policy-name", "", "the policy's `name`; stored keys hold it, so it must match the application's (default \""+defaultPolicyName+"\") (env "+envPolicyName+")")
	return p
}

// resolve fills unset flags from the environment.
func (p *policyFlags) resolve(fs *flag.FlagSet, getenv func(string) string) {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if fs.Lookup("policy") != nil && !set["policy"] {
		p.spec = getenv(envPolicy)
	}
	if !set["policy-name"] {
		p.name = getenv(envPolicyName)
	}
}

// parsePolicy reads a policy in the command's notation: ParsePolicy's
// comma-separated limits, each optionally named as NAME=LIMIT, the whole
// optionally prefixed by "POLICYNAME: " as Policy.String prints it (see
// cutPolicyName). name is --policy-name; it must agree with a
// "POLICYNAME: " prefix if both are given. Errors are usageErrors.
func parsePolicy(name, spec string) (*throttler.Policy, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return nil, usagef("a policy is required: --policy \"10/s, 5000/h\"")
	}
	if inline, rest, ok := cutPolicyName(spec); ok {
		if inline == "" {
			return nil, usagef("policy %q: empty name before ':'", spec)
		}
		if strings.ContainsAny(inline, ",=/") {
			return nil, usagef("policy %q: a policy name ends at the first \": \" and holds no ',', '=' or '/'; give the name with --policy-name", spec)
		}
		if name != "" && name != inline {
			return nil, usagef("policy named %q by --policy-name and %q in --policy", name, inline)
		}
		name, spec = inline, rest
	}
	if name == "" {
		name = defaultPolicyName
	}
	var limits []throttler.Limit
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		limitName := ""
		if first, rest, _ := strings.Cut(part, " "); strings.Contains(first, "=") {
			// "burst=N" never comes first, so a first field with '=' is
			// NAME=MAX/WINDOW.
			n, notation, _ := strings.Cut(first, "=")
			if n == "" {
				return nil, usagef("limit %q: empty name before '='", part)
			}
			limitName, part = n, strings.TrimSpace(notation+" "+rest)
		}
		if limitName != "" {
			// ParseLimit checks the name as it checks its own name=NAME.
			if strings.Contains(strings.ToLower(part), "name=") {
				return nil, usagef("limit %q: named twice (NAME= and name=)", limitName+"="+part)
			}
			part += " name=" + limitName
		}
		l, err := throttler.ParseLimit(part)
		if err != nil {
			return nil, usagef("policy %q: %v", name, err)
		}
		limits = append(limits, l)
	}
	p, err := throttler.NewPolicy(name, limits)
	if err != nil {
		return nil, usagef("%v", err)
	}
	return p, nil
}

// cutPolicyName splits "NAME: limits" as Policy.String prints it, at the
// first colon followed by a space or a tab. A colon without one belongs to
// a limit's name ("api:read=10/s"), never ends a policy name.
func cutPolicyName(spec string) (name, rest string, ok bool) {
	for i := 0; i+1 < len(spec); i++ {
		if spec[i] == ':' && (spec[i+1] == ' ' || spec[i+1] == '\t') {
			return strings.TrimSpace(spec[:i]), spec[i+1:], true
		}
	}
	if strings.HasSuffix(spec, ":") {
		return strings.TrimSpace(spec[:len(spec)-1]), "", true
	}
	return "", spec, false
}

// notation writes p in the command's notation, so that it reads back as
// the same policy: "NAME: " and each limit, a named limit as NAME=LIMIT
// (Policy.String leaves limit names out).
func notation(p *throttler.Policy) string {
	var b strings.Builder
	b.WriteString(p.Name())
	b.WriteString(":")
	for i, l := range p.Limits() {
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(" ")
		if n := l.String(); !unnamed(l.Name) {
			b.WriteString(l.Name + "=" + n)
		} else {
			b.WriteString(n)
		}
	}
	return b.String()
}

// compiled returns the backends' view of p, as throttler.NewPolicy builds
// it: every limit's storage key (layout 2: an unnamed limit, which Limits
// shows by its notation, is stored under its algorithm and window only),
// window in milliseconds and capacity.
func compiled(p *throttler.Policy) (*driver.Policy, error) {
	var ls []driver.Limit
	for _, l := range p.Limits() {
		name := l.Name
		if unnamed(name) {
			name = ""
		}
		dl, err := driver.NewLimit(name, l.Algorithm, l.Max, l.Window, l.Burst)
		if err != nil {
			return nil, err
		}
		ls = append(ls, dl)
	}
	return driver.NewPolicy(p.Name(), ls...)
}

// unnamed reports whether a limit's name, as Policy.Limits gives it, names
// nothing: empty or a limit notation, such as "10/s" (throttler.Limit's
// rule).
func unnamed(name string) bool {
	if name == "" {
		return true
	}
	l, err := throttler.ParseLimit(name)
	return err == nil && l.Name == ""
}

// describePolicy returns p's part of a JSON document.
func describePolicy(p *throttler.Policy) policyDoc {
	d := policyDoc{Name: p.Name(), Notation: notation(p)}
	if dp, err := compiled(p); err == nil {
		d.Capacity = dp.Capacity
	}
	return d
}

// checkIdentifier rejects what every throttler call would.
func checkIdentifier(id string) error {
	if id == "" || len(id) > driver.MaxIdentifierLen {
		return usagef("identifier must be 1 to %d bytes, got %d", driver.MaxIdentifierLen, len(id))
	}
	return nil
}
