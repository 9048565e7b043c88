package localserver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// MemcachedOptions configures a memcached started by this package.
type MemcachedOptions struct {
	// MemoryMB is the item memory limit in megabytes (-m). Zero means 64.
	MemoryMB int
	// Args are extra memcached command-line arguments, appended after the
	// package's defaults. They must not set the listen address (-l) or the
	// ports (-p, -U).
	Args []string
	// StartTimeout bounds how long the server may take to answer "version".
	// Zero means 10 seconds.
	StartTimeout time.Duration
}

// Memcached is a memcached process listening on a loopback port. It is safe
// for concurrent use.
type Memcached struct {
	addr string
	port int
	dir  string
	proc *process

	closeOnce sync.Once
	closeErr  error
}

// StartMemcached starts memcached on a free loopback port (UDP disabled) and
// waits until it answers "version". When running as root, "-u root" is added
// unless Args set -u, since memcached refuses to run as root otherwise. The
// error wraps [ErrBinaryNotFound] when memcached cannot be found.
func StartMemcached(opts MemcachedOptions) (*Memcached, error) {
	path, err := LookPath(MemcachedBinary)
	if err != nil {
		return nil, err
	}
	return startOnFreePort("memcached", func() (*Memcached, *process, error) {
		m, err := newMemcached(path, opts)
		if err != nil {
			return nil, nil, err
		}
		return m, m.proc, nil
	})
}

// newMemcached reserves a port and a directory (for the process's output)
// and prepares (but does not start) the process.
func newMemcached(path string, opts MemcachedOptions) (*Memcached, error) {
	port, err := reservePort(false)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "localserver-memcached-")
	if err != nil {
		releasePort(port, false)
		return nil, fmt.Errorf("localserver: memcached directory: %w", err)
	}
	mem := opts.MemoryMB
	if mem <= 0 {
		mem = 64
	}
	args := []string{
		"-l", "127.0.0.1",
		"-p", strconv.Itoa(port),
		"-U", "0",
		"-m", strconv.Itoa(mem),
	}
	if os.Geteuid() == 0 && !slices.ContainsFunc(opts.Args, func(a string) bool {
		return a == "-u" || strings.HasPrefix(a, "--user")
	}) {
		args = append(args, "-u", "root")
	}
	args = append(args, opts.Args...)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	return &Memcached{
		addr: addr,
		port: port,
		dir:  dir,
		proc: &process{
			name:         "memcached",
			path:         path,
			dir:          dir,
			args:         args,
			addr:         addr,
			probe:        memcachedProbe,
			startTimeout: opts.StartTimeout,
			// memcached acts on SIGTERM only at its next one-second clock
			// tick, and a cache has nothing to save.
			killOnClose: true,
		},
	}, nil
}

// memcachedProbe checks that the memcached at addr answers "version" and
// is the process pid (per "stats").
func memcachedProbe(ctx context.Context, addr string, pid int) error {
	c, err := dialContext(ctx, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if _, err := c.Write([]byte("version\r\nstats\r\n")); err != nil {
		return err
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "VERSION ") {
		return fmt.Errorf("version answered %q", strings.TrimSpace(line))
	}
	got := ""
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return err
		}
		line = strings.TrimSpace(line)
		if line == "END" {
			break
		}
		if v, ok := strings.CutPrefix(line, "STAT pid "); ok {
			got = v
		}
	}
	if got != strconv.Itoa(pid) {
		return fmt.Errorf("%w: answered by another memcached (pid %q, want %d)", errPortInUse, got, pid)
	}
	return nil
}

// Addr returns the server's address, "127.0.0.1:port". It does not change
// across Stop and Start.
func (m *Memcached) Addr() string { return m.addr }

// Stop stops the server gracefully (SIGTERM, waiting up to 15 s before
// SIGKILL), keeping its port reserved so Start can bring it back on the same
// address. memcached acts on SIGTERM at its next clock tick, so this takes
// up to about a second. The cache is lost. Stopping a stopped server is a
// no-op.
func (m *Memcached) Stop() error { return m.proc.stop() }

// Start restarts a stopped server on the same address and waits until it
// answers. It is a no-op if the server is running and fails with [ErrClosed]
// after Close.
func (m *Memcached) Start() error { return m.proc.start() }

// Close kills the server (SIGKILL: memcached takes up to a second to act on
// SIGTERM and has nothing to save), releases its port and removes its
// directory. It is idempotent: later calls return the first call's result.
func (m *Memcached) Close() error {
	m.closeOnce.Do(func() {
		err := m.proc.close()
		err = errors.Join(err, os.RemoveAll(m.dir))
		releasePort(m.port, false)
		m.closeErr = err
	})
	return m.closeErr
}
