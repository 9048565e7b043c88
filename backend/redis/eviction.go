package redisbackend

import (
	"context"
	"log/slog"
	"sync"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// This file holds the check of the server's eviction policy.

// MaxmemoryPolicy returns the server's maxmemory-policy (CONFIG GET), or,
// for a Cluster, the first primary's policy that is not noeviction, so
// that one misconfigured node shows. A server that refuses CONFIG (managed
// services often rename it) gives an error.
func (b *Backend) MaxmemoryPolicy(ctx context.Context) (string, error) {
	if err := b.ready(); err != nil {
		return "", err
	}
	read := func(ctx context.Context, c goredis.UniversalClient) (string, error) {
		m, err := c.ConfigGet(ctx, "maxmemory-policy").Result()
		if err != nil {
			return "", err
		}
		p, ok := m["maxmemory-policy"]
		if !ok {
			return "", driver.Errorf("%w: CONFIG GET maxmemory-policy: no value", ErrUnexpectedReply)
		}
		return p, nil
	}
	return await(ctx, b.client, func() (string, error) {
		switch c := b.client.Client.(type) {
		case *goredis.ClusterClient:
			var mu sync.Mutex
			worst := ""
			err := c.ForEachMaster(ctx, func(ctx context.Context, node *goredis.Client) error {
				p, err := read(ctx, node)
				mu.Lock()
				defer mu.Unlock()
				if err == nil && (worst == "" || p != "noeviction") {
					worst = p
				}
				return err
			})
			return worst, err
		case goredis.UniversalClient:
			return read(ctx, c)
		}
		return "", driver.Errorf("%w: cannot read the configuration through a %T", ErrUnexpectedReply, b.client.Client)
	})
}

// evictionWarning is the warning for a maxmemory-policy, or "" for
// noeviction. Every other policy can evict live state: allkeys-* pick any
// key, and volatile-* pick among keys with an expiry, which every key of
// this backend has.
func evictionWarning(policy string) string {
	if policy == "noeviction" {
		return ""
	}
	return "throttlekit: Redis maxmemory-policy is " + policy + ", not noeviction: when memory runs out, " +
		"Redis evicts live windows and re-admits the quota they had spent; with noeviction, decisions fail " +
		"(and follow their failure mode) instead"
}

// warnEviction checks the eviction policy once per Backend, on its first
// successful Ping, and logs a warning when it is not noeviction. An
// unreadable policy is not reported: the check is advice, not a condition.
func (b *Backend) warnEviction(ctx context.Context) {
	b.evictionOnce.Do(func() {
		policy, err := b.MaxmemoryPolicy(ctx)
		if err != nil {
			return
		}
		if w := evictionWarning(policy); w != "" {
			b.log().LogAttrs(ctx, slog.LevelWarn, w, slog.String("maxmemory_policy", policy))
		}
	})
}

// SetLogger implements driver.LoggerSetter: the backend's own lines (the
// eviction-policy warning of the first Ping) go to l, and nowhere for a
// nil l; before any call they go to slog.Default(). throttler.New calls it
// with the logger of throttler.WithLogger. The breakers of WithBreaker get
// it too, when they take one.
func (b *Backend) SetLogger(l *slog.Logger) {
	b.logger.Store(driver.LoggerOrDiscard(l))
	if b.breakers != nil {
		if ls, ok := any(b.breakers).(driver.LoggerSetter); ok {
			ls.SetLogger(l)
		}
	}
}

// log returns where the backend's own lines go.
func (b *Backend) log() *slog.Logger {
	if l := b.logger.Load(); l != nil {
		return l
	}
	return slog.Default()
}
