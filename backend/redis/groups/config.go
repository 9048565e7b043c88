package redisgroups

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	shardedbackend "github.com/throttlekit/throttlekit/backend/sharded"
	"github.com/throttlekit/throttlekit/throttler/driver"

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
// Anything malformed or ambiguous is an error wrapping
// driver.ErrInvalidOption that names the offending entry by its position
// and says what is wrong: no groups, an empty entry, a missing '=', an
// empty, invalid or duplicate name, a URL go-redis rejects (bad scheme,
// port or database, unknown parameter), a context_timeout_enabled other
// than true or 1, a replica URL with a path, query or fragment, or of
// another kind of scheme than its primary, a replica with the address of
// its primary, and an address used twice, within a group or by two groups.
// Addresses are compared as written (host names are not resolved).
//
// The error never quotes the configuration: not a name, a host, a
// parameter or any other part of it. A password holding ',', '#', '/', '?'
// or '@' unescaped splits the string in places nobody can predict, so any
// quoted part could be a piece of it; positions are safe to print.
func Parse(config string) ([]Config, error) {
	if strings.TrimSpace(config) == "" {
		return nil, driver.Errorf("%w: no groups (empty configuration)", driver.ErrInvalidOption)
	}
	entries := strings.Split(config, ",")
	shards := make([]Config, 0, len(entries))
	for i, entry := range entries {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			return nil, driver.Errorf("%w: entry %d is empty (a stray ',')", driver.ErrInvalidOption, i+1)
		}
		name, rawURL, ok := strings.Cut(entry, "=")
		if !ok {
			return nil, driver.Errorf("%w: entry %d: missing '=' between group name and URL (a ',' in a password must be written %%2C)", driver.ErrInvalidOption, i+1)
		}
		name, rawURL = strings.TrimSpace(name), strings.TrimSpace(rawURL)
		if shardedbackend.CheckName(name) != nil {
			return nil, driver.Errorf("%w: entry %d: the group name must be 1 to %d ASCII letters, digits, '.', '_' or '-'",
				driver.ErrInvalidOption, i+1, shardedbackend.MaxNameLen)
		}
		sc, err := parseShardURL(name, rawURL)
		if err != nil {
			return nil, driver.Errorf("%w: entry %d: %w", driver.ErrInvalidOption, i+1, err)
		}
		shards = append(shards, sc)
	}
	if err := checkLayout(shards, true); err != nil {
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
		return Config{}, urlProblem(rawURL, err)
	}
	if err := checkHostPort(u); err != nil {
		return Config{}, err
	}
	if u.Fragment != "" || strings.Contains(rawURL, "#") {
		return Config{}, errors.New("unexpected fragment (a '#' must be written %23)")
	}
	rest, replicas, err := splitReplicas(u.RawQuery)
	if err != nil {
		return Config{}, err
	}
	u.RawQuery = rest
	primary, err := goredis.ParseURL(u.String())
	if err != nil {
		return Config{}, goRedisProblem(err)
	}
	primary.ContextTimeoutEnabled = true
	sc := Config{Name: name, Primary: primary}
	for i, raw := range replicas {
		opts, err := parseReplicaURL(u, raw)
		if err != nil {
			return Config{}, driver.Errorf("replica %d: %w", i, err)
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
			return "", nil, errors.New("a query parameter has a malformed escape")
		}
		if key == contextTimeoutParam {
			if v, err := url.QueryUnescape(value); err != nil || v != "true" && v != "1" {
				return "", nil, driver.Errorf("%s: the groups always enable it; leave it out or write true", contextTimeoutParam)
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
		return "", nil, errors.New("the query does not parse (a ';' or a malformed escape)")
	}
	return rest, replicas, nil
}

// parseReplicaURL builds a replica's options: the primary's URL (replica
// parameters removed) with the replica's scheme, address and, when it has
// some, user info.
func parseReplicaURL(primary *url.URL, raw string) (*goredis.Options, error) {
	r, err := url.Parse(raw)
	if err != nil {
		return nil, urlProblem(raw, err)
	}
	if err := checkHostPort(r); err != nil {
		return nil, err
	}
	if !sameSchemeKind(primary.Scheme, r.Scheme) {
		return nil, errors.New("its scheme does not fit the primary's (redis or rediss beside redis or rediss, unix beside unix)")
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
			return nil, errors.New("a unix URL has no host: write unix:///path/to/socket")
		}
		built.Path, built.RawPath = r.Path, r.RawPath
	} else {
		if r.Path != "" && r.Path != "/" {
			return nil, errors.New("a replica URL has no path: the database is the primary's")
		}
		if r.Host == "" {
			return nil, errors.New("no host")
		}
		built.Host = r.Host
	}
	opts, err := goredis.ParseURL(built.String())
	if err != nil {
		return nil, goRedisProblem(err)
	}
	return opts, nil
}

// urlProblem says what url.Parse rejected without its message, which
// quotes the URL, password included. A missing scheme or a bad port is said
// as such; a password is suspected only in a URL that has user info (an
// '@'), where an unescaped '/' in it makes the rest read as a port.
func urlProblem(raw string, err error) error {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "missing protocol scheme"), strings.Contains(msg, "first path segment in URL cannot contain colon"):
		return errors.New("no scheme: write redis://host:port (or rediss://, unix://)")
	case strings.Contains(msg, "invalid port") && strings.Contains(raw, "@"):
		return errors.New("the port is not a number from 1 to 65535 (or a password holding '/', '?' or '#' that is not percent-encoded)")
	case strings.Contains(msg, "invalid port"):
		return errors.New("the port is not a number from 1 to 65535")
	case strings.Contains(msg, "in host name"):
		return errors.New("invalid character in the host")
	case strings.Contains(msg, "invalid URL escape"):
		return errors.New("malformed percent-escape (a '%' in a password must be written %25)")
	case strings.Contains(msg, "invalid userinfo"):
		return errors.New("invalid user or password (special characters in a password must be percent-encoded)")
	}
	return errors.New("the URL does not parse (special characters in a password must be percent-encoded)")
}

// checkHostPort refuses what go-redis would silently replace with its
// defaults, as an unset variable leaves it: "redis://:6379" (go-redis
// dials localhost), "redis://host:" (port 6379), a port out of range, and a
// URL without "//" ("localhost:6379" reads as the scheme "localhost").
func checkHostPort(u *url.URL) error {
	switch {
	case u.Opaque != "":
		return errors.New("no scheme: write redis://host:port (or rediss://, unix://)")
	case u.Scheme == "unix":
		return nil
	case u.Scheme != "redis" && u.Scheme != "rediss":
		return nil // goRedisProblem says it
	case u.Hostname() == "":
		return errors.New("no host: write redis://host:port")
	case strings.HasSuffix(u.Host, ":"):
		return errors.New("no port after ':' (an unset variable?): write redis://host:port")
	}
	if port := u.Port(); port != "" {
		if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
			return errors.New("the port is not a number from 1 to 65535")
		}
	}
	return nil
}

// goRedisProblem says what go-redis's ParseURL rejected without its
// message, which may quote a value; a query parameter is named.
func goRedisProblem(err error) error {
	msg := err.Error()
	switch {
	case strings.Contains(msg, "scheme"):
		return errors.New("unsupported URL scheme (want redis, rediss or unix)")
	case strings.Contains(msg, "invalid database number: strconv"):
		return errors.New("query parameter \"db\": not a database number")
	case strings.Contains(msg, "database"), strings.Contains(msg, "URL path"):
		return errors.New("invalid database number in the URL path")
	case strings.Contains(msg, "unix socket"):
		return errors.New("empty unix socket path")
	case strings.Contains(msg, "unexpected option"):
		// Not named: a password holding an unescaped '?' ends up here as a
		// parameter name.
		return errors.New("unknown query parameter (go-redis options such as dial_timeout, max_retries, db)")
	case strings.Contains(msg, " number:"), strings.Contains(msg, " duration:"), strings.Contains(msg, " boolean:"):
		// "redis: invalid <name> number: ...": the name, one of go-redis's
		// own option names, and not the value.
		rest := strings.TrimPrefix(msg, "redis: invalid ")
		name, kind, _ := strings.Cut(rest, " ")
		kind, _, _ = strings.Cut(kind, ":")
		return fmt.Errorf("query parameter %q: go-redis cannot read its value as a %s", name, kind)
	}
	return errors.New("go-redis rejects the URL (scheme, host, port, database or a parameter)")
}

func sameSchemeKind(a, b string) bool {
	tcp := func(s string) bool { return s == "redis" || s == "rediss" }
	return tcp(a) && tcp(b) || a == "unix" && b == "unix"
}

// checkLayout checks a layout for what New and Parse both refuse: no
// groups, bad or duplicate names, nil options, and addresses used twice.
// For a layout read from a string (fromString), groups are named by their
// position and addresses are not shown, since either could hold a piece
// of a password the string was split inside; a layout built in code is
// described by its names and addresses, which hold no password.
func checkLayout(groups []Config, fromString bool) error {
	if len(groups) == 0 {
		return driver.Errorf("%w: no groups", driver.ErrInvalidOption)
	}
	label := func(i int) string {
		if fromString {
			return fmt.Sprintf("entry %d", i+1)
		}
		return fmt.Sprintf("group %q", groups[i].Name)
	}
	shown := func(addr string) string {
		if fromString {
			return "an address"
		}
		return "address " + addr
	}
	names := make(map[string]int, len(groups))
	owner := make(map[string]string) // address -> "entry 2 primary"
	for i, g := range groups {
		if err := shardedbackend.CheckName(g.Name); err != nil {
			if fromString {
				return driver.Errorf("%w: %s: the group name must be 1 to %d ASCII letters, digits, '.', '_' or '-'",
					driver.ErrInvalidOption, label(i), shardedbackend.MaxNameLen)
			}
			return driver.Errorf("%w (group %d)", err, i)
		}
		if prev, dup := names[g.Name]; dup {
			if !fromString {
				return driver.Errorf("%w: duplicate group name %q", driver.ErrInvalidOption, g.Name)
			}
			return driver.Errorf("%w: %s has the name of %s", driver.ErrInvalidOption, label(i), label(prev))
		}
		names[g.Name] = i
		if g.Primary == nil {
			return driver.Errorf("%w: %s: nil primary options", driver.ErrInvalidOption, label(i))
		}
		primaryAddr := address(g.Primary)
		if err := claim(owner, primaryAddr, label(i)+" primary", shown(primaryAddr)); err != nil {
			return err
		}
		for j, r := range g.Replicas {
			if r == nil {
				return driver.Errorf("%w: %s: nil options for replica %d", driver.ErrInvalidOption, label(i), j)
			}
			addr := address(r)
			if addr == primaryAddr {
				return driver.Errorf("%w: %s: replica %d has the primary's address", driver.ErrInvalidOption, label(i), j)
			}
			if err := claim(owner, addr, fmt.Sprintf("%s replica %d", label(i), j), shown(addr)); err != nil {
				return err
			}
		}
	}
	return nil
}

// claim records that who uses addr, or reports who already does.
func claim(owner map[string]string, addr, who, shown string) error {
	if prev, taken := owner[addr]; taken {
		return driver.Errorf("%w: %s is used twice: by %s and by %s", driver.ErrInvalidOption, shown, prev, who)
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
