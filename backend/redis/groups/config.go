package redisgroups

import (
	"errors"
	"fmt"
	shardedbackend "github.com/throttlekit/throttlekit/backend/sharded"
	"github.com/throttlekit/throttlekit/throttler/driver"
	"net/url"
	"strings"

	goredis "github.com/redis/go-redis/v9"
)

// Config describes one Redis group: a primary and its replicas, as
// go-redis client options. New makes one client per server, always
// with ContextTimeoutEnabled set.
type Config struct {
	// Name is the group's name (see shardedbackend.Shard.Name).
	Name string
	// Primary is the options of the primary's client.
	Primary *goredis.Options
	// Replicas are the options of the replicas' clients, if any.
	Replicas []*goredis.Options
}

// replicaParam is the query parameter of a shard URL that names a replica.
const replicaParam = "replica"

// contextTimeoutParam is the query parameter go-redis's Sentinel URLs know
// as ContextTimeoutEnabled; its ParseURL for a single server rejects it.
// The sharded backend always enables it, so a shard URL may say so, but
// cannot turn it off.
const contextTimeoutParam = "context_timeout_enabled"

// Parse reads a layout of Redis groups from one string, such as the
// value of an environment variable:
//
//	a=redis://10.0.0.1:6379?replica=redis://10.0.0.2:6379,b=redis://10.0.0.3:6379
//
// The grammar, with whitespace around entries, names and URLs ignored:
//
//	config  = shard *( "," shard )
//	shard   = name "=" url
//	name    = 1*64( ALPHA / DIGIT / "." / "_" / "-" )
//	url     = a URL go-redis's ParseURL reads (redis://, rediss://, unix://),
//	          whose query may also hold "replica=" parameters, one per replica
//
// The shard URL's other query parameters are go-redis options
// (dial_timeout, read_timeout, max_retries, db...). They apply to the
// primary and to every replica of the shard, and so do the primary's
// database number and, unless a replica URL has user info of its own, its
// user name and password: a replica serves the primary's data. A replica
// URL therefore holds only a scheme of the same kind as the primary's
// (redis or rediss for TCP, unix for a socket), optional user info, and an
// address: host and port, or the socket's path. Its text is taken as it
// stands, not query-unescaped, so it is written exactly as a URL on its
// own would be; a replica URL percent-encoded whole (no "://" left in it)
// is decoded first.
//
// Every Options returned has ContextTimeoutEnabled set, as New sets it
// anyway. A shard URL may say context_timeout_enabled=true (or 1), but
// cannot turn it off.
//
// A ',' inside a URL (in a password, say) must be written %2C, and a '&'
// in a replica's user info %26.
//
// Anything malformed or ambiguous is an error wrapping driver.ErrInvalidOption that
// names the offending part, with passwords masked: no shards, an empty
// entry, a missing '=', an empty, invalid or duplicate name, a URL go-redis
// rejects (bad scheme, port or database, unknown parameter), a
// context_timeout_enabled other than true or 1, a replica URL with a path,
// query or fragment, or of another kind of scheme than its primary, a
// replica with the address of its primary, and an address used twice,
// within a shard or by two shards. Addresses are compared as written (host
// names are not resolved).
func Parse(config string) ([]Config, error) {
	if strings.TrimSpace(config) == "" {
		return nil, fmt.Errorf("%w: no shards (empty configuration)", driver.ErrInvalidOption)
	}
	entries := strings.Split(config, ",")
	shards := make([]Config, 0, len(entries))
	for i, entry := range entries {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			return nil, fmt.Errorf("%w: entry %d is empty (a stray ',')", driver.ErrInvalidOption, i+1)
		}
		name, rawURL, ok := strings.Cut(entry, "=")
		if !ok {
			return nil, fmt.Errorf("%w: entry %d %q: missing '=' between shard name and URL", driver.ErrInvalidOption, i+1, redact(entry))
		}
		name, rawURL = strings.TrimSpace(name), strings.TrimSpace(rawURL)
		if err := shardedbackend.CheckName(name); err != nil {
			return nil, fmt.Errorf("%w: entry %d: %w", driver.ErrInvalidOption, i+1, err)
		}
		sc, err := parseShardURL(name, rawURL)
		if err != nil {
			return nil, fmt.Errorf("%w: shard %q: %w", driver.ErrInvalidOption, name, err)
		}
		shards = append(shards, sc)
	}
	if err := validateConfigs(shards); err != nil {
		return nil, err
	}
	return shards, nil
}

// parseShardURL reads one shard's URL and its replica parameters.
func parseShardURL(name, rawURL string) (Config, error) {
	if rawURL == "" {
		return Config{}, errors.New("empty URL")
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return Config{}, fmt.Errorf("URL %q: %w", redact(rawURL), unwrapURLError(err))
	}
	shown := u.Redacted()
	if u.Fragment != "" || strings.Contains(rawURL, "#") {
		return Config{}, fmt.Errorf("URL %q: unexpected fragment (a '#' must be written %%23)", shown)
	}
	rest, replicas, err := splitReplicas(u.RawQuery)
	if err != nil {
		return Config{}, fmt.Errorf("URL %q: %w", shown, err)
	}
	u.RawQuery = rest
	shown = u.Redacted()
	primary, err := goredis.ParseURL(u.String())
	if err != nil {
		return Config{}, fmt.Errorf("URL %q: %w", shown, err)
	}
	primary.ContextTimeoutEnabled = true
	sc := Config{Name: name, Primary: primary}
	for i, raw := range replicas {
		opts, err := parseReplicaURL(u, raw)
		if err != nil {
			return Config{}, fmt.Errorf("replica %d %q: %w", i, redact(raw), err)
		}
		opts.ContextTimeoutEnabled = true
		sc.Replicas = append(sc.Replicas, opts)
	}
	return sc, nil
}

// splitReplicas takes the replica parameters out of a raw query. Their
// values are returned as written, or decoded when percent-encoded whole;
// context_timeout_enabled is checked and dropped; the other parameters are
// returned as the query left for go-redis. A query url.ParseQuery rejects (a ';', a bad
// escape) is an error here, where go-redis would silently drop the
// parameter.
func splitReplicas(rawQuery string) (rest string, replicas []string, err error) {
	if rawQuery == "" {
		return "", nil, nil
	}
	var kept []string
	for _, param := range strings.Split(rawQuery, "&") {
		if param == "" {
			continue
		}
		rawKey, value, _ := strings.Cut(param, "=")
		key, err := url.QueryUnescape(rawKey)
		if err != nil {
			return "", nil, fmt.Errorf("parameter %q: %w", rawKey, err)
		}
		if key == contextTimeoutParam {
			if v, err := url.QueryUnescape(value); err != nil || v != "true" && v != "1" {
				return "", nil, fmt.Errorf("%s=%q: a sharded backend always enables it; leave it out or write true", contextTimeoutParam, value)
			}
			continue
		}
		if key != replicaParam {
			kept = append(kept, param)
			continue
		}
		if strings.TrimSpace(value) == "" {
			return "", nil, errors.New("empty replica URL")
		}
		if !strings.Contains(value, "://") {
			// Percent-encoded whole, as URLs inside query parameters often
			// are ("redis%3A%2F%2Fh2%3A6379"); a URL written as it stands
			// always holds "://".
			if unescaped, err := url.QueryUnescape(value); err == nil {
				value = unescaped
			}
		}
		replicas = append(replicas, value)
	}
	rest = strings.Join(kept, "&")
	if _, err := url.ParseQuery(rest); err != nil {
		return "", nil, fmt.Errorf("query: %w", err)
	}
	return rest, replicas, nil
}

// parseReplicaURL builds a replica's options: the primary's URL (replica
// parameters removed) with the replica's scheme, address and, when it has
// some, user info.
func parseReplicaURL(primary *url.URL, raw string) (*goredis.Options, error) {
	r, err := url.Parse(raw)
	if err != nil {
		return nil, unwrapURLError(err)
	}
	if !sameSchemeKind(primary.Scheme, r.Scheme) {
		return nil, fmt.Errorf("scheme %q does not fit the primary's %q", r.Scheme, primary.Scheme)
	}
	if r.RawQuery != "" || r.ForceQuery {
		return nil, errors.New("a replica URL has no query: put options on the shard URL, they apply to every server of the shard")
	}
	if r.Fragment != "" {
		return nil, errors.New("unexpected fragment")
	}
	built := *primary
	built.Scheme = r.Scheme
	if r.User != nil {
		built.User = r.User
	}
	if r.Scheme == "unix" {
		if r.Host != "" {
			return nil, fmt.Errorf("unix URL with a host %q: write unix:///path/to/socket", r.Host)
		}
		built.Path, built.RawPath = r.Path, r.RawPath
	} else {
		if r.Path != "" && r.Path != "/" {
			return nil, fmt.Errorf("a replica URL has no path (%q): the database is the primary's", r.Path)
		}
		if r.Host == "" {
			return nil, errors.New("no host")
		}
		built.Host = r.Host
	}
	return goredis.ParseURL(built.String())
}

func sameSchemeKind(a, b string) bool {
	tcp := func(s string) bool { return s == "redis" || s == "rediss" }
	return tcp(a) && tcp(b) || a == "unix" && b == "unix"
}

// unwrapURLError drops the *url.Error wrapper, whose message repeats the
// whole URL, password included.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// redact masks the password of a URL, or, when s does not parse as one,
// everything between "://" and the last '@', so that no error message
// shows a secret.
func redact(s string) string {
	if u, err := url.Parse(s); err == nil {
		return u.Redacted()
	}
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		if at := strings.LastIndex(s, "@"); at >= 0 {
			return "xxxxx" + s[at:]
		}
		return s
	}
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		return scheme + "://xxxxx" + rest[at:]
	}
	return s
}

// validateConfigs checks a layout for what New and Parse both
// refuse: no shards, bad or duplicate names, nil options, and addresses
// used twice.
func validateConfigs(shards []Config) error {
	if len(shards) == 0 {
		return fmt.Errorf("%w: no shards", driver.ErrInvalidOption)
	}
	names := make(map[string]bool, len(shards))
	owner := make(map[string]string) // address -> "shard %q primary" / "replica"
	for i, s := range shards {
		if err := shardedbackend.CheckName(s.Name); err != nil {
			return fmt.Errorf("%w: shard %d: %w", driver.ErrInvalidOption, i, err)
		}
		if names[s.Name] {
			return fmt.Errorf("%w: duplicate shard name %q", driver.ErrInvalidOption, s.Name)
		}
		names[s.Name] = true
		if s.Primary == nil {
			return fmt.Errorf("%w: shard %q: nil primary options", driver.ErrInvalidOption, s.Name)
		}
		primaryAddr := address(s.Primary)
		if err := claim(owner, primaryAddr, s.Name, "primary"); err != nil {
			return err
		}
		for j, r := range s.Replicas {
			if r == nil {
				return fmt.Errorf("%w: shard %q: nil options for replica %d", driver.ErrInvalidOption, s.Name, j)
			}
			addr := address(r)
			if addr == primaryAddr {
				return fmt.Errorf("%w: shard %q: replica %d has the primary's address %s", driver.ErrInvalidOption, s.Name, j, addr)
			}
			if err := claim(owner, addr, s.Name, fmt.Sprintf("replica %d", j)); err != nil {
				return err
			}
		}
	}
	return nil
}

// claim records that role of shard uses addr, or reports who already does.
func claim(owner map[string]string, addr, shard, role string) error {
	who := fmt.Sprintf("shard %q %s", shard, role)
	if prev, taken := owner[addr]; taken {
		return fmt.Errorf("%w: address %s is used twice: by %s and by %s", driver.ErrInvalidOption, addr, prev, who)
	}
	owner[addr] = who
	return nil
}

// address is the server options name, as compared for duplicates: the
// network and the address as written, host in lower case, with go-redis's
// defaults filled in.
func address(o *goredis.Options) string {
	network, addr := o.Network, o.Addr
	if network == "" {
		network = "tcp"
	}
	if addr == "" && network == "tcp" {
		addr = "localhost:6379"
	}
	if network != "unix" {
		addr = strings.ToLower(addr)
	}
	return network + "://" + addr
}
