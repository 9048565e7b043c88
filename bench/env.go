package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/internal/localserver"
)

// env holds the servers of one run.
type env struct {
	standalone       string
	groups           []string
	cluster          []string
	memcached        string
	redisVersion     string
	memcachedVersion string

	closers []func() error
	mu      sync.Mutex
	admins  map[string]*redis.Client
}

// startEnv starts every server on loopback ports with the project's test
// helpers.
func startEnv() (*env, error) {
	e := &env{admins: map[string]*redis.Client{}}
	ok := false
	defer func() {
		if !ok {
			e.close()
		}
	}()
	for range 4 {
		r, err := localserver.StartRedis(localserver.RedisOptions{Args: []string{"--maxmemory-policy", "noeviction"}})
		if err != nil {
			return nil, fmt.Errorf("starting redis-server: %w", err)
		}
		e.closers = append(e.closers, r.Close)
		if e.standalone == "" {
			e.standalone = r.Addr()
		} else {
			e.groups = append(e.groups, r.Addr())
		}
	}
	c, err := localserver.StartRedisCluster(3, 0)
	if err != nil {
		return nil, fmt.Errorf("starting a redis cluster: %w", err)
	}
	e.closers = append(e.closers, c.Close)
	e.cluster = c.Addrs()
	m, err := localserver.StartMemcached(localserver.MemcachedOptions{MemoryMB: 256})
	if err != nil {
		return nil, fmt.Errorf("starting memcached: %w", err)
	}
	e.closers = append(e.closers, m.Close)
	e.memcached = m.Addr()
	e.redisVersion = version(localserver.RedisServerBinary, "--version")
	e.memcachedVersion = strings.TrimPrefix(version(localserver.MemcachedBinary, "-V"), "memcached ")
	ok = true
	return e, nil
}

// admin returns a client for reading a server's INFO.
func (e *env) admin(addr string) *redis.Client {
	e.mu.Lock()
	defer e.mu.Unlock()
	c, ok := e.admins[addr]
	if !ok {
		c = redis.NewClient(&redis.Options{Addr: addr})
		e.admins[addr] = c
	}
	return c
}

func (e *env) close() {
	for _, c := range e.admins {
		_ = c.Close()
	}
	var errs []error
	for i := len(e.closers) - 1; i >= 0; i-- {
		errs = append(errs, e.closers[i]())
	}
	if err := errors.Join(errs...); err != nil {
		fmt.Fprintln(os.Stderr, "stopping servers:", err)
	}
}

// version returns the first line a binary prints for its version flag.
func version(binary, flag string) string {
	path, err := localserver.LookPath(binary)
	if err != nil {
		return binary + " (not found)"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, flag).Output()
	if err != nil {
		return binary
	}
	line, _, _ := strings.Cut(string(out), "\n")
	return strings.TrimSpace(line)
}

// cpuModel returns the CPU model from /proc/cpuinfo, or the architecture.
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return runtime.GOARCH
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if v, ok := strings.CutPrefix(s.Text(), "model name"); ok {
			return strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
		}
	}
	return runtime.GOARCH
}

func osName() string { return runtime.GOOS + "/" + runtime.GOARCH }

// flush empties the given servers (FLUSHALL SYNC), so that a cell starts on
// empty servers whatever ran before it.
func (e *env) flush(servers []string) error {
	for _, addr := range servers {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := e.admin(addr).Do(ctx, "FLUSHALL", "SYNC").Err()
		cancel()
		if err != nil {
			return fmt.Errorf("flushing %s: %w", addr, err)
		}
	}
	return nil
}

// resetStats resets the servers' command statistics (CONFIG RESETSTAT), so
// that INFO commandstats after a run counts the run alone.
func (e *env) resetStats(servers []string) {
	for _, addr := range servers {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = e.admin(addr).ConfigResetStat(ctx).Err()
		cancel()
	}
}
