package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	memcachedbackend "github.com/throttlekit/throttlekit/backend/memcached"
	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	redisgroups "github.com/throttlekit/throttlekit/backend/redis/groups"
	shardedbackend "github.com/throttlekit/throttlekit/backend/sharded"
	"github.com/throttlekit/throttlekit/internal/localserver"
	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// shardNames are the two primary/replica groups of the new side.
var shardNames = [2]string{"a", "b"}

// MissingServersError reports server binaries the demo needs and cannot
// find. Its message says how to get them or how to do without.
type MissingServersError struct {
	// Missing holds one line per binary: its name and why the lookup failed.
	Missing []string
}

// Error explains what is missing and the three ways out.
func (e *MissingServersError) Error() string {
	var b strings.Builder
	b.WriteString("the demo runs real servers, and some binaries are missing:\n")
	for _, m := range e.Missing {
		b.WriteString("  - " + m + "\n")
	}
	b.WriteString("To fix it, either:\n" +
		"  - install them: `make demo` does (scripts/install-servers.sh: apt-get install redis-server redis-tools memcached),\n" +
		"    or point REDIS_SERVER / MEMCACHED at the binaries;\n" +
		"  - run the same demo on in-memory backends: `make demo-embedded` (go run ./cmd/migrate-demo -embedded);\n" +
		"  - use servers that already run: -memcached host:port and -redis-shards \"a=redis://host:port?replica=redis://host:port,b=...\"")
	return b.String()
}

// servers are the servers a run uses: started once, or named by the
// configuration, and shared by every mode the run goes through (each on
// keys of its own).
type servers struct {
	// memcachedAddr and shardConfig locate them; both are empty with
	// -embedded.
	memcachedAddr, shardConfig string
	// closers stop the servers the demo started, in reverse order.
	closers []func() error
	// primaries are the Redis primaries the demo started, by group name,
	// for the stalled group's SIGSTOP bursts.
	primaries map[string]*localserver.Redis
}

// openServers starts, through localserver, the servers cfg does not name,
// and returns where all of them are. With cfg.Embedded it starts nothing.
// On error nothing is left running.
func openServers(cfg Config) (srv *servers, err error) {
	srv = &servers{memcachedAddr: cfg.MemcachedAddr, shardConfig: cfg.RedisShards}
	if cfg.Embedded {
		return srv, nil
	}
	if err := checkBinaries(cfg); err != nil {
		return nil, err
	}
	if srv.memcachedAddr == "" || srv.shardConfig == "" {
		started, err := srv.startServers(srv.memcachedAddr == "", srv.shardConfig == "")
		if err != nil {
			return nil, errors.Join(err, srv.Close())
		}
		srv.memcachedAddr = firstNonEmpty(srv.memcachedAddr, started.memcached)
		srv.shardConfig = firstNonEmpty(srv.shardConfig, started.shards)
	}
	return srv, nil
}

// Close stops the servers the demo started, last started first.
func (s *servers) Close() error {
	var errs []error
	for i := len(s.closers) - 1; i >= 0; i-- {
		errs = append(errs, s.closers[i]())
	}
	s.closers = nil
	return errors.Join(errs...)
}

// stores are the two sides of the migration for one mode, each wrapped so
// that a request learns which store decided it (see labelled).
type stores struct {
	// old is the backend identifiers leave (memcached, or memory), new the
	// one they move to (sharded Redis, or sharded memory).
	old, new driver.Backend
	// shards is the new side's sharded backend, for its layout.
	shards *shardedbackend.Backend
	// memcached is the old side's backend, for its counters, and client
	// its connection, which the hand-written limiter shares; both nil in
	// memory.
	memcached *memcachedbackend.Backend
	client    *memcache.Client
	// description holds one line per store, for the run's header.
	description []string
	// closers run in reverse order on Close.
	closers []func() error
}

// Close releases the stores' clients, last opened first.
func (s *stores) Close() error {
	var errs []error
	for i := len(s.closers) - 1; i >= 0; i-- {
		errs = append(errs, s.closers[i]())
	}
	s.closers = nil
	return errors.Join(errs...)
}

// openStores builds the old and the new side: in memory with cfg.Embedded,
// otherwise on the servers. keyPrefix keeps these stores' keys apart from
// any other's on the same servers. On error nothing is left open.
func (s *servers) openStores(ctx context.Context, cfg Config, keyPrefix string) (st *stores, err error) {
	st = &stores{}
	defer func() {
		if err != nil {
			err = errors.Join(err, st.Close())
			st = nil
		}
	}()
	if cfg.Embedded {
		return st, st.openEmbedded()
	}
	client, err := memcachedbackend.NewClient(cfg.CallTimeout, s.memcachedAddr)
	if err != nil {
		return st, fmt.Errorf("memcached %q: %w", s.memcachedAddr, err)
	}
	st.closers = append(st.closers, client.Close)
	oldBackend, err := memcachedbackend.New(client, memcachedbackend.WithPrefix(keyPrefix))
	if err != nil {
		return st, err
	}
	shards, err := redisgroups.Open(s.shardConfig, redisgroups.WithBackendOptions(redisbackend.WithPrefix(keyPrefix+":")))
	if err != nil {
		return st, fmt.Errorf("redis shards: %w", err)
	}
	st.closers = append(st.closers, shards.Close)
	st.shards, st.memcached, st.client = shards, oldBackend, client
	st.old = labelled{backend: oldBackend, side: rollout.SideOld, label: constLabel("memcached")}
	st.new = labelled{backend: shards, side: rollout.SideNew, label: shardLabel("redis", shards)}
	st.description = append(st.description,
		"old: memcached "+s.memcachedAddr+" (backend/memcached)",
		"new: redis, sharded "+describeShards(s.shardConfig)+" (backend/sharded over backend/redis)")

	// Servers given on the command line may be wrong or down: say so now
	// rather than with thousands of degraded responses.
	pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := oldBackend.Ping(pingCtx); err != nil {
		return st, fmt.Errorf("memcached %s does not answer: %w", s.memcachedAddr, err)
	}
	if err := shards.Ping(pingCtx); err != nil {
		return st, fmt.Errorf("redis shards do not all answer: %w", err)
	}
	return st, nil
}

// openEmbedded builds both sides in memory: one memory backend, and a
// sharded backend over two memory shards (sharded's generic core takes any
// backend as a shard).
func (st *stores) openEmbedded() error {
	var layout []shardedbackend.Shard
	for _, name := range shardNames {
		layout = append(layout, shardedbackend.Shard{Name: name, Primary: memorybackend.New()})
	}
	shards, err := shardedbackend.New(layout)
	if err != nil {
		return err
	}
	st.shards = shards
	st.old = labelled{backend: memorybackend.New(), side: rollout.SideOld, label: constLabel("memory")}
	st.new = labelled{backend: shards, side: rollout.SideNew, label: shardLabel("memory", shards)}
	st.description = append(st.description,
		"old: in-memory backend (backend/memory), standing in for memcached",
		"new: sharded over two in-memory shards a, b (backend/sharded over backend/memory), standing in for Redis")
	return nil
}

// checkBinaries reports the server binaries the run must start and cannot
// find.
func checkBinaries(cfg Config) error {
	var need []string
	if cfg.MemcachedAddr == "" {
		need = append(need, localserver.MemcachedBinary)
	}
	if cfg.RedisShards == "" {
		need = append(need, localserver.RedisServerBinary)
	}
	var missing []string
	for _, bin := range need {
		if _, err := localserver.LookPath(bin); err != nil {
			missing = append(missing, fmt.Sprintf("%s: %v", bin, err))
		}
	}
	if len(missing) > 0 {
		return &MissingServersError{Missing: missing}
	}
	return nil
}

// startedServers are the addresses of the servers the demo started.
type startedServers struct {
	memcached string
	shards    string // in redisgroups.Parse's grammar
}

// startServers starts, on free loopback ports, a memcached and/or two Redis
// groups of one primary and one replica, all at once. Every server started
// is registered for Close, even when another fails to start.
func (s *servers) startServers(wantMemcached, wantRedis bool) (startedServers, error) {
	var (
		mu      sync.Mutex
		wg      sync.WaitGroup
		errs    []error
		out     startedServers
		entries [len(shardNames)]string
	)
	keep := func(closeFn func() error) {
		mu.Lock()
		s.closers = append(s.closers, closeFn)
		mu.Unlock()
	}
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	if wantMemcached {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m, err := localserver.StartMemcached(localserver.MemcachedOptions{MemoryMB: 64})
			if err != nil {
				fail(fmt.Errorf("starting memcached: %w", err))
				return
			}
			keep(m.Close)
			out.memcached = m.Addr()
		}()
	}
	if wantRedis {
		for i, name := range shardNames {
			wg.Add(1)
			go func() {
				defer wg.Done()
				primary, err := localserver.StartRedis(localserver.RedisOptions{})
				if err != nil {
					fail(fmt.Errorf("starting redis primary %s: %w", name, err))
					return
				}
				keep(primary.Close)
				mu.Lock()
				if s.primaries == nil {
					s.primaries = map[string]*localserver.Redis{}
				}
				s.primaries[name] = primary
				mu.Unlock()
				replica, err := localserver.StartRedisReplica(primary, localserver.RedisOptions{})
				if err != nil {
					fail(fmt.Errorf("starting redis replica %s: %w", name, err))
					return
				}
				keep(replica.Close)
				entries[i] = fmt.Sprintf("%s=redis://%s?replica=redis://%s", name, primary.Addr(), replica.Addr())
			}()
		}
	}
	wg.Wait()
	if len(errs) > 0 {
		return startedServers{}, errors.Join(errs...)
	}
	if wantRedis {
		out.shards = strings.Join(entries[:], ",")
	}
	return out, nil
}

// describeShards shows a shard configuration without passwords: each shard
// name with its primary and replica addresses.
func describeShards(config string) string {
	layout, err := redisgroups.Parse(config)
	if err != nil {
		return "(unreadable configuration)"
	}
	var parts []string
	for _, s := range layout {
		part := s.Name + "=" + s.Primary.Addr
		for _, r := range s.Replicas {
			part += " (replica " + r.Addr + ")"
		}
		parts = append(parts, part)
	}
	return strings.Join(parts, ", ")
}

// newKeyPrefix returns a key prefix unique to this run and mode, so that a
// mode never meets the windows of another, nor a run against servers that
// outlive it a previous run's (the 1 h limit would otherwise carry counts
// over).
func newKeyPrefix(now time.Time, mode rollout.Mode) string {
	return "mdemo-" + strconv.FormatInt(now.UnixNano(), 36) + "-" + mode.String()
}

// served records which store decided a request: the first backend call of
// a request that spends units (a Decide or a Seed of cost above 0) is its
// serving store's. The rollout calls the serving backend first, then, in
// mirror and shadow modes, the other one; in split mode it may read the
// other one first, with a Peek, to seed the serving one.
type served struct {
	first atomic.Pointer[servedStore]
}

type servedStore struct {
	side  rollout.Side
	store string
}

type servedKey struct{}

// withServed returns ctx carrying a fresh served record.
func withServed(ctx context.Context) (context.Context, *served) {
	s := &served{}
	return context.WithValue(ctx, servedKey{}, s), s
}

// note records that the store (side, label) decided cost units for ctx's
// request, unless cost is 0 or an earlier call was recorded.
func note(ctx context.Context, cost int64, side rollout.Side, label string) {
	if cost <= 0 {
		return
	}
	if s, ok := ctx.Value(servedKey{}).(*served); ok && s.first.Load() == nil {
		s.first.CompareAndSwap(nil, &servedStore{side: side, store: label})
	}
}

// labelled is a backend that notes, in the request's context, that it
// decided. It forwards every optional interface, with the throttler's own
// fallbacks where the wrapped backend lacks one.
type labelled struct {
	backend driver.Backend
	side    rollout.Side
	label   func(identifier string) string
}

var (
	_ driver.Backend  = labelled{}
	_ driver.Peeker   = labelled{}
	_ driver.Seeder   = labelled{}
	_ driver.Refunder = labelled{}
	_ driver.Resetter = labelled{}
	_ driver.Pinger   = labelled{}
)

func constLabel(name string) func(string) string { return func(string) string { return name } }

func shardLabel(kind string, b *shardedbackend.Backend) func(string) string {
	return func(id string) string { return kind + "/" + b.ShardFor(id) }
}

// Decide implements driver.Backend.
func (l labelled) Decide(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	note(ctx, req.Cost, l.side, l.label(req.Identifier))
	return l.backend.Decide(ctx, req)
}

// Peek implements driver.Peeker; without one below, Decide with cost 0.
func (l labelled) Peek(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	return driver.PeekWith(ctx, l.backend, req)
}

// Seed implements driver.Seeder; a backend without one gives an error
// wrapping errors.ErrUnsupported, which the rollout takes for "cannot take
// states" (split mode then decides unseeded, mirror mode replays).
func (l labelled) Seed(ctx context.Context, req driver.Request, given []driver.State) (driver.Outcome, error) {
	sd, ok := l.backend.(driver.Seeder)
	if !ok {
		return driver.Outcome{}, fmt.Errorf("%w: %s cannot take states", errors.ErrUnsupported, l.label(req.Identifier))
	}
	note(ctx, req.Cost, l.side, l.label(req.Identifier))
	return sd.Seed(ctx, req, given)
}

// Refund implements driver.Refunder.
func (l labelled) Refund(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	rf, ok := l.backend.(driver.Refunder)
	if !ok {
		return driver.Outcome{}, fmt.Errorf("%w: refund", errors.ErrUnsupported)
	}
	return rf.Refund(ctx, req)
}

// Reset implements driver.Resetter.
func (l labelled) Reset(ctx context.Context, p *driver.Policy, identifier string) error {
	rs, ok := l.backend.(driver.Resetter)
	if !ok {
		return fmt.Errorf("%w: reset", errors.ErrUnsupported)
	}
	return rs.Reset(ctx, p, identifier)
}

// Ping implements driver.Pinger; a backend without one is reachable.
func (l labelled) Ping(ctx context.Context) error {
	if pg, ok := l.backend.(driver.Pinger); ok {
		return pg.Ping(ctx)
	}
	return nil
}
