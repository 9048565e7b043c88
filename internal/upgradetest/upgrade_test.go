package upgradetest

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"

	memcachedbackend "github.com/throttlekit/throttlekit/backend/memcached"
	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	shardedbackend "github.com/throttlekit/throttlekit/backend/sharded"
	"github.com/throttlekit/throttlekit/internal/localserver"
	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// The probe's policy, as the issue measured it: one unnamed limit, default
// options.
const (
	policyName   = "api"
	policyLimits = "20/min"
	quota        = 20
	identifiers  = 100
	// every is the interval between two decisions of one identifier in
	// one process: two processes spend a quota of 20 in about 4 s.
	every = 400 * time.Millisecond
	// spread: identifier i is decided every (1 + i mod spread) × every.
	spread = 5
)

// The timeline of a scenario. Every window opens in the warm-up and stays
// open to the end (about 20 s of a 60 s window). Real processes on a real
// clock: the sleeps are the deploy's durations, not synchronisation.
const (
	warmUp  = 3 * time.Second  // the earlier release alone
	overlap = 12 * time.Second // both versions serving the same identifiers
	handOff = 3 * time.Second  // the deploy after the upgrade beside the one before it
	alone   = 3 * time.Second  // the code under test alone (plus a second)
)

// A release that wrote state, and the layouts it wrote.
type release struct {
	commit string
	// keyLayout is driver.KeyLayout in that release; redisLayout is
	// redisbackend.Layout.
	keyLayout, redisLayout int
}

var releases = []release{
	{"7016ead", 1, 1},
	{"abf6070", 2, 2},
	{"e26a4c4", 2, 3},
}

// store is one kind of store, started for one subtest.
type store struct {
	probeStore, probeAddrs string
	// redis opens the store as this tree does, with each Redis server's
	// backend passed through view (nil: the backend itself).
	redis func(t *testing.T, view func(*redisbackend.Backend) driver.Backend) driver.Backend
	// memcached is the memcached backend (nil for Redis).
	memcached *memcachedbackend.Backend
	// grouped is true for Redis groups, whose backend is a sharded one
	// over a backend per group.
	grouped bool
}

var storeKinds = []struct {
	name  string
	start func(t *testing.T) store
}{
	{"redis", startRedis},
	{"groups", startGroups},
	{"cluster", startCluster},
	{"memcached", startMemcached},
}

func startRedis(t *testing.T) store {
	srv := localserver.RedisT(t, localserver.RedisOptions{})
	return store{probeStore: "redis", probeAddrs: srv.Addr(),
		redis: func(t *testing.T, view func(*redisbackend.Backend) driver.Backend) driver.Backend {
			rdb := goredis.NewClient(&goredis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = rdb.Close() })
			return through(t, rdb, view)
		}}
}

func startCluster(t *testing.T) store {
	c := localserver.RedisClusterT(t, 3, 0)
	return store{probeStore: "cluster", probeAddrs: strings.Join(c.Addrs(), ","),
		redis: func(t *testing.T, view func(*redisbackend.Backend) driver.Backend) driver.Backend {
			rdb := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: c.Addrs(), ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = rdb.Close() })
			return through(t, rdb, view)
		}}
}

// startGroups starts two groups of a primary and a replica each. The
// earlier release opens them with redisgroups.Open; this tree builds the
// same shards by name, so that both route every identifier to the same
// group, with each primary's backend passed through the view (and no
// replica then: a view's peek goes to the primary).
func startGroups(t *testing.T) store {
	names := []string{"a", "b"}
	var primaries, replicas []*localserver.Redis
	var config []string
	for _, name := range names {
		p := localserver.RedisT(t, localserver.RedisOptions{})
		r := localserver.RedisReplicaT(t, p, localserver.RedisOptions{})
		primaries, replicas = append(primaries, p), append(replicas, r)
		config = append(config, fmt.Sprintf("%s=redis://%s?replica=redis://%s", name, p.Addr(), r.Addr()))
	}
	return store{probeStore: "groups", probeAddrs: strings.Join(config, ","), grouped: true,
		redis: func(t *testing.T, view func(*redisbackend.Backend) driver.Backend) driver.Backend {
			shards := make([]shardedbackend.Shard, len(names))
			for i, name := range names {
				primary := goredis.NewClient(&goredis.Options{Addr: primaries[i].Addr(), ContextTimeoutEnabled: true})
				t.Cleanup(func() { _ = primary.Close() })
				shards[i] = shardedbackend.Shard{Name: name, Primary: through(t, primary, view)}
				if view == nil {
					replica := goredis.NewClient(&goredis.Options{Addr: replicas[i].Addr(), ContextTimeoutEnabled: true})
					t.Cleanup(func() { _ = replica.Close() })
					rb, err := redisbackend.New(replica)
					if err != nil {
						t.Fatal(err)
					}
					shards[i].Replicas = []driver.Peeker{rb}
				}
			}
			b, err := shardedbackend.New(shards)
			if err != nil {
				t.Fatal(err)
			}
			return b
		}}
}

func startMemcached(t *testing.T) store {
	srv := localserver.MemcachedT(t, localserver.MemcachedOptions{})
	mc, err := memcachedbackend.NewClient(time.Second, srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	b, err := memcachedbackend.New(mc)
	if err != nil {
		t.Fatal(err)
	}
	return store{probeStore: "memcached", probeAddrs: srv.Addr(), memcached: b}
}

func through(t *testing.T, rdb redisbackend.Client, view func(*redisbackend.Backend) driver.Backend) driver.Backend {
	b, err := redisbackend.New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	if view == nil {
		return b
	}
	return view(b)
}

// recipe is what docs/MIGRATION.md ("Upgrading throttlekit") says to
// deploy, for one release and store.
type recipe struct {
	// beside is the backend of the deploy that may run while processes
	// of the earlier release still decide.
	beside func(t *testing.T) driver.Backend
	// after is the backend of the next deploy, once no process of the
	// earlier release runs: it may run beside processes of beside. It is
	// also the recipe when every old process stops before the first new
	// one starts.
	after func(t *testing.T) driver.Backend
	// stopStart, when set, replaces after when every old process stops
	// before the first new one starts.
	stopStart func(t *testing.T) driver.Backend
}

func recipeFor(rel release, st store) recipe {
	if st.memcached != nil {
		b := st.memcached
		if rel.keyLayout == 2 {
			plain := func(*testing.T) driver.Backend { return b }
			return recipe{beside: plain, after: plain}
		}
		// Key layout 1: decide in the layout-1 items, where the old
		// release counts, and mirror into layout 2 (flag at 0 %); once no
		// old process runs, decide in layout 2 and mirror into layout 1
		// (flag at 100 %), which the processes at 0 % still read.
		mirror := func(percent int) func(t *testing.T) driver.Backend {
			return func(t *testing.T) driver.Backend {
				flag, err := rollout.NewStaticSource(percent)
				if err != nil {
					t.Fatal(err)
				}
				return mustRollout(t)(rollout.New(rollout.KeyLayoutV1(b), b, flag, rollout.WithMode(rollout.MirrorMode)))
			}
		}
		return recipe{beside: mirror(0), after: mirror(100), stopStart: func(t *testing.T) driver.Backend {
			return mustRollout(t)(rollout.UpgradeKeys(b))
		}}
	}
	if rel.redisLayout == 3 {
		plain := func(t *testing.T) driver.Backend { return st.redis(t, nil) }
		return recipe{beside: plain, after: plain}
	}
	beside := func(t *testing.T) driver.Backend {
		return st.redis(t, func(b *redisbackend.Backend) driver.Backend {
			v, err := b.Layout2Beside(rel.keyLayout)
			if err != nil {
				t.Fatal(err)
			}
			return v
		})
	}
	upgrade := func(t *testing.T) driver.Backend {
		from := st.redis(t, func(b *redisbackend.Backend) driver.Backend { return b.Layout2() })
		if rel.keyLayout == 1 {
			from = rollout.KeyLayoutV1(from)
		}
		return mustRollout(t)(rollout.Upgrade(from, st.redis(t, nil)))
	}
	rc := recipe{beside: beside, after: upgrade}
	if rel.keyLayout == 1 && !st.grouped {
		// docs/MIGRATION.md's shorthand for one Redis backend: UpgradeKeys
		// finds the layout-1 strings through the backend's Layout2.
		rc.stopStart = func(t *testing.T) driver.Backend {
			return mustRollout(t)(rollout.UpgradeKeys(st.redis(t, nil)))
		}
	}
	return rc
}

func mustRollout(t *testing.T) func(*rollout.Backend, error) driver.Backend {
	return func(b *rollout.Backend, err error) driver.Backend {
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
}

// TestUpgradeFromEarlierReleases upgrades, for each earlier release that
// wrote state and each store, a deployment of that release deciding 100
// identifiers to the code of this tree, two ways at once on disjoint
// identifiers:
//
//   - stop then start: the old release alone for 3 s, then it stops and
//     the deploy for that case (recipe.stopStart, else recipe.after)
//     serves alone for 20 s;
//   - overlap: the old release alone for 3 s, then the beside deploy
//     serves the same identifiers with it for 12 s; the old release stops,
//     the after deploy serves beside the beside deploy for 3 s, then alone
//     for 4 s.
//
// Identifier i is decided every (1 + i mod 5) × 400 ms by each process, so
// that windows run out of quota in every phase, and every window stays open
// to the end. Each case requires, from the results every process returned:
// 100 windows, no ResetAt change, no grant over quota, no error.
func TestUpgradeFromEarlierReleases(t *testing.T) {
	localserver.SkipIfShort(t)
	for _, rel := range releases {
		for _, kind := range storeKinds {
			t.Run(rel.commit+"/"+kind.name, func(t *testing.T) {
				t.Parallel()
				probe := releaseProbe(t, rel.commit)
				st := kind.start(t)
				rc := recipeFor(rel, st)
				stopStartNext := rc.after
				if rc.stopStart != nil {
					stopStartNext = rc.stopStart
				}
				cases := []*scenario{
					{name: "stop then start", ids: "s", procs: []string{"old", "new1"}, phases: []phase{
						{wait: warmUp},
						{wait: overlap + handOff + alone + time.Second, stopOld: true, start: stopStartNext(t)},
					}},
					{name: "overlap", ids: "o", procs: []string{"old", "new1", "new2"}, phases: []phase{
						{wait: warmUp},
						{wait: overlap, start: rc.beside(t)},
						{wait: handOff, stopOld: true, start: rc.after(t)},
						{wait: alone + time.Second, stopFirst: true},
					}},
				}
				var wg sync.WaitGroup
				for _, c := range cases {
					wg.Add(1)
					go func() {
						defer wg.Done()
						c.run(probe, st)
					}()
				}
				wg.Wait()
				for _, c := range cases {
					t.Logf("%s %s, %s: %v", rel.commit, kind.name, c.name, c.verdict)
					if c.err != nil {
						t.Errorf("%s: %v", c.name, c.err)
					}
					v := c.verdict
					for _, proc := range c.procs {
						// At the slowest, about 100 decisions a second for
						// at least 3 s: far fewer means a process did not
						// serve its phase, and the case proves nothing.
						if v.ByProc[proc] < 200 {
							t.Errorf("%s: %s made %d decisions, want at least 200", c.name, proc, v.ByProc[proc])
						}
					}
					if v.ResetChanges != 0 || v.OverQuota != 0 || v.Errors != 0 || v.Windows != identifiers {
						t.Errorf("%s: %v; want %d windows and nothing else; e.g. %s", c.name, v, identifiers,
							strings.Join(v.Examples, "; "))
					}
				}
			})
		}
	}
}

// A scenario is a timeline of deploys on its own identifiers.
type scenario struct {
	name, ids string
	// procs names every process that must have decided.
	procs   []string
	phases  []phase
	verdict verdict
	err     error
}

// A phase starts a deploy of the code under test and stops processes, then
// lets them serve for wait.
type phase struct {
	wait time.Duration
	// stopOld stops the earlier release before start.
	stopOld bool
	// start, when set, starts a process of the code under test over it.
	start driver.Backend
	// stopFirst stops the first process of the code under test.
	stopFirst bool
}

// run plays the timeline; it starts the earlier release first.
func (s *scenario) run(probe string, st store) {
	old, err := startOld(probe, probeArgs{store: st.probeStore, addrs: st.probeAddrs, ids: s.ids,
		n: identifiers, spread: spread, every: every})
	if err != nil {
		s.err = err
		return
	}
	var recs []record
	var news []*newProcess
	stopAll := func() {
		if old != nil {
			r, err := old.stop()
			recs = append(recs, r...)
			s.err = errors.Join(s.err, err)
			old = nil
		}
		for _, p := range news {
			if p != nil {
				recs = append(recs, p.stop()...)
			}
		}
	}
	defer func() {
		stopAll()
		s.verdict = judge(recs, quota)
	}()
	for i, ph := range s.phases {
		if ph.stopOld {
			r, err := old.stop()
			recs, old = append(recs, r...), nil
			if err != nil {
				s.err = err
				return
			}
		}
		if ph.stopFirst {
			recs = append(recs, news[0].stop()...)
			news[0] = nil
		}
		if ph.start != nil {
			p, err := startNew(fmt.Sprintf("new%d", i), ph.start, s.ids, identifiers, spread, every)
			if err != nil {
				s.err = err
				return
			}
			news = append(news, p)
		}
		time.Sleep(ph.wait)
	}
}
