package localserver

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// failoverTimeout bounds the wait for a sentinel to promote a replica. A
// failover takes about SentinelDownAfter plus up to a second of deliberate
// random delay plus one INFO period (1 s); the rest is headroom for a loaded
// machine.
const failoverTimeout = 20 * time.Second

// TestRedisSentinelFailover runs a real failover: a sentinel watching a
// primary with one replica promotes the replica once the primary stops, the
// promoted replica keeps the data and takes writes, and a restarted sentinel
// remembers the new primary.
func TestRedisSentinelFailover(t *testing.T) {
	t.Parallel()
	primary := RedisT(t, RedisOptions{})
	do(t, primary.Addr(), "SET", "before", "1")
	replica := RedisReplicaT(t, primary, RedisOptions{})
	s := RedisSentinelT(t, primary, "tk-primary", RedisOptions{})

	if s.MasterName() != "tk-primary" {
		t.Errorf("MasterName() = %q", s.MasterName())
	}
	if !strings.HasPrefix(s.Addr(), "127.0.0.1:") {
		t.Errorf("Addr() = %q, want 127.0.0.1:port", s.Addr())
	}
	if _, err := os.Stat(filepath.Join(s.Dir(), sentinelConfFile)); err != nil {
		t.Errorf("sentinel config: %v", err)
	}
	got, err := s.MasterAddr()
	if err != nil {
		t.Fatal(err)
	}
	if got != primary.Addr() {
		t.Fatalf("MasterAddr() = %q, want the primary %q", got, primary.Addr())
	}
	if _, err := redisDo(s.Addr(), cmdDeadline, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", "unknown"); err != nil {
		t.Errorf("asking for an unmonitored name: %v", err)
	}

	if err := primary.Stop(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := s.WaitMaster(replica.Addr(), failoverTimeout); err != nil {
		t.Fatal(err)
	}
	t.Logf("failover observed %v after the primary stopped", time.Since(start))

	// The sentinel reports the switch only after the replica confirmed its
	// promotion, so the replica is a writable primary by now.
	v := do(t, replica.Addr(), "INFO", "replication")
	if role := parseInfo(v.(string))["role"]; role != "master" {
		t.Fatalf("promoted replica reports role %q", role)
	}
	if v := do(t, replica.Addr(), "GET", "before"); v != "1" {
		t.Errorf("promoted replica GET before = %#v, want \"1\"", v)
	}
	if v := do(t, replica.Addr(), "SET", "after", "2"); v != "OK" {
		t.Errorf("SET on the promoted replica = %#v", v)
	}

	// The sentinel rewrote its configuration: a restart keeps the new view.
	if err := s.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := s.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if _, err := s.MasterAddr(); err == nil {
		t.Fatal("MasterAddr succeeded while the sentinel was stopped")
	}
	if err := s.Start(); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if err := s.Start(); err != nil {
		t.Fatalf("Start while running: %v", err)
	}
	if got, err := s.MasterAddr(); err != nil || got != replica.Addr() {
		t.Fatalf("MasterAddr() after restart = %q, %v; want %q", got, err, replica.Addr())
	}

	addr := s.Addr()
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := s.Start(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Start after Close = %v, want ErrClosed", err)
	}
	if _, err := redisDo(addr, time.Second, "PING"); err == nil {
		t.Fatal("PING succeeded after Close")
	}
	if _, err := os.Stat(s.Dir()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("sentinel directory after Close: %v, want it removed", err)
	}
}

// TestRedisSentinelOwnDir checks that a caller's directory whose name needs
// quoting in sentinel.conf works, and that Close leaves it in place.
func TestRedisSentinelOwnDir(t *testing.T) {
	t.Parallel()
	primary := RedisT(t, RedisOptions{})
	dir := filepath.Join(t.TempDir(), `odd "dir" \ name`)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s := RedisSentinelT(t, primary, "m", RedisOptions{Dir: dir})
	if got, err := s.MasterAddr(); err != nil || got != primary.Addr() {
		t.Fatalf("MasterAddr() = %q, %v; want %q", got, err, primary.Addr())
	}
	if s.Dir() != dir {
		t.Errorf("Dir() = %q, want %q", s.Dir(), dir)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, sentinelLogFile)); err != nil {
		t.Errorf("log in the caller's directory after Close: %v", err)
	}
}

func TestInvalidArguments(t *testing.T) {
	t.Parallel()
	primary := &Redis{port: 1}
	for _, name := range []string{"", "has space", "new\nline", `quo"te`, "tab\t", strings.Repeat("n", 129)} {
		if _, err := StartRedisSentinel(primary, name, RedisOptions{}); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("StartRedisSentinel(name %q) = %v, want ErrInvalidArgument", name, err)
		}
	}
	if _, err := StartRedisSentinel(nil, "m", RedisOptions{}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("StartRedisSentinel(nil primary) = %v, want ErrInvalidArgument", err)
	}
	if _, err := StartRedisReplica(nil, RedisOptions{}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("StartRedisReplica(nil) = %v, want ErrInvalidArgument", err)
	}
	if _, err := StartRedisCluster(2, 0); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("StartRedisCluster(2, 0) = %v, want ErrInvalidArgument", err)
	}
	if _, err := StartRedisCluster(3, -1); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("StartRedisCluster(3, -1) = %v, want ErrInvalidArgument", err)
	}
	if _, err := confQuote("a\x01b"); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("confQuote with a control character = %v, want ErrInvalidArgument", err)
	}
}

// TestPromotableReplicas checks the parsing of SENTINEL REPLICAS replies,
// including malformed ones.
func TestPromotableReplicas(t *testing.T) {
	t.Parallel()
	entry := func(kv ...string) []any {
		a := make([]any, len(kv))
		for i, s := range kv {
			a[i] = s
		}
		return a
	}
	reply := []any{
		entry("ip", "127.0.0.1", "port", "1", "flags", "slave", "master-link-status", "ok"),
		entry("ip", "127.0.0.1", "port", "2", "flags", "slave", "master-link-status", "err"),
		entry("ip", "127.0.0.1", "port", "3", "flags", "s_down,slave", "master-link-status", "ok"),
		entry("ip", "127.0.0.1", "port", "4", "flags", "slave,disconnected", "master-link-status", "ok"),
	}
	got, err := promotableReplicas(reply)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || !got["127.0.0.1:1"] {
		t.Errorf("promotable = %v, want only 127.0.0.1:1", got)
	}
	for _, bad := range []any{"x", []any{"x"}, []any{entry("odd")}, nil} {
		if _, err := promotableReplicas(bad); err == nil {
			t.Errorf("promotableReplicas(%#v) succeeded", bad)
		}
	}
	info := parseInfo("role:master\r\nconnected_slaves:2\r\nslave0:ip=127.0.0.1,port=7,state=online,offset=1,lag=0\r\n" +
		"slave1:ip=127.0.0.1,port=8,state=wait_bgsave,offset=0,lag=0\r\nslave_x:junk\r\n")
	if got := onlineReplicas(info); len(got) != 1 || got[0] != "127.0.0.1:7" {
		t.Errorf("onlineReplicas = %v, want [127.0.0.1:7]", got)
	}
}
