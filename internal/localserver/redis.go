package localserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

// RedisOptions configures a Redis server started by this package.
type RedisOptions struct {
	// Args are extra redis-server command-line arguments, appended after the
	// package's defaults (so they override them), for example
	// []string{"--maxmemory", "10mb"}. They must not set port, bind, dir or
	// logfile, which the package controls.
	Args []string
	// Dir is the server's working and data directory. If empty, a temporary
	// directory is created and Close removes it. A non-empty Dir must exist
	// and is left in place.
	Dir string
	// StartTimeout bounds how long the server may take to answer PING (and,
	// for replicas, to finish the initial sync). Zero means 10 seconds.
	StartTimeout time.Duration
}

// Redis is a redis-server process listening on a loopback port. It is safe
// for concurrent use.
type Redis struct {
	addr   string
	port   int
	bus    bool // cluster node: port+10000 is reserved too
	dir    string
	ownDir bool
	proc   *process

	closeOnce sync.Once
	closeErr  error
}

// StartRedis starts a standalone redis-server on a free loopback port and
// waits until it answers PING. The error wraps [ErrBinaryNotFound] when
// redis-server cannot be found.
func StartRedis(opts RedisOptions) (*Redis, error) {
	return startRedis(opts, nil, false)
}

// StartRedisReplica starts a redis-server that replicates primary
// (replicaof), and waits until the link to the primary is up and the replica
// has caught up with everything written to the primary before the call. A
// nil primary gives an error wrapping [ErrInvalidArgument].
func StartRedisReplica(primary *Redis, opts RedisOptions) (*Redis, error) {
	if primary == nil {
		return nil, fmt.Errorf("%w: StartRedisReplica: nil primary", ErrInvalidArgument)
	}
	extra := []string{"--replicaof", "127.0.0.1", strconv.Itoa(primary.port)}
	r, err := startRedis(opts, extra, false)
	if err != nil {
		return nil, err
	}
	timeout := opts.StartTimeout
	if timeout <= 0 {
		timeout = defaultStartTimeout
	}
	if err := r.WaitReplicaSynced(timeout); err != nil {
		return nil, errors.Join(err, r.Close())
	}
	return r, nil
}

// startRedis starts redis-server with the package defaults, extra and then
// opts.Args, retrying on a new port when the chosen one is taken.
func startRedis(opts RedisOptions, extra []string, bus bool) (*Redis, error) {
	path, err := LookPath(RedisServerBinary)
	if err != nil {
		return nil, err
	}
	return startOnFreePort("redis-server", func() (*Redis, *process, error) {
		r, err := newRedis(path, opts, extra, bus)
		if err != nil {
			return nil, nil, err
		}
		return r, r.proc, nil
	})
}

// serverDir returns the directory a server works in: the caller's, made
// absolute, or a new temporary one that the server owns and removes on
// Close.
func serverDir(callerDir, tempPrefix string) (dir string, own bool, err error) {
	if callerDir != "" {
		dir, err = filepath.Abs(callerDir)
		return dir, false, err
	}
	dir, err = os.MkdirTemp("", tempPrefix)
	return dir, true, err
}

// newRedis reserves a port and a directory and prepares (but does not start)
// the process.
func newRedis(path string, opts RedisOptions, extra []string, bus bool) (*Redis, error) {
	port, err := reservePort(bus)
	if err != nil {
		return nil, err
	}
	dir, ownDir, err := serverDir(opts.Dir, "localserver-redis-")
	if err != nil {
		releasePort(port, bus)
		return nil, fmt.Errorf("localserver: redis-server directory: %w", err)
	}
	logFile := filepath.Join(dir, "redis.log")
	args := []string{
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--daemonize", "no",
		"--protected-mode", "no",
		"--save", "",
		"--appendonly", "no",
		"--dir", dir,
		"--logfile", logFile,
		"--enable-debug-command", "yes",
		"--repl-diskless-sync-delay", "0",
	}
	args = append(args, extra...)
	args = append(args, opts.Args...)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	return &Redis{
		addr:   addr,
		port:   port,
		bus:    bus,
		dir:    dir,
		ownDir: ownDir,
		proc: &process{
			name:         "redis-server",
			path:         path,
			dir:          dir,
			args:         args,
			addr:         addr,
			logFiles:     []string{logFile},
			probe:        redisProbe,
			startTimeout: opts.StartTimeout,
		},
	}, nil
}

// redisProbe checks that the Redis at addr answers PING with PONG and is
// the process pid.
func redisProbe(ctx context.Context, addr string, pid int) error {
	c, err := dialContextRESP(ctx, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	v, err := c.do("PING")
	if err != nil {
		return err
	}
	if v != "PONG" {
		return fmt.Errorf("PING answered %#v", v)
	}
	v, err = c.do("INFO", "server")
	if err != nil {
		return err
	}
	s, _ := v.(string)
	got := parseInfo(s)["process_id"]
	if got != strconv.Itoa(pid) {
		return fmt.Errorf("%w: answered by another redis-server (process_id %q, want %d)", errPortInUse, got, pid)
	}
	return nil
}

// Addr returns the server's address, "127.0.0.1:port". It does not change
// across Stop and Start.
func (r *Redis) Addr() string { return r.addr }

// Dir returns the server's working directory, which holds its log file
// (redis.log) and any data files.
func (r *Redis) Dir() string { return r.dir }

// Stop stops the server gracefully (SIGTERM, waiting up to 15 s before
// SIGKILL). The port stays reserved and the directory is kept, so Start can
// bring the server back on the same address. Stopping a stopped server is a
// no-op. With the default options nothing is persisted, so a restarted
// server starts empty (a restarted replica resyncs from its primary).
func (r *Redis) Stop() error { return r.proc.stop() }

// Kill kills the server with SIGKILL (kill -9): no shutdown, no last write
// to disk, connections left dangling, as when a host dies. Start brings it
// back.
func (r *Redis) Kill() { r.proc.kill9() }

// Start restarts a stopped server on the same address and waits until it
// answers PING. It is a no-op if the server is running and fails with
// [ErrClosed] after Close. It can fail if another process took the port
// while the server was stopped.
func (r *Redis) Start() error { return r.proc.start() }

// Close stops the server, releases its port and removes its directory if the
// package created it. It is idempotent: later calls return the first
// call's result.
func (r *Redis) Close() error {
	r.closeOnce.Do(func() {
		err := r.proc.close()
		if r.ownDir {
			err = errors.Join(err, os.RemoveAll(r.dir))
		}
		releasePort(r.port, r.bus)
		r.closeErr = err
	})
	return r.closeErr
}

// WaitReplicaSynced waits until r, which must be a replica, has its link to
// its primary up, no sync in progress, and a replication offset at least the
// primary's offset as observed once the link is up. Everything written to the
// primary before the call is then readable on the replica. The primary is the
// one the replica itself reports (INFO replication), so this also works for
// Redis Cluster replicas.
func (r *Redis) WaitReplicaSynced(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	target := int64(-1)
	for {
		err := r.replicaCaughtUp(&target, deadline)
		if err == nil {
			return nil
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("localserver: replica %s not in sync after %v: %w%s", r.addr, timeout, err, r.proc.logTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// replicaCaughtUp makes one check for WaitReplicaSynced. *target holds the
// primary's offset once it has been read.
func (r *Redis) replicaCaughtUp(target *int64, deadline time.Time) error {
	info, err := redisInfo(r.addr, cmdTimeout(deadline), "INFO", "replication")
	if err != nil {
		return err
	}
	if role := info["role"]; role != "slave" {
		return fmt.Errorf("not a replica (role %q)", role)
	}
	if s := info["master_link_status"]; s != "up" {
		return fmt.Errorf("master_link_status is %q", s)
	}
	if s := info["master_sync_in_progress"]; s != "0" {
		return fmt.Errorf("master_sync_in_progress is %q", s)
	}
	if *target < 0 {
		primary := net.JoinHostPort(info["master_host"], info["master_port"])
		pinfo, err := redisInfo(primary, cmdTimeout(deadline), "INFO", "replication")
		if err != nil {
			return fmt.Errorf("primary %s: %w", primary, err)
		}
		off, err := strconv.ParseInt(pinfo["master_repl_offset"], 10, 64)
		if err != nil {
			return fmt.Errorf("primary %s: master_repl_offset: %w", primary, err)
		}
		*target = off
	}
	off, err := strconv.ParseInt(info["slave_repl_offset"], 10, 64)
	if err != nil {
		return fmt.Errorf("slave_repl_offset: %w", err)
	}
	if off < *target {
		return fmt.Errorf("replica offset %d behind primary offset %d", off, *target)
	}
	return nil
}

// cmdTimeout is the timeout for one command issued while waiting until
// deadline: at most 2 s, at least 100 ms.
func cmdTimeout(deadline time.Time) time.Duration {
	d := time.Until(deadline)
	if d > 2*time.Second {
		d = 2 * time.Second
	}
	if d < 100*time.Millisecond {
		d = 100 * time.Millisecond
	}
	return d
}
