package main

import (
	"context"
	"errors"
	"fmt"
	redisgroups "github.com/throttlekit/throttlekit/backend/redis/groups"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	memcachedbackend "github.com/throttlekit/throttlekit/backend/memcached"
	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
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

// stores are the two sides of the migration, each wrapped so that a request
// learns which store decided it (see labelled).
type stores struct {
	// old is the backend identifiers leave (memcached, or memory), new the
	// one they move to (sharded Redis, or sharded memory).
	old, new driver.Backend
	// shards is the new side's sharded backend, for its layout.
	shards *shardedbackend.Backend
	// legacy is the memcached backend, for its counters; nil in memory.
	legacy *memcachedbackend.Backend
	// description holds one line per store, for the run's header.
	description []string
	// closers run in reverse order on Close: clients, then servers.
	closers []func() error
}

// Close releases clients and stops the servers the demo started, last
// opened first.
func (s *stores) Close() error {
	var errs []error
	for i := len(s.closers) - 1; i >= 0; i-- {
		errs = append(errs, s.closers[i]())
	}
	s.closers = nil
	return errors.Join(errs...)
}

// openStores builds the old and the new side: in memory with cfg.Embedded;
// otherwise on the servers cfg names, starting (through localserver) those
// it does not name. keyPrefix keeps this run's keys apart from any other's
// on shared servers. On error nothing is left running.
func openStores(ctx context.Context, cfg Config, keyPrefix string) (st *stores, err error) {
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
	if err := checkBinaries(cfg); err != nil {
		return st, err
	}
	memcachedAddr, shardConfig := cfg.MemcachedAddr, cfg.RedisShards
	if memcachedAddr == "" || shardConfig == "" {
		started, err := st.startServers(memcachedAddr == "", shardConfig == "")
		if err != nil {
			return st, err
		}
		memcachedAddr = firstNonEmpty(memcachedAddr, started.memcached)
		shardConfig = firstNonEmpty(shardConfig, started.shards)
	}

	client, err := memcachedbackend.NewClient(cfg.CallTimeout, memcachedAddr)
	if err != nil {
		return st, fmt.Errorf("memcached %q: %w", memcachedAddr, err)
	}
	st.closers = append(st.closers, client.Close)
	oldBackend, err := memcachedbackend.New(client, memcachedbackend.WithPrefix(keyPrefix))
	if err != nil {
		return st, err
	}
	shards, err := redisgroups.Open(shardConfig, redisgroups.WithBackendOptions(redisbackend.WithPrefix(keyPrefix+":")))
	if err != nil {
		return st, fmt.Errorf("redis shards: %w", err)
	}
	st.closers = append(st.closers, shards.Close)
	st.shards, st.legacy = shards, oldBackend
	st.old = labelled{backend: oldBackend, side: rollout.SideOld, label: constLabel("memcached")}
	st.new = labelled{backend: shards, side: rollout.SideNew, label: shardLabel("redis", shards)}
	st.description = append(st.description,
		"old: memcached "+memcachedAddr+" (backend/memcached)",
		"new: redis, sharded "+describeShards(shardConfig)+" (backend/sharded over backend/redis)")

	// Servers given on the command line may be wrong or down: say so now
	// rather than with thousands of degraded responses.
	pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := oldBackend.Ping(pingCtx); err != nil {
		return st, fmt.Errorf("memcached %s does not answer: %w", memcachedAddr, err)
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
func (st *stores) startServers(wantMemcached, wantRedis bool) (startedServers, error) {
	var (
		mu      sync.Mutex
		wg      sync.WaitGroup
		errs    []error
		out     startedServers
		entries [len(shardNames)]string
	)
	keep := func(closeFn func() error) {
		mu.Lock()
		st.closers = append(st.closers, closeFn)
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

// newKeyPrefix returns a key prefix unique to this run, so that a run
// against servers that outlive it never meets a previous run's windows
// (the 1 h limit would otherwise carry counts over).
func newKeyPrefix(now time.Time) string {
	return "mdemo-" + strconv.FormatInt(now.UnixNano(), 36)
}

// served records which store decided a request: the first backend call of a
// request is its serving store's (rollout calls the serving backend first,
// then, in mirror and shadow modes, the other one).
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

// note records that the store (side, label) got a call for ctx's request,
// unless an earlier call was recorded.
func note(ctx context.Context, side rollout.Side, label string) {
	if s, ok := ctx.Value(servedKey{}).(*served); ok && s.first.Load() == nil {
		s.first.CompareAndSwap(nil, &servedStore{side: side, store: label})
	}
}

// labelled is a backend that notes, in the request's context, that it was
// called. It forwards every optional interface, with the throttler's own
// fallbacks where the wrapped backend lacks one.
type labelled struct {
	backend driver.Backend
	side    rollout.Side
	label   func(identifier string) string
}

var (
	_ driver.Backend  = labelled{}
	_ driver.Peeker   = labelled{}
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
	note(ctx, l.side, l.label(req.Identifier))
	return l.backend.Decide(ctx, req)
}

// Peek implements driver.Peeker; without one below, Decide with cost 0.
func (l labelled) Peek(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	note(ctx, l.side, l.label(req.Identifier))
	if pk, ok := l.backend.(driver.Peeker); ok {
		return pk.Peek(ctx, req)
	}
	req.Cost = 0
	return l.backend.Decide(ctx, req)
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
