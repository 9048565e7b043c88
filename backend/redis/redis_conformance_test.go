package redisbackend_test

import (
	"context"
	"sync"
	"testing"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/backend/breaker"
	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/conformance"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// harness gives each subtest a fresh key prefix on a shared server; each
// backend it makes has a client of its own, as another process would.
type harness struct {
	prefix    string
	newClient func() (redisbackend.Client, func() error)
	opts      []redisbackend.Option

	mu      sync.Mutex
	closers []func() error
}

func (h *harness) MakeBackend(ctx context.Context) (driver.Backend, error) {
	c, closeClient := h.newClient()
	h.mu.Lock()
	h.closers = append(h.closers, closeClient)
	h.mu.Unlock()
	return redisbackend.New(c, append([]redisbackend.Option{redisbackend.WithPrefix(h.prefix)}, h.opts...)...)
}

func (h *harness) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.closers {
		_ = c()
	}
	h.closers = nil
}

func harnessMaker(newClient func(tb testing.TB) func() (redisbackend.Client, func() error), opts ...redisbackend.Option) conformance.HarnessMaker {
	return func(ctx context.Context, tb testing.TB) (conformance.Harness, error) {
		return &harness{prefix: newPrefix(), newClient: newClient(tb), opts: opts}, nil
	}
}

// TestConformance runs the suite on every way to reach Redis: the default
// options (batching on) through a plain and a cluster client, which the
// backend cuts short itself; the auto-pipeliner (unbatched); batching with
// deadline-honouring clients and breakers; and one call per round trip, on
// one server and on the Cluster. (Sentinel and groups run it in
// TestSentinelFailoverClient and groups' TestConformance, batched and
// not.)
func TestConformance(t *testing.T) {
	t.Run("unbatched", func(t *testing.T) {
		conformance.Run(t, harnessMaker(func(tb testing.TB) func() (redisbackend.Client, func() error) {
			addr := standalone(tb).primary.Addr()
			return func() (redisbackend.Client, func() error) {
				c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
				return c, c.Close
			}
		}, redisbackend.WithoutBatching()))
	})
	t.Run("standalone", func(t *testing.T) {
		conformance.Run(t, harnessMaker(func(tb testing.TB) func() (redisbackend.Client, func() error) {
			addr := standalone(tb).primary.Addr()
			return func() (redisbackend.Client, func() error) {
				c := goredis.NewClient(&goredis.Options{Addr: addr})
				return c, c.Close
			}
		}))
	})
	t.Run("cluster", func(t *testing.T) {
		conformance.Run(t, harnessMaker(func(tb testing.TB) func() (redisbackend.Client, func() error) {
			addrs := cluster(tb).Addrs()
			return func() (redisbackend.Client, func() error) {
				c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs})
				return c, c.Close
			}
		}))
	})
	t.Run("cluster-unbatched", func(t *testing.T) {
		conformance.Run(t, harnessMaker(func(tb testing.TB) func() (redisbackend.Client, func() error) {
			addrs := cluster(tb).Addrs()
			return func() (redisbackend.Client, func() error) {
				c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
				return c, c.Close
			}
		}, redisbackend.WithoutBatching()))
	})
	t.Run("autopipeline", func(t *testing.T) {
		conformance.Run(t, harnessMaker(func(tb testing.TB) func() (redisbackend.Client, func() error) {
			addr := standalone(tb).primary.Addr()
			return func() (redisbackend.Client, func() error) {
				c := goredis.NewClient(&goredis.Options{Addr: addr})
				ap, err := c.AutoPipeline()
				if err != nil {
					tb.Fatal(err)
				}
				return ap, c.Close
			}
		}))
	})
	t.Run("batched", func(t *testing.T) {
		conformance.Run(t, harnessMaker(func(tb testing.TB) func() (redisbackend.Client, func() error) {
			addr := standalone(tb).primary.Addr()
			return func() (redisbackend.Client, func() error) {
				c := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true})
				return c, c.Close
			}
		}, redisbackend.WithBatching(0), redisbackend.WithBreaker(breaker.WithLogger(nil))))
	})
	t.Run("cluster-batched", func(t *testing.T) {
		conformance.Run(t, harnessMaker(func(tb testing.TB) func() (redisbackend.Client, func() error) {
			addrs := cluster(tb).Addrs()
			return func() (redisbackend.Client, func() error) {
				c := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
				return c, c.Close
			}
		}, redisbackend.WithBatching(0), redisbackend.WithBreaker(breaker.WithLogger(nil))))
	})
}
