package redisgroups

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler/driver"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
)

// These tests only parse: no server is contacted (go-redis clients dial
// lazily, and none is made here but in TestNewRedisFromCode, which never
// sends a command).

func TestParseConfig(t *testing.T) {
	got, err := Parse(" a = redis://10.0.0.1:6379?replica=redis://10.0.0.2:6379&replica=redis://10.0.0.3 ," +
		"b=rediss://user:secret@cache-b.internal:6380/2?dial_timeout=250ms&max_retries=-1," +
		"c=redis://:pw@10.0.0.5?replica=redis://other:pw2@10.0.0.6:6379&db=3&read_timeout=1s," +
		"d=unix:///run/redis-d.sock?db=1&replica=unix:///run/redis-d-replica.sock")
	require.NoError(t, err)
	require.Len(t, got, 4)

	a := got[0]
	assert.Equal(t, "a", a.Name)
	assert.Equal(t, "10.0.0.1:6379", a.Primary.Addr)
	require.Len(t, a.Replicas, 2)
	assert.Equal(t, "10.0.0.2:6379", a.Replicas[0].Addr)
	assert.Equal(t, "10.0.0.3:6379", a.Replicas[1].Addr, "go-redis's default port")

	b := got[1]
	assert.Equal(t, "cache-b.internal:6380", b.Primary.Addr)
	assert.Equal(t, "user", b.Primary.Username)
	assert.Equal(t, "secret", b.Primary.Password)
	assert.Equal(t, 2, b.Primary.DB)
	assert.Equal(t, 250*time.Millisecond, b.Primary.DialTimeout)
	assert.Equal(t, -1, b.Primary.MaxRetries)
	assert.NotNil(t, b.Primary.TLSConfig)
	assert.Empty(t, b.Replicas)

	c := got[2]
	assert.Equal(t, "10.0.0.5:6379", c.Primary.Addr)
	assert.Equal(t, 3, c.Primary.DB)
	require.Len(t, c.Replicas, 1)
	r := c.Replicas[0]
	assert.Equal(t, "10.0.0.6:6379", r.Addr)
	assert.Equal(t, "other", r.Username, "a replica's own user info wins")
	assert.Equal(t, "pw2", r.Password)
	assert.Equal(t, 3, r.DB, "the replica serves the primary's database")
	assert.Equal(t, time.Second, r.ReadTimeout, "the shard's options apply to its replicas")

	d := got[3]
	assert.Equal(t, "unix", d.Primary.Network)
	assert.Equal(t, "/run/redis-d.sock", d.Primary.Addr)
	require.Len(t, d.Replicas, 1)
	assert.Equal(t, "/run/redis-d-replica.sock", d.Replicas[0].Addr)
	assert.Equal(t, 1, d.Replicas[0].DB)

	for _, sc := range got {
		for _, o := range append([]*goredis.Options{sc.Primary}, sc.Replicas...) {
			assert.True(t, o.ContextTimeoutEnabled, "%s %s", sc.Name, o.Addr)
		}
	}
}

// context_timeout_enabled, which go-redis's ParseURL for one server
// rejects, may say what the sharded backend does anyway.
func TestParseConfigAcceptsContextTimeoutEnabled(t *testing.T) {
	for _, value := range []string{"true", "1"} {
		got, err := Parse("a=redis://h1?context_timeout_enabled=" + value + "&replica=redis://h2&read_timeout=1s")
		require.NoError(t, err, value)
		require.Len(t, got, 1)
		assert.True(t, got[0].Primary.ContextTimeoutEnabled)
		assert.Equal(t, time.Second, got[0].Primary.ReadTimeout)
		require.Len(t, got[0].Replicas, 1)
		assert.True(t, got[0].Replicas[0].ContextTimeoutEnabled)
	}
}

func TestParseConfigInheritsThePrimarysPassword(t *testing.T) {
	got, err := Parse("a=redis://:s3cret@10.0.0.1?replica=redis://10.0.0.2")
	require.NoError(t, err)
	assert.Equal(t, "s3cret", got[0].Replicas[0].Password)
}

func TestParseConfigAcceptsAnEncodedReplicaURL(t *testing.T) {
	got, err := Parse("a=redis://10.0.0.1?replica=redis%3A%2F%2F10.0.0.2%3A6380")
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.2:6380", got[0].Replicas[0].Addr)
}

func TestParseConfigEscapes(t *testing.T) {
	// A ',' in a password is written %2C; the replica's text is taken as it
	// stands, so its escapes are decoded once, as in any URL.
	got, err := Parse("a=redis://:p%2Cw%40rd@10.0.0.1?replica=redis://:r%2Bx%40y@10.0.0.2")
	require.NoError(t, err)
	assert.Equal(t, "p,w@rd", got[0].Primary.Password)
	assert.Equal(t, "r+x@y", got[0].Replicas[0].Password)
}

// TestParseConfigErrors lists every malformed or ambiguous configuration:
// each error matches driver.ErrInvalidOption and names the offending entry
// by position and the problem, and none quotes the configuration.
func TestParseConfigErrors(t *testing.T) {
	for _, c := range []struct {
		name, config string
		want         []string
	}{
		{"empty", "", []string{"no groups"}},
		{"blank", "  ", []string{"no groups"}},
		{"stray comma", "a=redis://h1,", []string{"entry 2 is empty"}},
		{"leading comma", ",a=redis://h1", []string{"entry 1 is empty"}},
		{"missing =", "a=redis://h1,redis://h2", []string{"entry 2", "missing '='"}},
		{"missing = hides password", "redis://:hunter2@h2", []string{"entry 1", "missing '='"}},
		{"empty name", "=redis://h1", []string{"entry 1", "group name"}},
		{"bad name", "a b=redis://h1", []string{"entry 1", "group name"}},
		{"name with slash", "a/b=redis://h1", []string{"entry 1", "group name"}},
		{"long name", strings.Repeat("x", 65) + "=redis://h1", []string{"entry 1", "1 to 64"}},
		{"duplicate name", "a=redis://h1,b=redis://h2,a=redis://h3", []string{"entry 3 has the name of entry 1"}},
		{"empty URL", "a=", []string{"entry 1", "empty URL"}},
		{"no scheme", "a=10.0.0.1:6379", []string{"entry 1", "no scheme: write redis://host:port"}},
		{"no scheme, a name", "a=localhost:6379", []string{"entry 1", "no scheme: write redis://host:port"}},
		{"no host", "a=redis://:6379", []string{"entry 1", "no host: write redis://host:port"}},
		{"empty port", "a=redis://h1:", []string{"entry 1", "no port after ':' (an unset variable?)"}},
		{"port zero", "a=redis://h1:0", []string{"entry 1", "the port is not a number from 1 to 65535"}},
		{"port too large", "a=redis://h1:70000", []string{"entry 1", "the port is not a number from 1 to 65535"}},
		{"replica port too large", "a=redis://h1?replica=redis://h2:70000", []string{"entry 1", "replica 0", "the port is not a number"}},
		{"bad database parameter", "a=redis://h1?db=x", []string{"entry 1", `query parameter "db": not a database number`}},
		{"bad number", "a=redis://h1?max_retries=many", []string{"entry 1", `query parameter "max_retries": go-redis cannot read its value as a number`}},
		{"bad scheme", "a=http://h1:6379", []string{"entry 1", "unsupported URL scheme"}},
		{"bad port", "b=redis://h1:notaport", []string{"entry 1", "the port is not a number from 1 to 65535"}},
		{"bad database", "b=redis://h1/x", []string{"entry 1", "invalid database number"}},
		{"unknown parameter", "a=redis://h1?replica=redis://h2&bogus=1", []string{"entry 1", "unknown query parameter"}},
		{"misspelt replica", "a=redis://h1?replicas=redis://h2", []string{"entry 1", "unknown query parameter"}},
		{"bad option value", "a=redis://h1?dial_timeout=soon", []string{"entry 1", `query parameter "dial_timeout": go-redis cannot read its value as a duration`}},
		{"semicolon", "a=redis://h1?dial_timeout=1s;read_timeout=1s", []string{"entry 1", "';'"}},
		{"fragment", "a=redis://h1#x", []string{"entry 1", "fragment"}},
		{"context timeout off", "a=redis://h1?context_timeout_enabled=false", []string{"entry 1", "context_timeout_enabled", "always enable it"}},
		{"context timeout 0", "a=redis://h1?context_timeout_enabled=0", []string{"entry 1", "context_timeout_enabled"}},
		{"context timeout empty", "a=redis://h1?context_timeout_enabled=", []string{"entry 1", "context_timeout_enabled"}},
		{"context timeout yes", "a=redis://h1?context_timeout_enabled=yes", []string{"entry 1", "context_timeout_enabled"}},
		{"empty replica", "a=redis://h1?replica=", []string{"entry 1", "empty replica URL"}},
		{"replica without scheme", "a=redis://h1?replica=h2:6379", []string{"entry 1", "replica 0"}},
		{"replica with options", "a=redis://h1?replica=redis://h2?db=2", []string{"entry 1", "replica 0", "no query"}},
		{"replica with a database", "a=redis://h1/1?replica=redis://h2/2", []string{"entry 1", "replica 0", "no path"}},
		{"replica of another kind", "a=redis://h1?replica=unix:///tmp/r.sock", []string{"entry 1", "replica 0", "scheme does not fit"}},
		{"replica without host", "a=redis://h1?replica=redis://", []string{"entry 1", "replica 0", "no host"}},
		{"second replica bad", "a=redis://h1?replica=redis://h2&replica=redis://h3:x", []string{"entry 1", "replica 1"}},
		{"replica is its primary", "a=redis://10.0.0.1:6379?replica=redis://10.0.0.1", []string{"entry 1", "replica 0 has the primary's address"}},
		{"replica is its primary, case", "a=redis://Cache-A:6379?replica=redis://cache-a", []string{"entry 1", "primary's address"}},
		{"replica twice", "a=redis://h1?replica=redis://h2&replica=redis://h2:6379", []string{"used twice", "entry 1 replica 0", "entry 1 replica 1"}},
		{"two groups, one primary", "a=redis://h1,b=redis://h1:6379", []string{"used twice", "entry 1 primary", "entry 2 primary"}},
		{"replica of another group", "a=redis://h1?replica=redis://h2,b=redis://h3?replica=redis://h2", []string{"used twice", "entry 1 replica 0", "entry 2 replica 0"}},
		{"primary is another's replica", "a=redis://h1?replica=redis://h2,b=redis://h2", []string{"used twice", "entry 2 primary"}},
		{"password hidden", "a=redis://:hunter2@h1?bogus=1", []string{"entry 1", "unknown query parameter"}},
		{"password with a slash", "a=redis://:hun/ter2@h1:6379", []string{"entry 1", "the port is not a number from 1 to 65535 (or a password holding '/'"}},
		{"replica password hidden", "a=redis://h1?replica=redis://:hunter2@h2?x=1", []string{"entry 1", "no query"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			groups, err := Parse(c.config)
			require.ErrorIs(t, err, driver.ErrInvalidOption)
			assert.Nil(t, groups)
			for _, part := range c.want {
				assert.Contains(t, err.Error(), part)
			}
			assert.NotContains(t, err.Error(), "hunter2")
			if !strings.ContainsAny(c.config, "@,") {
				assert.NotContains(t, err.Error(), "password", "only a URL with user info has a password to blame")
			}

			b, err := Open(c.config)
			assert.ErrorIs(t, err, driver.ErrInvalidOption)
			assert.Nil(t, b)
		})
	}
}

// awkwardPasswords hold every character that splits or ends a part of the
// configuration string when written unescaped.
var awkwardPasswords = []string{
	"hunter2,b=redis", "pa,ss", "s3cr#et", "with/slash", "what?ever", "at@sign", "p@ss,w#rd/x?y",
	"x,y=redis://evilhost:1", "colon:pass", "sp ace", "per%cent", "amp&ersand", "eq=ual", "brace{s}",
	"rep=lica&replica=redis://q", "%2Cencoded", "ünïcode,ß", "tail@", "@head", ",lead", "trail,",
}

// TestNoPasswordInAnyError writes each awkward password into every place a
// configuration string can hold one, escaped and unescaped, and checks
// that no error shows any piece of it.
func TestNoPasswordInAnyError(t *testing.T) {
	for _, pw := range awkwardPasswords {
		for _, config := range passwordConfigs(pw) {
			checkNoPassword(t, pw, config)
		}
	}
	// A missing group name: the old parser quoted the whole entry.
	checkNoPassword(t, "hunter2", "redis://:hunter2@h1")
}

// FuzzNoPasswordInAnyError does the same with passwords the fuzzer makes.
func FuzzNoPasswordInAnyError(f *testing.F) {
	for _, pw := range awkwardPasswords {
		f.Add(pw)
	}
	f.Fuzz(func(t *testing.T, pw string) {
		if len(pw) < 4 {
			return // too short to tell a piece of it from the rest of a message
		}
		for _, config := range passwordConfigs(pw) {
			checkNoPassword(t, pw, config)
		}
	})
}

// passwordConfigs places pw in the primary's and a replica's user info,
// unescaped and escaped, beside bad and good parts.
func passwordConfigs(pw string) []string {
	esc := url.QueryEscape(pw)
	var out []string
	for _, p := range []string{pw, esc} {
		out = append(out,
			"a=redis://:"+p+"@h1:6379",
			"a=redis://user:"+p+"@h1:6379?bogus=1",
			"a=redis://:"+p+"@h1:6379,b=redis://:"+p+"@h1:6379",
			"a=redis://h1?replica=redis://:"+p+"@h2",
			"a=redis://h1?replica=redis://:"+p+"@h2?x=1",
			"a=redis://:"+p+"@h1:notaport",
			"redis://:"+p+"@h1",
			"a=http://:"+p+"@h1",
			"a=redis://:"+p+"@h1/x",
			"a=redis://:"+p+"@h1?dial_timeout=soon",
			":"+p+"@h1=redis://h1",
		)
	}
	return out
}

// checkNoPassword parses config and fails if an error shows any piece of
// pw of four bytes or more (shorter pieces occur in any message).
func checkNoPassword(t *testing.T, pw, config string) {
	t.Helper()
	_, err := Parse(config)
	if err == nil {
		return
	}
	msg := err.Error()
	for _, secret := range []string{pw, url.QueryEscape(pw), url.PathEscape(pw)} {
		for i := 0; i+4 <= len(secret); i++ {
			piece := secret[i : i+4]
			if strings.Contains(msg, piece) && !strings.Contains(safeWords, piece) {
				t.Fatalf("config %q: error %q shows %q, a piece of the password %q", config, msg, piece, pw)
			}
		}
	}
}

// safeWords is every fixed word the parser's messages use; a password piece
// that is also one of them (say "redis" in "hunter2,b=redis") says nothing.
const safeWords = "throttlekit: invalid option: entry group name must be ASCII letters, digits, '.', '_' or '-' " +
	"missing '=' between group name and URL (a ',' in a password must be written %2C) is empty (a stray ',') " +
	"the URL does not parse (special characters in a password must be percent-encoded) unexpected fragment " +
	"(a '#' must be written %23) unsupported URL scheme (want redis, rediss or unix) invalid database number " +
	"in the URL path unknown query parameter (go-redis options such as dial_timeout, max_retries, db) " +
	"a query parameter has a value go-redis cannot read go-redis rejects the URL (scheme, host, port, database " +
	"or a parameter) replica a replica URL has no query: put options on the shard URL, they apply to every " +
	"server of the shard no path: the database is the primary's has the primary's address is used twice: by " +
	"and by primary an address empty URL no groups (empty configuration) has the name of its scheme does not " +
	"fit the primary's (redis or rediss beside redis or rediss, unix beside unix) no host context_timeout_enabled" +
	": the groups always enable it; leave it out or write true the query does not parse (a ';' or a malformed " +
	"escape) a query parameter has a malformed escape empty replica URL 1 to 64 " +
	"no scheme: write redis://host:port (or rediss://, unix://) the port is not a number from 1 to 65535 " +
	"(or a password holding '/', '?' or '#' that is not percent-encoded) invalid character in the host " +
	"malformed percent-escape (a '%' in a password must be written %25) invalid user or password " +
	"(special characters in a password must be percent-encoded) no host: write redis://host:port " +
	"no port after ':' (an unset variable?): write redis://host:port query parameter \"db\": not a database " +
	"number go-redis cannot read its value as a number duration boolean replica 0: a replica URL"

func TestNewRedisChecksLayoutsFromCode(t *testing.T) {
	opt := func(addr string) *goredis.Options { return &goredis.Options{Addr: addr} }
	for _, c := range []struct {
		name   string
		shards []Config
		want   string
	}{
		{"no groups", nil, "no groups"},
		{"empty name", []Config{{Primary: opt("h1:6379")}}, "empty shard name"},
		{"duplicate name", []Config{{Name: "a", Primary: opt("h1:1")}, {Name: "a", Primary: opt("h2:1")}}, `duplicate group name "a"`},
		{"nil primary", []Config{{Name: "a"}}, `group "a": nil primary options`},
		{"nil replica", []Config{{Name: "a", Primary: opt("h1:1"), Replicas: []*goredis.Options{nil}}}, `group "a": nil options for replica 0`},
		{"replica is primary", []Config{{Name: "a", Primary: opt("h1:1"), Replicas: []*goredis.Options{opt("H1:1")}}}, "replica 0 has the primary's address"},
		{"default address twice", []Config{{Name: "a", Primary: &goredis.Options{}}, {Name: "b", Primary: opt("localhost:6379")}}, "tcp://localhost:6379 is used twice"},
		{"shared address", []Config{{Name: "a", Primary: opt("h1:1")}, {Name: "b", Primary: opt("h2:1"), Replicas: []*goredis.Options{opt("h1:1")}}}, "tcp://h1:1 is used twice"},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, err := New(c.shards)
			require.ErrorIs(t, err, driver.ErrInvalidOption)
			assert.Contains(t, err.Error(), c.want)
			assert.Nil(t, b)
		})
	}

	t.Run("bad redis option", func(t *testing.T) {
		b, err := New([]Config{{Name: "a", Primary: opt("h1:1")}}, WithBackendOptions(redisbackend.WithPrefix("{bad}")))
		require.ErrorIs(t, err, driver.ErrInvalidOption)
		assert.Contains(t, err.Error(), "WithPrefix")
		assert.Contains(t, err.Error(), `group "a" primary`)
		assert.Equal(t, 1, strings.Count(err.Error(), "invalid option"), "%v", err)
		assert.Nil(t, b)
	})
}

func TestNewRedisFromCode(t *testing.T) {
	primary := &goredis.Options{Addr: "127.0.0.1:1"}
	b, err := New([]Config{
		{Name: "b", Primary: primary, Replicas: []*goredis.Options{{Addr: "127.0.0.1:2"}}},
		{Name: "a", Primary: &goredis.Options{Addr: "127.0.0.1:3"}},
	}, WithBackendOptions(redisbackend.WithPrefix("app:")))
	require.NoError(t, err)
	assert.Equal(t, []string{"b", "a"}, b.Shards())
	assert.Zero(t, primary.PoolSize, "the caller's options are not modified")
	assert.False(t, primary.ContextTimeoutEnabled, "the caller's options are not modified")
	assert.NoError(t, b.Close())
	ob, err := open(primary, nil)
	require.NoError(t, err)
	assert.True(t, ob.client.Options().ContextTimeoutEnabled, "every client ends commands at the context's deadline")
	assert.NoError(t, ob.Close())
}
