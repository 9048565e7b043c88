package localserver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// cmdDeadline bounds every single command the tests send.
const cmdDeadline = 5 * time.Second

// do runs a Redis command and fails the test on error.
func do(t *testing.T, addr string, args ...string) any {
	t.Helper()
	v, err := redisDo(addr, cmdDeadline, args...)
	if err != nil {
		t.Fatalf("%s %v: %v", addr, args, err)
	}
	return v
}

func TestRedisStandaloneStopStart(t *testing.T) {
	t.Parallel()
	r := RedisT(t, RedisOptions{})
	addr := r.Addr()
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Fatalf("Addr() = %q, want 127.0.0.1:port", addr)
	}
	if v := do(t, addr, "PING"); v != "PONG" {
		t.Fatalf("PING = %#v", v)
	}
	// The test configuration must have been accepted as given.
	for k, want := range map[string]string{
		"save":                 "",
		"appendonly":           "no",
		"protected-mode":       "no",
		"enable-debug-command": "yes",
		"bind":                 "127.0.0.1",
		"port":                 strconv.Itoa(r.port),
	} {
		v := do(t, addr, "CONFIG", "GET", k)
		a, ok := v.([]any)
		if !ok || len(a) != 2 || a[1] != want {
			t.Errorf("CONFIG GET %s = %#v, want %q", k, v, want)
		}
	}
	if v := do(t, addr, "DEBUG", "SET-ACTIVE-EXPIRE", "0"); v != "OK" {
		t.Fatalf("DEBUG SET-ACTIVE-EXPIRE 0 = %#v", v)
	}
	do(t, addr, "SET", "k", "v")

	if err := r.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := r.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if _, err := redisDo(addr, time.Second, "PING"); err == nil {
		t.Fatal("PING succeeded after Stop")
	}

	if err := r.Start(); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if err := r.Start(); err != nil {
		t.Fatalf("Start while running: %v", err)
	}
	if r.Addr() != addr {
		t.Fatalf("Addr changed across restart: %q -> %q", addr, r.Addr())
	}
	if v := do(t, addr, "PING"); v != "PONG" {
		t.Fatalf("PING after Start = %#v", v)
	}
	if v := do(t, addr, "GET", "k"); v != nil {
		t.Errorf("GET k after restart = %#v, want nil (persistence is off)", v)
	}

	if err := r.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := r.Stop(); err != nil {
		t.Fatalf("Stop after Close: %v", err)
	}
	if err := r.Start(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Start after Close = %v, want ErrClosed", err)
	}
	if _, err := redisDo(addr, time.Second, "PING"); err == nil {
		t.Fatal("PING succeeded after Close")
	}
}

func TestRedisReplica(t *testing.T) {
	t.Parallel()
	primary := RedisT(t, RedisOptions{})
	do(t, primary.Addr(), "SET", "before", "1")

	replica := RedisReplicaT(t, primary, RedisOptions{})
	if v := do(t, replica.Addr(), "GET", "before"); v != "1" {
		t.Fatalf("replica GET before = %#v, want \"1\"", v)
	}

	for i := range 100 {
		do(t, primary.Addr(), "SET", fmt.Sprintf("key:%d", i), strconv.Itoa(i))
	}
	if err := replica.WaitReplicaSynced(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		if v := do(t, replica.Addr(), "GET", fmt.Sprintf("key:%d", i)); v != strconv.Itoa(i) {
			t.Fatalf("replica GET key:%d = %#v", i, v)
		}
	}
	if _, err := redisDo(replica.Addr(), cmdDeadline, "SET", "x", "y"); err == nil || !strings.Contains(err.Error(), "READONLY") {
		t.Errorf("SET on replica: err = %v, want READONLY", err)
	}
	if err := primary.WaitReplicaSynced(200 * time.Millisecond); err == nil {
		t.Error("WaitReplicaSynced on a primary succeeded")
	}

	// The replica resyncs after the primary restarts (empty, as nothing is
	// persisted).
	if err := primary.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := primary.Start(); err != nil {
		t.Fatal(err)
	}
	do(t, primary.Addr(), "SET", "after", "2")
	if err := replica.WaitReplicaSynced(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	if v := do(t, replica.Addr(), "GET", "after"); v != "2" {
		t.Fatalf("replica GET after = %#v, want \"2\"", v)
	}
}

func TestRedisCluster(t *testing.T) {
	t.Parallel()
	start := time.Now()
	c := RedisClusterT(t, 3, 1)
	t.Logf("3+3 cluster ready in %v", time.Since(start))

	addrs := c.Addrs()
	if len(addrs) != 6 || len(c.Nodes()) != 6 {
		t.Fatalf("got %d addrs, %d nodes, want 6", len(addrs), len(c.Nodes()))
	}
	roles := map[string]int{}
	for _, addr := range addrs {
		v, err := redisDo(addr, cmdDeadline, "CLUSTER", "INFO")
		if err != nil {
			t.Fatal(err)
		}
		info := parseInfo(v.(string))
		if info["cluster_state"] != "ok" || info["cluster_slots_assigned"] != "16384" || info["cluster_known_nodes"] != "6" {
			t.Errorf("%s: CLUSTER INFO state=%s slots_assigned=%s known_nodes=%s",
				addr, info["cluster_state"], info["cluster_slots_assigned"], info["cluster_known_nodes"])
		}
		v = do(t, addr, "INFO", "replication")
		roles[parseInfo(v.(string))["role"]]++
	}
	if roles["master"] != 3 || roles["slave"] != 3 {
		t.Errorf("roles = %v, want 3 masters and 3 slaves", roles)
	}

	// Write through a MOVED redirect, then read it back, also on a replica.
	owner := clusterSet(t, addrs[0], "greeting", "hello")
	if v := do(t, owner, "GET", "greeting"); v != "hello" {
		t.Fatalf("GET greeting on %s = %#v", owner, v)
	}
	if err := c.WaitReplicasSynced(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	read := 0
	for _, addr := range addrs {
		conn, err := dialRESP(addr, time.Now().Add(cmdDeadline))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.do("READONLY"); err != nil {
			t.Fatal(err)
		}
		v, err := conn.do("GET", "greeting")
		conn.Close()
		if err == nil && v == "hello" {
			read++
		}
	}
	if read != 2 {
		t.Errorf("greeting readable on %d nodes, want 2 (primary and its replica)", read)
	}

	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	for _, addr := range addrs {
		if _, err := redisDo(addr, time.Second, "PING"); err == nil {
			t.Errorf("%s still answers after Close", addr)
		}
	}
}

// clusterSet sends SET to addr, following one MOVED redirect, and returns
// the address that accepted it.
func clusterSet(t *testing.T, addr, key, val string) string {
	t.Helper()
	_, err := redisDo(addr, cmdDeadline, "SET", key, val)
	var re redis.Error
	if errors.As(err, &re) && strings.HasPrefix(re.Error(), "MOVED ") {
		f := strings.Fields(re.Error())
		addr = f[len(f)-1]
		_, err = redisDo(addr, cmdDeadline, "SET", key, val)
	}
	if err != nil {
		t.Fatalf("SET %s on %s: %v", key, addr, err)
	}
	return addr
}

func TestRedisClusterArgs(t *testing.T) {
	if _, err := StartRedisCluster(2, 0); err == nil {
		t.Error("StartRedisCluster(2, 0) succeeded")
	}
	if _, err := StartRedisCluster(3, -1); err == nil {
		t.Error("StartRedisCluster(3, -1) succeeded")
	}
}

// memcachedCmd sends a text-protocol request and returns the response up to
// and including the line for which done returns true.
func memcachedCmd(t *testing.T, addr, req string, done func(line string) bool) []string {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, cmdDeadline)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(cmdDeadline)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	var lines []string
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("reading reply to %q: %v (got %q)", req, err, lines)
		}
		line = strings.TrimRight(line, "\r\n")
		lines = append(lines, line)
		if done(line) {
			return lines
		}
	}
}

func isEnd(line string) bool { return line == "END" }

func TestMemcachedStopStart(t *testing.T) {
	t.Parallel()
	m := MemcachedT(t, MemcachedOptions{MemoryMB: 16})
	addr := m.Addr()

	set := func() {
		t.Helper()
		got := memcachedCmd(t, addr, "set greeting 0 0 5\r\nhello\r\n", func(string) bool { return true })
		if got[0] != "STORED" {
			t.Fatalf("set: %q", got)
		}
	}
	set()
	got := memcachedCmd(t, addr, "get greeting\r\n", isEnd)
	if len(got) != 3 || got[0] != "VALUE greeting 0 5" || got[1] != "hello" {
		t.Fatalf("get: %q", got)
	}
	stats := memcachedCmd(t, addr, "stats settings\r\n", isEnd)
	if !containsLine(stats, "STAT maxbytes "+strconv.Itoa(16<<20)) || !containsLine(stats, "STAT udpport 0") {
		t.Errorf("stats settings lack maxbytes 16 MiB / udpport 0: %q", stats)
	}

	if err := m.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if err := m.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatal("dial succeeded after Stop")
	}
	if err := m.Start(); err != nil {
		t.Fatalf("Start: %v", err)
	}
	if m.Addr() != addr {
		t.Fatalf("Addr changed across restart: %q -> %q", addr, m.Addr())
	}
	if got := memcachedCmd(t, addr, "get greeting\r\n", isEnd); len(got) != 1 {
		t.Fatalf("get after restart: %q, want a miss", got)
	}
	set()

	if err := m.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := m.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := m.Start(); !errors.Is(err, ErrClosed) {
		t.Fatalf("Start after Close = %v, want ErrClosed", err)
	}
}

func containsLine(lines []string, want string) bool {
	for _, l := range lines {
		if l == want {
			return true
		}
	}
	return false
}

// TestProbeRejectsForeignServer checks that a server answering on the port
// but with another pid counts as a port conflict, not as readiness.
func TestProbeRejectsForeignServer(t *testing.T) {
	t.Parallel()
	r := RedisT(t, RedisOptions{})
	ctx, cancel := context.WithTimeout(context.Background(), cmdDeadline)
	defer cancel()
	if err := redisProbe(ctx, r.Addr(), r.proc.cur.cmd.Process.Pid); err != nil {
		t.Fatalf("probe of own server: %v", err)
	}
	err := redisProbe(ctx, r.Addr(), 1)
	if !errors.Is(err, errPortInUse) {
		t.Fatalf("probe with wrong pid = %v, want errPortInUse", err)
	}
	m := MemcachedT(t, MemcachedOptions{})
	err = memcachedProbe(ctx, m.Addr(), 1)
	if !errors.Is(err, errPortInUse) {
		t.Fatalf("memcached probe with wrong pid = %v, want errPortInUse", err)
	}
}

// TestStartFailureIncludesLog checks that a server that cannot start reports
// its own output.
func TestStartFailureIncludesLog(t *testing.T) {
	t.Parallel()
	if !Available(RedisServerBinary) {
		t.Skip("redis-server not available")
	}
	_, err := StartRedis(RedisOptions{Args: []string{"--no-such-option", "1"}})
	if err == nil {
		t.Fatal("StartRedis with a bad option succeeded")
	}
	if !strings.Contains(err.Error(), "no-such-option") {
		t.Errorf("error lacks redis-server's complaint: %v", err)
	}
}

// fakeTB records Skip and Fatal calls instead of stopping the test.
type fakeTB struct {
	testing.TB
	skipped, failed bool
	msg             string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Skipf(format string, args ...any) {
	f.skipped, f.msg = true, fmt.Sprintf(format, args...)
}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.failed, f.msg = true, fmt.Sprintf(format, args...)
}
func (f *fakeTB) Cleanup(func()) { panic("Cleanup called although the start failed") }

func TestMissingBinary(t *testing.T) {
	t.Setenv("REDIS_SERVER", "/nonexistent/redis-server")
	t.Setenv("REDIS_CLI", "/nonexistent/redis-cli")
	t.Setenv("MEMCACHED", "/nonexistent/memcached")
	for _, b := range []string{RedisServerBinary, RedisCLIBinary, MemcachedBinary} {
		if Available(b) {
			t.Errorf("Available(%q) = true with override to a missing file", b)
		}
	}
	if _, err := StartRedis(RedisOptions{}); !errors.Is(err, ErrBinaryNotFound) {
		t.Errorf("StartRedis: %v, want ErrBinaryNotFound", err)
	}
	if _, err := StartRedisSentinel(&Redis{port: 1}, "m", RedisOptions{}); !errors.Is(err, ErrBinaryNotFound) {
		t.Errorf("StartRedisSentinel: %v, want ErrBinaryNotFound", err)
	}
	if _, err := StartRedisCluster(3, 0); !errors.Is(err, ErrBinaryNotFound) {
		t.Errorf("StartRedisCluster: %v, want ErrBinaryNotFound", err)
	}
	if _, err := StartMemcached(MemcachedOptions{}); !errors.Is(err, ErrBinaryNotFound) {
		t.Errorf("StartMemcached: %v, want ErrBinaryNotFound", err)
	}

	for _, tc := range []struct {
		ci, require string
		wantSkip    bool
	}{
		{"", "", true},
		{"", "0", true},
		{"true", "", false},
		{"", "1", false},
	} {
		t.Setenv("CI", tc.ci)
		t.Setenv("THROTTLEKIT_REQUIRE_SERVERS", tc.require)
		helpers := map[string]func(tb testing.TB){
			"RedisT":         func(tb testing.TB) { RedisT(tb, RedisOptions{}) },
			"RedisReplicaT":  func(tb testing.TB) { RedisReplicaT(tb, &Redis{port: 1}, RedisOptions{}) },
			"RedisSentinelT": func(tb testing.TB) { RedisSentinelT(tb, &Redis{port: 1}, "m", RedisOptions{}) },
			"RedisClusterT":  func(tb testing.TB) { RedisClusterT(tb, 3, 1) },
			"MemcachedT":     func(tb testing.TB) { MemcachedT(tb, MemcachedOptions{}) },
		}
		for name, h := range helpers {
			f := &fakeTB{TB: t}
			h(f)
			if f.skipped != tc.wantSkip || f.failed == tc.wantSkip {
				t.Errorf("CI=%q THROTTLEKIT_REQUIRE_SERVERS=%q: %s skipped=%v failed=%v, want skip=%v (%s)",
					tc.ci, tc.require, name, f.skipped, f.failed, tc.wantSkip, f.msg)
			}
		}
	}
}

// TestPortConflictDetected checks that a server failing because its port is
// taken reports errPortInUse, which makes the Start functions retry on
// another port.
func TestPortConflictDetected(t *testing.T) {
	t.Parallel()
	for _, name := range []string{RedisServerBinary, MemcachedBinary} {
		path, err := LookPath(name)
		if err != nil {
			if RequireServers() {
				t.Fatal(err)
			}
			t.Skip(err)
		}
		var proc *process
		var closeFn func() error
		if name == RedisServerBinary {
			r, err := newRedis(path, RedisOptions{}, nil, false)
			if err != nil {
				t.Fatal(err)
			}
			proc, closeFn = r.proc, r.Close
		} else {
			m, err := newMemcached(path, MemcachedOptions{})
			if err != nil {
				t.Fatal(err)
			}
			proc, closeFn = m.proc, m.Close
		}
		l, err := net.Listen("tcp", proc.addr)
		if err != nil {
			t.Fatal(err)
		}
		err = proc.start()
		l.Close()
		if !errors.Is(err, errPortInUse) {
			t.Errorf("%s on a taken port: %v, want errPortInUse", name, err)
		}
		if err := closeFn(); err != nil {
			t.Error(err)
		}
	}
}
