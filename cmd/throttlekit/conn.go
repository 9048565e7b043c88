package main

import (
	"errors"
	"flag"
	"fmt"
	"net/url"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	memcachedbackend "github.com/throttlekit/throttlekit/backend/memcached"
	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	redisgroups "github.com/throttlekit/throttlekit/backend/redis/groups"
	shardedbackend "github.com/throttlekit/throttlekit/backend/sharded"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// Backend kinds: the names of the connection flags, and the KIND of a
// --old or --new spec.
const (
	kindRedis        = "redis"
	kindRedisCluster = "redis-cluster"
	kindRedisGroups  = "redis-groups"
	kindMemcached    = "memcached"
)

var kinds = []string{kindRedis, kindRedisCluster, kindRedisGroups, kindMemcached}

// Environment variables that supply defaults for flags not given on the
// command line.
const (
	envRedis        = "THROTTLEKIT_REDIS"
	envRedisCluster = "THROTTLEKIT_REDIS_CLUSTER"
	envRedisGroups  = "THROTTLEKIT_REDIS_GROUPS"
	envMemcached    = "THROTTLEKIT_MEMCACHED"
	envOld          = "THROTTLEKIT_OLD"
	envNew          = "THROTTLEKIT_NEW"
	envPrefix       = "THROTTLEKIT_PREFIX"
	envOldPrefix    = "THROTTLEKIT_OLD_PREFIX"
	envNewPrefix    = "THROTTLEKIT_NEW_PREFIX"
	envPolicy       = "THROTTLEKIT_POLICY"
	envPolicyName   = "THROTTLEKIT_POLICY_NAME"
)

// defaultTimeout bounds each backend call unless --timeout says otherwise.
const defaultTimeout = 2 * time.Second

// connFlags are the connection flags every command shares.
type connFlags struct {
	single               map[string]*string // kind -> value of --redis, --redis-cluster, ...
	old, new             string
	prefix               string
	oldPrefix, newPrefix string
	timeout              time.Duration
	set                  map[string]bool // flags given on the command line
}

// addConnFlags registers the connection flags on fs. withSides adds --old,
// --new and their prefixes; withPrefix adds --prefix (cleanup registers a
// --prefix of its own); withMemcached adds --memcached (cleanup works on
// Redis only, so its --help does not offer it; THROTTLEKIT_MEMCACHED is
// still read, so that cleanup can say why it refuses).
func addConnFlags(fs *flag.FlagSet, withSides, withPrefix, withMemcached bool) *connFlags {
	c := &connFlags{single: map[string]*string{}}
	c.single[kindRedis] = fs.String(kindRedis, "", "standalone Redis `URL` (go-redis ParseURL: redis://[user:pass@]host:port[/db][?opts], rediss://, unix://) (env "+envRedis+")")
	c.single[kindRedisCluster] = fs.String(kindRedisCluster, "", "Redis Cluster `URL` (go-redis ParseClusterURL: redis://host:port?addr=host2:port2&addr=...) (env "+envRedisCluster+")")
	c.single[kindRedisGroups] = fs.String(kindRedisGroups, "", "sharded Redis groups `CONFIG` in redisgroups syntax: name=redis://primary?replica=redis://replica,name2=... (env "+envRedisGroups+")")
	if withMemcached {
		c.single[kindMemcached] = fs.String(kindMemcached, "", "memcached `servers` host:port[,host:port...] (env "+envMemcached+")")
	} else {
		c.single[kindMemcached] = new(string)
	}
	if withPrefix {
		fs.StringVar(&c.prefix, "prefix", "", "key `prefix` of the backend (default: the backend's own, \""+redisbackend.DefaultPrefix+"\" for Redis, \""+memcachedbackend.DefaultPrefix+"\" for memcached) (env "+envPrefix+")")
	}
	if withSides {
		fs.StringVar(&c.old, "old", "", "a rollout's old side, as `KIND=VALUE` with KIND redis, redis-cluster, redis-groups or memcached (env "+envOld+")")
		fs.StringVar(&c.new, "new", "", "a rollout's new side, as `KIND=VALUE` (env "+envNew+")")
		fs.StringVar(&c.oldPrefix, "old-prefix", "", "key `prefix` of the old side (default: --prefix, else the backend's own) (env "+envOldPrefix+")")
		fs.StringVar(&c.newPrefix, "new-prefix", "", "key `prefix` of the new side (default: --prefix, else the backend's own) (env "+envNewPrefix+")")
	}
	fs.DurationVar(&c.timeout, "timeout", defaultTimeout, "bound on each backend call")
	return c
}

// resolve records which flags fs saw and fills the others from the
// environment. Connection variables apply only when no connection flag was
// given at all, so that a flag always replaces the environment's backend
// rather than adding a second one. usePrefixEnv says whether
// THROTTLEKIT_PREFIX may fill --prefix.
func (c *connFlags) resolve(fs *flag.FlagSet, getenv func(string) string, usePrefixEnv bool) {
	c.set = map[string]bool{}
	fs.Visit(func(f *flag.Flag) { c.set[f.Name] = true })
	anyConn := c.set["old"] || c.set["new"]
	for _, k := range kinds {
		anyConn = anyConn || c.set[k]
	}
	has := func(name string) bool { return fs.Lookup(name) != nil }
	if !anyConn {
		for k, env := range map[string]string{kindRedis: envRedis, kindRedisCluster: envRedisCluster,
			kindRedisGroups: envRedisGroups, kindMemcached: envMemcached} {
			*c.single[k] = getenv(env)
		}
		if has("old") {
			c.old, c.new = getenv(envOld), getenv(envNew)
		}
	}
	if usePrefixEnv && has("prefix") && !c.set["prefix"] {
		c.prefix = getenv(envPrefix)
	}
	if has("old-prefix") && !c.set["old-prefix"] {
		c.oldPrefix = getenv(envOldPrefix)
	}
	if has("new-prefix") && !c.set["new-prefix"] {
		c.newPrefix = getenv(envNewPrefix)
	}
}

// spec is one backend to connect to: a kind and its connection string.
type spec struct {
	kind, value string
}

// sideSpec is one side of the command: "main" for a single backend,
// "old" and "new" for a rollout.
type sideSpec struct {
	name   string
	spec   spec
	prefix string // "" for the backend's default
}

// sides returns the sides the flags describe: a rollout's old and new
// side, or the one backend of the connection flags.
func (c *connFlags) sides() ([]sideSpec, error) {
	var singles []spec
	for _, k := range kinds {
		if v := strings.TrimSpace(*c.single[k]); v != "" {
			singles = append(singles, spec{k, v})
		}
	}
	if c.old != "" || c.new != "" {
		if c.old == "" || c.new == "" {
			return nil, usagef("a rollout needs both --old and --new")
		}
		if len(singles) > 0 {
			return nil, usagef("give either --old and --new, or --%s, not both", singles[0].kind)
		}
		oldSpec, err := parseSpec("--old", c.old)
		if err != nil {
			return nil, err
		}
		newSpec, err := parseSpec("--new", c.new)
		if err != nil {
			return nil, err
		}
		return []sideSpec{
			{name: "old", spec: oldSpec, prefix: firstNonEmpty(c.oldPrefix, c.prefix)},
			{name: "new", spec: newSpec, prefix: firstNonEmpty(c.newPrefix, c.prefix)},
		}, nil
	}
	switch len(singles) {
	case 0:
		return nil, usagef("no backend: give --redis, --redis-cluster, --redis-groups or --memcached, or --old and --new")
	case 1:
		if c.set["old-prefix"] || c.set["new-prefix"] {
			return nil, usagef("--old-prefix and --new-prefix apply to --old and --new; use --prefix")
		}
		return []sideSpec{{name: "main", spec: singles[0], prefix: c.prefix}}, nil
	}
	return nil, usagef("give one backend: --%s and --%s were both given (use --old and --new for a rollout)", singles[0].kind, singles[1].kind)
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// parseSpec reads a --old or --new value, KIND=VALUE.
func parseSpec(flagName, s string) (spec, error) {
	kind, value, ok := strings.Cut(strings.TrimSpace(s), "=")
	kind = strings.TrimSpace(kind)
	if !ok || !isKind(kind) {
		return spec{}, usagef("%s: want KIND=VALUE with KIND one of %s, as in %s memcached=127.0.0.1:11211", flagName, strings.Join(kinds, ", "), flagName)
	}
	if strings.TrimSpace(value) == "" {
		return spec{}, usagef("%s: empty %s value", flagName, kind)
	}
	return spec{kind, strings.TrimSpace(value)}, nil
}

func isKind(k string) bool {
	for _, x := range kinds {
		if k == x {
			return true
		}
	}
	return false
}

// side is an opened side: a backend ready for a Throttler.
type side struct {
	name    string
	kind    string
	target  string // where it points, without any password
	prefix  string // the key prefix in effect
	backend driver.Backend
	groups  []string // group names of a redis-groups side
	close   func() error
}

// openSide builds the backend of s. Nothing is contacted yet: a backend
// that cannot be reached fails at its first call. A malformed connection
// string or prefix is a usageError.
func openSide(s sideSpec, timeout time.Duration) (*side, error) {
	out := &side{name: s.name, kind: s.spec.kind}
	bad := func(err error) error {
		return usagef("%s: %v", flagFor(s), err)
	}
	switch s.spec.kind {
	case kindRedis:
		opts, err := goredis.ParseURL(s.spec.value)
		if err != nil {
			return nil, bad(bareAddressHint(s.spec.value, redactedError(s.spec.value, err)))
		}
		opts.ContextTimeoutEnabled = true
		client := goredis.NewClient(opts)
		prefix := firstNonEmpty(s.prefix, redisbackend.DefaultPrefix)
		b, err := redisbackend.New(client, redisbackend.WithPrefix(prefix))
		if err != nil {
			_ = client.Close()
			return nil, bad(err)
		}
		out.target, out.prefix, out.backend, out.close = opts.Addr, prefix, b, client.Close
	case kindRedisCluster:
		opts, err := goredis.ParseClusterURL(s.spec.value)
		if err != nil {
			return nil, bad(bareAddressHint(s.spec.value, redactedError(s.spec.value, err)))
		}
		opts.ContextTimeoutEnabled = true
		client := goredis.NewClusterClient(opts)
		prefix := firstNonEmpty(s.prefix, redisbackend.DefaultPrefix)
		b, err := redisbackend.New(client, redisbackend.WithPrefix(prefix))
		if err != nil {
			_ = client.Close()
			return nil, bad(err)
		}
		out.target, out.prefix, out.backend, out.close = strings.Join(opts.Addrs, ","), prefix, b, client.Close
	case kindRedisGroups:
		groups, err := redisgroups.Parse(s.spec.value)
		if err != nil {
			return nil, bad(err)
		}
		prefix := firstNonEmpty(s.prefix, redisbackend.DefaultPrefix)
		b, err := redisgroups.New(groups, redisgroups.WithBackendOptions(redisbackend.WithPrefix(prefix)))
		if err != nil {
			return nil, bad(err)
		}
		names := b.Shards()
		out.target, out.prefix, out.backend, out.groups, out.close = "groups "+strings.Join(names, ","), prefix, b, names, b.Close
	case kindMemcached:
		servers := splitList(s.spec.value)
		client, err := memcachedbackend.NewClient(timeout, servers...)
		if err != nil {
			return nil, bad(err)
		}
		prefix := firstNonEmpty(s.prefix, memcachedbackend.DefaultPrefix)
		b, err := memcachedbackend.New(client, memcachedbackend.WithPrefix(prefix))
		if err != nil {
			_ = client.Close()
			return nil, bad(err)
		}
		out.target, out.prefix, out.backend, out.close = strings.Join(servers, ","), prefix, b, client.Close
	default:
		return nil, usagef("unknown backend kind %q", s.spec.kind)
	}
	return out, nil
}

// openSides opens every side, closing those already open when one fails.
func openSides(specs []sideSpec, timeout time.Duration) ([]*side, func(), error) {
	var open []*side
	closeAll := func() {
		for _, s := range open {
			_ = s.close()
		}
	}
	for _, sp := range specs {
		s, err := openSide(sp, timeout)
		if err != nil {
			closeAll()
			return nil, func() {}, err
		}
		open = append(open, s)
	}
	return open, closeAll, nil
}

// flagFor names the flag a side came from, for error messages.
func flagFor(s sideSpec) string {
	if s.name == "main" {
		return "--" + s.spec.kind
	}
	return "--" + s.name + " " + s.spec.kind
}

// ownerGroup returns the group of a redis-groups side that holds id.
func (s *side) ownerGroup(id string) string {
	if len(s.groups) == 0 {
		return ""
	}
	return shardedbackend.Owner(s.groups, id)
}

func splitList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}

// redactedError returns the error of parsing the URL raw, without
// anything that could be part of a password. The parser's messages quote
// pieces of the URL, and a password holding '#', '/' or '?' confuses it
// into quoting part of the password (as a port, say), so when raw holds
// credentials its message is replaced by a generic one.
// bareAddressHint adds to err, when raw is a bare host:port rather than a
// URL (the commonest slip), the URL the user most likely meant.
func bareAddressHint(raw string, err error) error {
	if strings.Contains(raw, "://") || strings.Contains(raw, "@") || raw == "" {
		return err
	}
	return fmt.Errorf("%w; a URL is expected, such as redis://%s", err, raw)
}

func redactedError(raw string, err error) error {
	if strings.Contains(raw, "@") {
		return errors.New("invalid URL (its text is not shown: it holds credentials); " +
			"special characters in a user name or password must be percent-encoded")
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		return fmt.Errorf("invalid URL: %v", ue.Err)
	}
	return err
}
