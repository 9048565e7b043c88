package main

import (
	"flag"
	"strings"

	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// policyFlags are --policy and --policy-name.
type policyFlags struct {
	spec, name string
}

func addPolicyFlags(fs *flag.FlagSet, withSpec bool) *policyFlags {
	p := &policyFlags{}
	if withSpec {
		fs.StringVar(&p.spec, "policy", "", `the policy as Policy.String prints it: "NAME: 10/s name=per-sec, 5000/h gcra burst=20" (ParsePolicy's notation; without "NAME: ", give --policy-name) (env `+envPolicy+`)`)
	}
	fs.StringVar(&p.name, "policy-name", "", "the policy's `name`, required unless --policy starts with \"NAME: \"; stored keys hold it, so it must be the application's (env "+envPolicyName+")")
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

// parsePolicy reads a policy in throttler.ParsePolicy's notation, the one
// Policy.String prints: "NAME: LIMIT, LIMIT". name is --policy-name; it
// must agree with a "NAME: " prefix if both are given. The policy's name is
// never assumed: stored keys hold it, and a guessed name would find no
// state. Errors are usageErrors.
func parsePolicy(name, spec string) (*throttler.Policy, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return nil, usagef(`a policy is required: --policy "NAME: 10/s, 5000/h"`)
	}
	p, err := throttler.ParsePolicy(name, spec)
	if err != nil && name == "" && strings.Contains(err.Error(), "no name") {
		return nil, usagef(`policy %q has no name: stored keys hold the application's policy name, so give it as "NAME: %s" or with --policy-name`, spec, spec)
	}
	if err != nil {
		return nil, usagef("%v", err)
	}
	return p, nil
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
	d := policyDoc{Name: p.Name(), Notation: p.String()}
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
