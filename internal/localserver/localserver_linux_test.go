//go:build linux

package localserver

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestOrphanHelper is run in a child test binary by TestServersDieWithParent:
// it starts servers, prints their pids and waits to be killed.
func TestOrphanHelper(t *testing.T) {
	if os.Getenv("LOCALSERVER_ORPHAN_HELPER") != "1" {
		t.Skip("helper for TestServersDieWithParent")
	}
	r, err := StartRedis(RedisOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := StartMemcached(MemcachedOptions{})
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("PIDS %d %d %s %s\n", r.proc.cur.cmd.Process.Pid, m.proc.cur.cmd.Process.Pid, r.dir, m.dir)
	time.Sleep(30 * time.Second) // killed long before
}

// TestServersDieWithParent checks that the parent-death signal kills servers
// whose test binary was SIGKILLed without any cleanup.
func TestServersDieWithParent(t *testing.T) {
	t.Parallel()
	if !Available(RedisServerBinary) || !Available(MemcachedBinary) {
		if RequireServers() {
			t.Fatal("redis-server or memcached not available")
		}
		t.Skip("redis-server or memcached not available")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestOrphanHelper$", "-test.v", "-test.timeout=60s")
	cmd.Env = append(os.Environ(), "LOCALSERVER_ORPHAN_HELPER=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()

	report := make(chan []string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "PIDS "); ok {
				report <- strings.Fields(rest)
				break
			}
		}
		close(report)
		_, _ = io.Copy(io.Discard, out)
	}()
	var fields []string
	select {
	case fields = <-report:
	case <-time.After(30 * time.Second):
		t.Fatal("helper did not report its server pids")
	}
	if len(fields) != 4 {
		t.Fatalf("helper reported %q", fields)
	}
	var ps []int
	for _, f := range fields[:2] {
		p, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("helper reported %q", fields)
		}
		ps = append(ps, p)
	}
	// The helper dies without cleaning up: remove its directories once its
	// servers are gone.
	for _, dir := range fields[2:] {
		if !strings.Contains(filepath.Base(dir), "localserver-") {
			t.Fatalf("helper reported unexpected directory %q", dir)
		}
		defer os.RemoveAll(dir)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, pid := range ps {
		for alive(pid) {
			if time.Now().After(deadline) {
				t.Fatalf("server pid %d survived its parent", pid)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}
