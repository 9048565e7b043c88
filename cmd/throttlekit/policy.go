package main

import (
	"crypto/sha256"
	"encoding/hex"
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
// optionally prefixed by "POLICYNAME:" as Policy.String prints it. name is
// --policy-name; it must agree with a "POLICYNAME:" prefix if both are
// given. Errors are usageErrors.
func parsePolicy(name, spec string) (*throttler.Policy, error) {
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return nil, usagef("a policy is required: --policy \"10/s, 5000/h\"")
	}
	// Limits never hold ':', so the last one ends a policy name.
	if i := strings.LastIndexByte(spec, ':'); i >= 0 {
		inline := strings.TrimSpace(spec[:i])
		if inline == "" {
			return nil, usagef("policy %q: empty name before ':'", spec)
		}
		if name != "" && name != inline {
			return nil, usagef("policy named %q by --policy-name and %q in --policy", name, inline)
		}
		name, spec = inline, spec[i+1:]
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
		l, err := throttler.ParseLimit(part)
		if err != nil {
			return nil, usagef("policy %q: %v", name, err)
		}
		if limitName != "" {
			l = l.Named(limitName)
		}
		limits = append(limits, l)
	}
	p, err := throttler.NewPolicy(name, limits)
	if err != nil {
		return nil, usagef("%v", err)
	}
	return p, nil
}

// compiled returns the backends' view of p, as throttler.NewPolicy builds
// it: every limit's storage key, window in milliseconds and capacity.
func compiled(p *throttler.Policy) (*driver.Policy, error) {
	var ls []driver.Limit
	for _, l := range p.Limits() {
		dl, err := driver.NewLimit(l.Name, l.Algorithm, l.Max, l.Window, l.Burst)
		if err != nil {
			return nil, err
		}
		ls = append(ls, dl)
	}
	return driver.NewPolicy(p.Name(), ls...)
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

// The memcached backend's key layout (backend/memcached, "Keys" in its
// package documentation), which it does not export: every key is
// route "|" kind ":" limit, route = prefix ":" policy ":" identifier, each
// part escaped, a route over 120 bytes and a limit part over 65 bytes
// replaced by "#" and their hex SHA-256. TestExplainKeysExistOnServers
// checks these against keys a real backend wrote.
const (
	memcachedMaxRoute = 120
	memcachedMaxLimit = 65
)

// memcachedRoute returns the routing part of id's keys under p, with
// prefix as given to memcachedbackend.WithPrefix.
func memcachedRoute(prefix string, p *driver.Policy, id string) string {
	return shortenKeyPart(driver.EscapeKey(prefix)+":"+p.Key+":"+driver.EscapeKey(id), memcachedMaxRoute)
}

// memcachedItem returns the key of limit l's item of the given kind ("w"
// window, "g" GCRA, "c" counter stem) under route.
func memcachedItem(route, kind string, l driver.Limit) string {
	return route + "|" + kind + ":" + shortenKeyPart(l.Key, memcachedMaxLimit)
}

func shortenKeyPart(s string, max int) string {
	if len(s) <= max {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	return "#" + hex.EncodeToString(sum[:])
}
