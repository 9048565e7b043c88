package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/throttled/throttled/v2"
	"github.com/throttled/throttled/v2/store/goredisstore.v9"
	"github.com/throttled/throttled/v2/store/memstore"
	"github.com/ulule/limiter/v3"
	ulredis "github.com/ulule/limiter/v3/drivers/store/redis"
	"golang.org/x/time/rate"

	memcachedbackend "github.com/throttlekit/throttlekit/backend/memcached"
	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	redisgroups "github.com/throttlekit/throttlekit/backend/redis/groups"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// Paths, in the order of the table.
const (
	pathFixed     = "Redis, one fixed-window limit"
	pathGCRA      = "Redis, GCRA"
	pathThree     = "Redis, 3 limits (10/s, 600/min, 5000/h)"
	pathHot       = "Redis, one identifier far over (10/min)"
	pathSerial    = "Redis, one limit, 1 goroutine"
	pathCluster   = "Redis Cluster (3 primaries), one limit"
	pathSharded   = "sharded, 3 Redis groups, one limit"
	pathMemory1   = "in process, 1 goroutine"
	pathMemory64  = "in process, 64 goroutines"
	pathMemory4   = "in process, 4 limits, 1 goroutine"
	pathMemcached = "memcached, one limit"

	specOne   = "1000/min"
	specThree = "10/s, 600/min, 5000/h"
	specFour  = "10/s, 600/min, 5000/h, 100000/d"

	defaultPerMin  = 1000
	hotLimitPerMin = 10
)

// Implementations of throttlekit on Redis: the default configuration
// (redisbackend.New with no options at all) and one row per option.
const (
	implDefault  = "throttlekit, default (no options)"
	implNoBatch  = "throttlekit, WithoutBatching()"
	implBatch    = "throttlekit, WithBatching(0)"
	implBreaker  = "throttlekit, WithBreaker()"
	implPrefix   = `throttlekit, WithPrefix("tk:")`
	implGrace    = "throttlekit, WithExpiryGrace(time.Second)"
	implDeny     = "throttlekit, default + throttler.WithDenyCache"
	implMemory   = "throttlekit (memory)"
	implXRate    = "x/time/rate (a map of limiters)"
	implUlule    = "ulule/limiter"
	implUlule3   = "ulule/limiter (3 limiters)"
	implRedisRat = "go-redis/redis_rate"
)

// cells lists every cell of the comparison.
func cells(e *env) []cell {
	std := []string{e.standalone}
	var out []cell
	add := func(c cell) { out = append(out, c) }

	// tk is throttlekit over redisbackend.New(client, opts...): no option
	// but opts, since the servers are flushed before each cell.
	tk := func(path, impl, spec string, client func() (redisbackend.Client, func()), opts []redisbackend.Option, thOpts ...throttler.Option) cell {
		return cell{path: path, impl: impl, setup: func() (decider, func(), error) {
			c, closeClient := client()
			b, err := redisbackend.New(c, opts...)
			if err != nil {
				closeClient()
				return nil, nil, err
			}
			d, err := throttlekit(b, spec, thOpts...)
			return d, closeClient, err
		}}
	}
	standalone := func() (redisbackend.Client, func()) {
		c := newRedisClient(e.standalone)
		return c, func() { _ = c.Close() }
	}
	noBatch := []redisbackend.Option{redisbackend.WithoutBatching()}
	opt := func(o redisbackend.Option) []redisbackend.Option { return []redisbackend.Option{o} }

	for _, c := range []cell{
		tk(pathFixed, implDefault, specOne, standalone, nil),
		tk(pathFixed, implNoBatch, specOne, standalone, noBatch),
		tk(pathFixed, implBatch, specOne, standalone, opt(redisbackend.WithBatching(0))),
		tk(pathFixed, implBreaker, specOne, standalone, opt(redisbackend.WithBreaker())),
		tk(pathFixed, implPrefix, specOne, standalone, opt(redisbackend.WithPrefix("tk:"))),
		tk(pathFixed, implGrace, specOne, standalone, opt(redisbackend.WithExpiryGrace(time.Second))),
		ulule(e.standalone, pathFixed, defaultPerMin),
		tk(pathGCRA, implDefault, "1000/min gcra", standalone, nil),
		tk(pathGCRA, implNoBatch, "1000/min gcra", standalone, noBatch),
		redisRate(e.standalone, pathGCRA, defaultPerMin),
		throttledRedis(e.standalone, pathGCRA, defaultPerMin),
		tk(pathThree, implDefault, specThree, standalone, nil),
		tk(pathThree, implNoBatch, specThree, standalone, noBatch),
		ululeThree(e.standalone),
		tk(pathHot, implDefault, "10/min", standalone, nil),
		tk(pathHot, implDeny, "10/min", standalone, nil, throttler.WithDenyCache(10_000, time.Second)),
		ulule(e.standalone, pathHot, hotLimitPerMin),
		redisRate(e.standalone, pathHot, hotLimitPerMin),
		throttledRedis(e.standalone, pathHot, hotLimitPerMin),
		tk(pathSerial, implDefault, specOne, standalone, nil),
		tk(pathSerial, implNoBatch, specOne, standalone, noBatch),
		ulule(e.standalone, pathSerial, defaultPerMin),
		redisRate(e.standalone, pathSerial, defaultPerMin),
	} {
		if c.servers == nil {
			c.servers = std
		}
		if strings.HasPrefix(c.path, pathHot) {
			c.oneID = true
		}
		if c.path == pathSerial {
			c.goroutines = 1
		}
		add(c)
	}

	cluster := func() (redisbackend.Client, func()) {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: e.cluster, PoolSize: 64, ContextTimeoutEnabled: true})
		return c, func() { _ = c.Close() }
	}
	for _, c := range []cell{
		tk(pathCluster, implDefault, specOne, cluster, nil),
		tk(pathCluster, implNoBatch, specOne, cluster, noBatch),
		// The peers on the same Cluster, through the same kind of client.
		{path: pathCluster, impl: implUlule, peer: true, setup: func() (decider, func(), error) {
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: e.cluster, PoolSize: 64, ContextTimeoutEnabled: true})
			d, err := ululeDecider(c, limiter.Rate{Period: time.Minute, Limit: defaultPerMin})
			return d, func() { _ = c.Close() }, err
		}},
		{path: pathCluster, impl: implRedisRat, peer: true, setup: func() (decider, func(), error) {
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: e.cluster, PoolSize: 64, ContextTimeoutEnabled: true})
			return redisRateDecider(c, defaultPerMin), func() { _ = c.Close() }, nil
		}},
	} {
		c.servers = e.cluster
		add(c)
	}
	for _, impl := range []string{implDefault, implNoBatch} {
		add(cell{path: pathSharded, impl: impl, servers: e.groups, setup: func() (decider, func(), error) {
			var parts []string
			for i, addr := range e.groups {
				parts = append(parts, fmt.Sprintf("g%d=redis://%s?pool_size=64", i, addr))
			}
			var opts []redisgroups.Option
			if impl == implNoBatch {
				opts = append(opts, redisgroups.WithBackendOptions(redisbackend.WithoutBatching()))
			}
			b, err := redisgroups.Open(strings.Join(parts, ","), opts...)
			if err != nil {
				return nil, nil, err
			}
			d, err := throttlekit(b, specOne)
			return d, func() { _ = b.Close() }, err
		}})
	}

	for _, g := range []int{1, 64} {
		path := pathMemory1
		if g == 64 {
			path = pathMemory64
		}
		add(cell{path: path, impl: implMemory, goroutines: g, inProcess: true, setup: func() (decider, func(), error) {
			d, err := throttlekit(memorybackend.New(), specOne)
			return d, func() {}, err
		}})
		add(cell{path: path, impl: implXRate, peer: true, goroutines: g, inProcess: true, setup: xrate})
		add(cell{path: path, impl: "throttled (memstore)", peer: true, goroutines: g, inProcess: true, setup: throttledMemory})
	}
	add(cell{path: pathMemory4, impl: implMemory, goroutines: 1, inProcess: true, setup: func() (decider, func(), error) {
		d, err := throttlekit(memorybackend.New(), specFour)
		return d, func() {}, err
	}})
	add(cell{path: pathMemcached, impl: "throttlekit", setup: func() (decider, func(), error) {
		client, err := memcachedbackend.NewClient(time.Second, e.memcached)
		if err != nil {
			return nil, nil, err
		}
		client.MaxIdleConns = 64
		b, err := memcachedbackend.New(client, memcachedbackend.WithPrefix("tk:"+uniq()))
		if err != nil {
			return nil, nil, err
		}
		// The client's Timeout may not exceed the call timeout
		// (memcachedbackend.Backend.CheckConfig).
		d, err := throttlekit(b, specOne, throttler.WithCallTimeout(time.Second))
		return d, func() { _ = client.Close() }, err
	}})
	return out
}

var uniqMu sync.Mutex
var uniqN int

// uniq returns a fresh key prefix part, so that no cell sees another's
// state.
func uniq() string {
	uniqMu.Lock()
	defer uniqMu.Unlock()
	uniqN++
	return fmt.Sprintf("%d-%d:", time.Now().Unix(), uniqN)
}

// throttlekit is a decider over a throttlekit backend with a policy of spec.
func throttlekit(b driver.Backend, spec string, opts ...throttler.Option) (decider, error) {
	th, err := throttler.New(b, append([]throttler.Option{throttler.WithLogger(nil)}, opts...)...)
	if err != nil {
		return nil, err
	}
	p, err := throttler.ParsePolicy("bench", spec)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, id string) (bool, error) {
		r, err := th.Allow(ctx, p, id)
		if err == nil && r.Degraded {
			err = r.Err
		}
		return r.Allowed, err
	}, nil
}

// ulule is github.com/ulule/limiter with its Redis store: one fixed window.
func ulule(addr, path string, perMin int64) cell {
	return cell{path: path, impl: implUlule, peer: true, setup: func() (decider, func(), error) {
		c := newRedisClient(addr)
		d, err := ululeDecider(c, limiter.Rate{Period: time.Minute, Limit: perMin})
		return d, func() { _ = c.Close() }, err
	}}
}

// ululeRates are the three limits of pathThree, as ulule rates.
var ululeRates = []limiter.Rate{
	{Period: time.Second, Limit: 10},
	{Period: time.Minute, Limit: 600},
	{Period: time.Hour, Limit: 5000},
}

// ululeThree is what a ulule user writes for three limits: three limiters,
// each over a store of its own prefix, asked in turn.
func ululeThree(addr string) cell {
	return cell{path: pathThree, impl: implUlule3, peer: true, servers: []string{addr}, setup: func() (decider, func(), error) {
		c := newRedisClient(addr)
		d, err := ululeDecider(c, ululeRates...)
		return d, func() { _ = c.Close() }, err
	}}
}

// ululeDecider asks one ulule limiter per rate, each with a store of its own
// prefix, and allows when none is reached.
func ululeDecider(c ulredis.Client, rates ...limiter.Rate) (decider, error) {
	var ls []*limiter.Limiter
	for i, r := range rates {
		store, err := ulredis.NewStoreWithOptions(c, limiter.StoreOptions{Prefix: fmt.Sprintf("ulule%d", i)})
		if err != nil {
			return nil, err
		}
		ls = append(ls, limiter.New(store, r))
	}
	return func(ctx context.Context, id string) (bool, error) {
		allowed := true
		for _, l := range ls {
			r, err := l.Get(ctx, id)
			if err != nil {
				return false, err
			}
			allowed = allowed && !r.Reached
		}
		return allowed, nil
	}, nil
}

// redisRate is github.com/go-redis/redis_rate: GCRA in a Lua script.
func redisRate(addr, path string, perMin int) cell {
	return cell{path: path, impl: implRedisRat, peer: true, setup: func() (decider, func(), error) {
		c := newRedisClient(addr)
		return redisRateDecider(c, perMin), func() { _ = c.Close() }, nil
	}}
}

// redisRateDecider is a redis_rate limiter over c at perMin a minute.
func redisRateDecider(c redis.UniversalClient, perMin int) decider {
	l := redis_rate.NewLimiter(c)
	lim := redis_rate.PerMinute(perMin)
	return func(ctx context.Context, id string) (bool, error) {
		r, err := l.Allow(ctx, id, lim)
		if err != nil {
			return false, err
		}
		return r.Allowed > 0, nil
	}
}

// throttledRedis is github.com/throttled/throttled's GCRA over its go-redis
// v9 store.
func throttledRedis(addr, path string, perMin int) cell {
	return cell{path: path, impl: "throttled", peer: true, setup: func() (decider, func(), error) {
		c := newRedisClient(addr)
		store, err := goredisstore.NewCtx(c, "thr:")
		if err != nil {
			return nil, nil, err
		}
		d, err := throttledDecider(store, perMin)
		return d, func() { _ = c.Close() }, err
	}}
}

func throttledDecider(store throttled.GCRAStoreCtx, perMin int) (decider, error) {
	rl, err := throttled.NewGCRARateLimiterCtx(store, throttled.RateQuota{MaxRate: throttled.PerMin(perMin), MaxBurst: perMin - 1})
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, id string) (bool, error) {
		limited, _, err := rl.RateLimitCtx(ctx, id, 1)
		return !limited, err
	}, nil
}

// throttledMemory is throttled's GCRA over its in-process store.
func throttledMemory() (decider, func(), error) {
	store, err := memstore.NewCtx(65536)
	if err != nil {
		return nil, nil, err
	}
	d, err := throttledDecider(store, defaultPerMin)
	return d, func() {}, err
}

// xrate is golang.org/x/time/rate with a limiter per identifier in a map
// behind a mutex: what a team writes by hand.
func xrate() (decider, func(), error) {
	var mu sync.Mutex
	limiters := map[string]*rate.Limiter{}
	every := rate.Every(time.Minute / defaultPerMin)
	return func(ctx context.Context, id string) (bool, error) {
		mu.Lock()
		l, ok := limiters[id]
		if !ok {
			l = rate.NewLimiter(every, defaultPerMin)
			limiters[id] = l
		}
		mu.Unlock()
		return l.Allow(), nil
	}, func() {}, nil
}
