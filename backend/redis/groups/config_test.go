package redisgroups

import (
	"github.com/throttlekit/throttlekit/throttler/driver"
	"strings"
	"testing"
	"time"

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
// each error matches driver.ErrInvalidOption and names the offending part, and none
// shows a password.
func TestParseConfigErrors(t *testing.T) {
	for _, c := range []struct {
		name, config string
		want         []string
	}{
		{"empty", "", []string{"no shards"}},
		{"blank", "  ", []string{"no shards"}},
		{"stray comma", "a=redis://h1,", []string{"entry 2 is empty"}},
		{"leading comma", ",a=redis://h1", []string{"entry 1 is empty"}},
		{"missing =", "a=redis://h1,redis://h2", []string{"entry 2", "missing '='", `"redis://h2"`}},
		{"missing = hides password", "redis://:hunter2@h2", []string{"entry 1", "missing '='", "xxxxx@h2"}},
		{"empty name", "=redis://h1", []string{"entry 1", "empty shard name"}},
		{"bad name", "a b=redis://h1", []string{"entry 1", `"a b"`}},
		{"name with slash", "a/b=redis://h1", []string{`"a/b"`, `'/'`}},
		{"long name", strings.Repeat("x", 65) + "=redis://h1", []string{"longer than 64"}},
		{"duplicate name", "a=redis://h1,b=redis://h2,a=redis://h3", []string{`duplicate shard name "a"`}},
		{"empty URL", "a=", []string{`shard "a"`, "empty URL"}},
		{"no scheme", "a=10.0.0.1:6379", []string{`shard "a"`, "10.0.0.1:6379"}},
		{"bad scheme", "a=http://h1:6379", []string{`shard "a"`, "invalid URL scheme: http"}},
		{"bad port", "b=redis://h1:notaport", []string{`shard "b"`, "notaport"}},
		{"bad database", "b=redis://h1/x", []string{`shard "b"`, "invalid database number"}},
		{"unknown parameter", "a=redis://h1?replica=redis://h2&bogus=1", []string{`shard "a"`, "unexpected option: bogus"}},
		{"misspelt replica", "a=redis://h1?replicas=redis://h2", []string{`shard "a"`, "unexpected option: replicas"}},
		{"bad option value", "a=redis://h1?dial_timeout=soon", []string{`shard "a"`, "dial_timeout"}},
		{"semicolon", "a=redis://h1?dial_timeout=1s;read_timeout=1s", []string{`shard "a"`, "semicolon"}},
		{"fragment", "a=redis://h1#x", []string{`shard "a"`, "fragment"}},
		{"context timeout off", "a=redis://h1?context_timeout_enabled=false", []string{`shard "a"`, "context_timeout_enabled", "always enables it"}},
		{"context timeout 0", "a=redis://h1?context_timeout_enabled=0", []string{`shard "a"`, "context_timeout_enabled"}},
		{"context timeout empty", "a=redis://h1?context_timeout_enabled=", []string{`shard "a"`, "context_timeout_enabled"}},
		{"context timeout yes", "a=redis://h1?context_timeout_enabled=yes", []string{`shard "a"`, "context_timeout_enabled"}},
		{"empty replica", "a=redis://h1?replica=", []string{`shard "a"`, "empty replica URL"}},
		{"replica without scheme", "a=redis://h1?replica=h2:6379", []string{`shard "a"`, "replica 0", `"h2:6379"`}},
		{"replica with options", "a=redis://h1?replica=redis://h2?db=2", []string{`shard "a"`, "replica 0", "no query"}},
		{"replica with a database", "a=redis://h1/1?replica=redis://h2/2", []string{`shard "a"`, "replica 0", "no path"}},
		{"replica of another kind", "a=redis://h1?replica=unix:///tmp/r.sock", []string{`shard "a"`, "replica 0", `scheme "unix"`}},
		{"replica without host", "a=redis://h1?replica=redis://", []string{`shard "a"`, "replica 0", "no host"}},
		{"second replica bad", "a=redis://h1?replica=redis://h2&replica=redis://h3:x", []string{`shard "a"`, "replica 1"}},
		{"replica is its primary", "a=redis://10.0.0.1:6379?replica=redis://10.0.0.1", []string{`shard "a"`, "replica 0 has the primary's address tcp://10.0.0.1:6379"}},
		{"replica is its primary, case", "a=redis://Cache-A:6379?replica=redis://cache-a", []string{`shard "a"`, "primary's address tcp://cache-a:6379"}},
		{"replica twice", "a=redis://h1?replica=redis://h2&replica=redis://h2:6379", []string{"tcp://h2:6379 is used twice", `shard "a" replica 0`, `shard "a" replica 1`}},
		{"two shards, one primary", "a=redis://h1,b=redis://h1:6379", []string{"tcp://h1:6379 is used twice", `shard "a" primary`, `shard "b" primary`}},
		{"replica of another shard", "a=redis://h1?replica=redis://h2,b=redis://h3?replica=redis://h2", []string{"tcp://h2:6379 is used twice", `shard "a" replica 0`, `shard "b" replica 0`}},
		{"primary is another's replica", "a=redis://h1?replica=redis://h2,b=redis://h2", []string{"used twice", `shard "b" primary`}},
		{"password masked", "a=redis://:hunter2@h1?bogus=1", []string{"xxxxx", "bogus"}},
		{"replica password masked", "a=redis://h1?replica=redis://:hunter2@h2?x=1", []string{"xxxxx", "no query"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			shards, err := Parse(c.config)
			require.ErrorIs(t, err, driver.ErrInvalidOption)
			assert.Nil(t, shards)
			for _, part := range c.want {
				assert.Contains(t, err.Error(), part)
			}
			assert.NotContains(t, err.Error(), "hunter2")

			b, err := Open(c.config)
			assert.ErrorIs(t, err, driver.ErrInvalidOption)
			assert.Nil(t, b)
		})
	}
}

func TestNewRedisChecksLayoutsFromCode(t *testing.T) {
	opt := func(addr string) *goredis.Options { return &goredis.Options{Addr: addr} }
	for _, c := range []struct {
		name   string
		shards []Config
		want   string
	}{
		{"no shards", nil, "no shards"},
		{"empty name", []Config{{Primary: opt("h1:6379")}}, "empty shard name"},
		{"duplicate name", []Config{{Name: "a", Primary: opt("h1:1")}, {Name: "a", Primary: opt("h2:1")}}, `duplicate shard name "a"`},
		{"nil primary", []Config{{Name: "a"}}, `shard "a": nil primary options`},
		{"nil replica", []Config{{Name: "a", Primary: opt("h1:1"), Replicas: []*goredis.Options{nil}}}, `shard "a": nil options for replica 0`},
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
		assert.Contains(t, err.Error(), "prefix")
		assert.Contains(t, err.Error(), `group "a" primary`)
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
