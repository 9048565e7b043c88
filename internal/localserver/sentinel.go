package localserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

const (
	// SentinelDownAfter is how long a sentinel started by this package lets
	// a monitored server go unanswered before it considers it down
	// (down-after-milliseconds). Redis's default of 30 s would make failover
	// tests crawl.
	SentinelDownAfter = time.Second
	// SentinelFailoverTimeout is the sentinel's failover-timeout. A sentinel
	// does not retry a failover of the same primary within twice this time,
	// so it is kept short for tests.
	SentinelFailoverTimeout = 5 * time.Second
	// sentinelConfFile and sentinelLogFile are the names, in the sentinel's
	// directory, of the config file it rewrites and of its log.
	sentinelConfFile = "sentinel.conf"
	sentinelLogFile  = "sentinel.log"
)

// RedisSentinel is a Redis Sentinel (redis-server run with --sentinel) on a
// loopback port, monitoring one primary under one master name with a quorum
// of 1, so that it alone can declare the primary down and fail over to a
// replica. It is safe for concurrent use.
type RedisSentinel struct {
	addr       string
	port       int
	dir        string
	ownDir     bool
	masterName string
	proc       *process

	closeOnce sync.Once
	closeErr  error
}

// StartRedisSentinel starts a Sentinel that monitors primary under
// masterName, and waits until it reports primary's address for masterName
// and knows, with their links to the primary up, every replica the primary
// lists as online, so that a failover can start as soon as the primary goes
// away. Start replicas (see [StartRedisReplica]) before the sentinel: a
// sentinel refreshes what it knows about replicas only every 10 s.
//
// The sentinel runs with down-after-milliseconds [SentinelDownAfter] and
// failover-timeout [SentinelFailoverTimeout]. Sentinel keeps its state in
// its configuration file, sentinel.conf in its directory, which it rewrites
// after every change (opts.Dir, if set, gets a fresh one); a sentinel
// restarted with Start therefore remembers failovers. opts.Args are appended
// to the command line after --sentinel and must not set port, bind, dir or
// logfile. masterName may hold letters, digits, '.', '_' and '-'; anything
// else, or a nil primary, gives an error wrapping [ErrInvalidArgument]. The
// error wraps [ErrBinaryNotFound] when redis-server cannot be found.
func StartRedisSentinel(primary *Redis, masterName string, opts RedisOptions) (*RedisSentinel, error) {
	if primary == nil {
		return nil, fmt.Errorf("%w: StartRedisSentinel: nil primary", ErrInvalidArgument)
	}
	if err := checkMasterName(masterName); err != nil {
		return nil, err
	}
	path, err := LookPath(RedisServerBinary)
	if err != nil {
		return nil, err
	}
	s, err := startOnFreePort("redis sentinel", func() (*RedisSentinel, *process, error) {
		s, err := newSentinel(path, primary, masterName, opts)
		if err != nil {
			return nil, nil, err
		}
		return s, s.proc, nil
	})
	if err != nil {
		return nil, err
	}
	timeout := opts.StartTimeout
	if timeout <= 0 {
		timeout = defaultStartTimeout
	}
	if err := s.waitMonitoring(primary, timeout); err != nil {
		return nil, errors.Join(err, s.Close())
	}
	return s, nil
}

// checkMasterName rejects names that would need quoting in sentinel.conf or
// that Sentinel commands could not take as one argument.
func checkMasterName(name string) error {
	if name == "" || len(name) > 128 {
		return fmt.Errorf("%w: master name %q must have 1 to 128 characters", ErrInvalidArgument, name)
	}
	for _, c := range []byte(name) {
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
		if !ok {
			return fmt.Errorf("%w: master name %q may hold only letters, digits, '.', '_' and '-'", ErrInvalidArgument, name)
		}
	}
	return nil
}

// newSentinel reserves a port and a directory, writes the configuration file
// and prepares (but does not start) the process.
func newSentinel(path string, primary *Redis, masterName string, opts RedisOptions) (*RedisSentinel, error) {
	port, err := reservePort(false)
	if err != nil {
		return nil, err
	}
	dir, ownDir, err := serverDir(opts.Dir, "localserver-sentinel-")
	if err != nil {
		releasePort(port, false)
		return nil, fmt.Errorf("localserver: redis sentinel directory: %w", err)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	s := &RedisSentinel{
		addr:       addr,
		port:       port,
		dir:        dir,
		ownDir:     ownDir,
		masterName: masterName,
	}
	confFile := filepath.Join(dir, sentinelConfFile)
	logFile := filepath.Join(dir, sentinelLogFile)
	conf, err := sentinelConfig(port, dir, logFile, masterName, primary.port)
	if err == nil {
		err = os.WriteFile(confFile, []byte(conf), 0o644)
	}
	if err != nil {
		_ = s.Close() // no process yet: releases the port and directory
		return nil, fmt.Errorf("localserver: redis sentinel configuration: %w", err)
	}
	// Sentinel refuses to run without a config file it can rewrite, so the
	// settings go there rather than on the command line.
	args := append([]string{confFile, "--sentinel"}, opts.Args...)
	s.proc = &process{
		name:         "redis-sentinel",
		path:         path,
		dir:          dir,
		args:         args,
		addr:         addr,
		logFiles:     []string{logFile},
		probe:        sentinelProbe(masterName),
		startTimeout: opts.StartTimeout,
	}
	return s, nil
}

// sentinelConfig returns the initial sentinel.conf. Hostname resolution
// stays off (Redis's default): every address is a literal 127.0.0.1.
func sentinelConfig(port int, dir, logFile, masterName string, primaryPort int) (string, error) {
	qdir, err := confQuote(dir)
	if err != nil {
		return "", err
	}
	qlog, err := confQuote(logFile)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	fmt.Fprintf(&b, "port %d\n", port)
	b.WriteString("bind 127.0.0.1\n")
	b.WriteString("daemonize no\n")
	b.WriteString("protected-mode no\n")
	fmt.Fprintf(&b, "dir %s\n", qdir)
	fmt.Fprintf(&b, "logfile %s\n", qlog)
	fmt.Fprintf(&b, "sentinel monitor %s 127.0.0.1 %d 1\n", masterName, primaryPort)
	fmt.Fprintf(&b, "sentinel down-after-milliseconds %s %d\n", masterName, SentinelDownAfter.Milliseconds())
	fmt.Fprintf(&b, "sentinel failover-timeout %s %d\n", masterName, SentinelFailoverTimeout.Milliseconds())
	return b.String(), nil
}

// confQuote quotes s for a Redis configuration file, whose parser
// (sdssplitargs) understands backslash escapes inside double quotes. Control
// characters are rejected rather than escaped.
func confQuote(s string) (string, error) {
	var b strings.Builder
	b.WriteByte('"')
	for _, c := range []byte(s) {
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c == 0x7f:
			return "", fmt.Errorf("%w: path %q holds a control character", ErrInvalidArgument, s)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String(), nil
}

// sentinelProbe checks that the sentinel at addr is the process pid (see
// redisProbe) and answers an address for masterName, which a sentinel does
// once it has loaded its configuration.
func sentinelProbe(masterName string) probeFunc {
	return func(ctx context.Context, addr string, pid int) error {
		if err := redisProbe(ctx, addr, pid); err != nil {
			return err
		}
		c, err := dialContextRESP(ctx, addr)
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = masterAddrReply(c, masterName)
		return err
	}
}

// masterAddrReply runs SENTINEL GET-MASTER-ADDR-BY-NAME on c and returns the
// address as "host:port".
func masterAddrReply(c *respConn, masterName string) (string, error) {
	v, err := c.do("SENTINEL", "GET-MASTER-ADDR-BY-NAME", masterName)
	if err != nil {
		return "", err
	}
	a, ok := v.([]any)
	if !ok || len(a) != 2 {
		return "", fmt.Errorf("SENTINEL GET-MASTER-ADDR-BY-NAME %s answered %#v", masterName, v)
	}
	host, hok := a[0].(string)
	port, pok := a[1].(string)
	if !hok || !pok || host == "" || port == "" {
		return "", fmt.Errorf("SENTINEL GET-MASTER-ADDR-BY-NAME %s answered %#v", masterName, v)
	}
	return net.JoinHostPort(host, port), nil
}

// waitMonitoring waits until the sentinel reports primary as the master and
// knows all of primary's online replicas with their links up (see
// StartRedisSentinel).
func (s *RedisSentinel) waitMonitoring(primary *Redis, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := s.checkMonitoring(primary, deadline)
		if err == nil {
			return nil
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("localserver: redis sentinel %s not monitoring %s after %v: %w%s", s.addr, primary.Addr(), timeout, err, s.proc.logTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkMonitoring makes one pass of waitMonitoring's checks.
func (s *RedisSentinel) checkMonitoring(primary *Redis, deadline time.Time) error {
	got, err := s.masterAddr(cmdTimeout(deadline))
	if err != nil {
		return err
	}
	if got != primary.Addr() {
		return fmt.Errorf("sentinel reports master %s, want %s", got, primary.Addr())
	}
	info, err := redisInfo(primary.Addr(), cmdTimeout(deadline), "INFO", "replication")
	if err != nil {
		return fmt.Errorf("primary %s: INFO replication: %w", primary.Addr(), err)
	}
	want := onlineReplicas(info)
	v, err := redisDo(s.addr, cmdTimeout(deadline), "SENTINEL", "REPLICAS", s.masterName)
	if err != nil {
		return fmt.Errorf("SENTINEL REPLICAS: %w", err)
	}
	known, err := promotableReplicas(v)
	if err != nil {
		return err
	}
	for _, addr := range want {
		if !known[addr] {
			return fmt.Errorf("sentinel does not know replica %s with its link to the primary up yet", addr)
		}
	}
	return nil
}

// onlineReplicas lists the addresses of the replicas a primary's INFO
// replication reports as online (slaveN:ip=...,port=...,state=online,...).
func onlineReplicas(info map[string]string) []string {
	var addrs []string
	for k, v := range info {
		if !strings.HasPrefix(k, "slave") {
			continue
		}
		if _, err := strconv.Atoi(strings.TrimPrefix(k, "slave")); err != nil {
			continue
		}
		fields := map[string]string{}
		for _, kv := range strings.Split(v, ",") {
			if k, v, ok := strings.Cut(kv, "="); ok {
				fields[k] = v
			}
		}
		if fields["state"] == "online" && fields["ip"] != "" && fields["port"] != "" {
			addrs = append(addrs, net.JoinHostPort(fields["ip"], fields["port"]))
		}
	}
	return addrs
}

// promotableReplicas parses a SENTINEL REPLICAS reply (an array of flat
// field/value arrays) into the set of replicas the sentinel could promote
// now: not flagged down or disconnected, and reporting, in the INFO the
// sentinel last read from them, their link to the primary as up.
func promotableReplicas(v any) (map[string]bool, error) {
	list, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("SENTINEL REPLICAS answered %#v", v)
	}
	known := map[string]bool{}
	for _, entry := range list {
		kv, ok := entry.([]any)
		if !ok || len(kv)%2 != 0 {
			return nil, fmt.Errorf("SENTINEL REPLICAS entry %#v", entry)
		}
		fields := map[string]string{}
		for i := 0; i < len(kv); i += 2 {
			k, _ := kv[i].(string)
			val, _ := kv[i+1].(string)
			fields[k] = val
		}
		healthy := fields["master-link-status"] == "ok"
		for _, flag := range strings.Split(fields["flags"], ",") {
			switch flag {
			case "s_down", "o_down", "disconnected":
				healthy = false
			}
		}
		if healthy && fields["ip"] != "" && fields["port"] != "" {
			known[net.JoinHostPort(fields["ip"], fields["port"])] = true
		}
	}
	return known, nil
}

// Addr returns the sentinel's address, "127.0.0.1:port", for
// FailoverOptions.SentinelAddrs. It does not change across Stop and Start.
func (s *RedisSentinel) Addr() string { return s.addr }

// MasterName returns the name under which the sentinel monitors its primary.
func (s *RedisSentinel) MasterName() string { return s.masterName }

// Dir returns the sentinel's working directory, which holds its
// configuration (sentinel.conf) and log (sentinel.log).
func (s *RedisSentinel) Dir() string { return s.dir }

// MasterAddr asks the sentinel which address currently serves its master
// name (SENTINEL GET-MASTER-ADDR-BY-NAME) and returns it as "host:port".
func (s *RedisSentinel) MasterAddr() (string, error) {
	addr, err := s.masterAddr(5 * time.Second)
	if err != nil {
		return "", fmt.Errorf("localserver: redis sentinel %s: %w", s.addr, err)
	}
	return addr, nil
}

func (s *RedisSentinel) masterAddr(timeout time.Duration) (string, error) {
	c, err := dialRESP(s.addr, time.Now().Add(timeout))
	if err != nil {
		return "", err
	}
	defer c.Close()
	return masterAddrReply(c, s.masterName)
}

// WaitMaster waits until the sentinel reports addr as the master, as it does
// once a failover to addr has completed. The error includes the tail of the
// sentinel's log, which narrates every step of a failover.
func (s *RedisSentinel) WaitMaster(addr string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		got, err := s.masterAddr(cmdTimeout(deadline))
		if err == nil && got == addr {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("sentinel reports master %s", got)
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("localserver: redis sentinel %s: master is not %s after %v: %w%s", s.addr, addr, timeout, err, s.proc.logTail())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Stop stops the sentinel gracefully. Its configuration file, with
// everything it learnt, is kept, so Start brings it back on the same
// address with the same view of the primary and replicas. Stopping a stopped
// sentinel is a no-op.
func (s *RedisSentinel) Stop() error { return s.proc.stop() }

// Start restarts a stopped sentinel on the same address and waits until it
// answers PING and reports an address for its master name. It is a no-op if
// the sentinel is running and fails with [ErrClosed] after Close.
func (s *RedisSentinel) Start() error { return s.proc.start() }

// Close stops the sentinel, releases its port and removes its directory if
// the package created it. It is idempotent: later calls return the first
// call's result.
func (s *RedisSentinel) Close() error {
	s.closeOnce.Do(func() {
		var err error
		if s.proc != nil {
			err = s.proc.close()
		}
		if s.ownDir {
			err = errors.Join(err, os.RemoveAll(s.dir))
		}
		releasePort(s.port, false)
		s.closeErr = err
	})
	return s.closeErr
}
