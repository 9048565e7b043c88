package memcachedbackend

import (
	"context"
	"sync"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/throttlekit/throttlekit/conformance"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// harness gives one subtest a fresh prefix over shared servers. Each
// backend it makes has a client of its own, as separate processes would.
type harness struct {
	addrs  []string
	prefix string

	mu       sync.Mutex
	clients  []*memcache.Client
	backends []*Backend
}

var _ conformance.Limitations = (*harness)(nil)

func (h *harness) MakeBackend(context.Context) (driver.Backend, error) {
	client, err := NewClient(testTimeout, h.addrs...)
	if err != nil {
		return nil, err
	}
	b, err := New(client, WithPrefix(h.prefix))
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	h.clients = append(h.clients, client)
	h.backends = append(h.backends, b)
	h.mu.Unlock()
	return b, nil
}

func (h *harness) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.clients {
		_ = c.Close()
	}
	for _, b := range h.backends {
		b.CloseIdleConnections()
	}
}

// Limitations declares the documented weaker guarantee: a request of cost
// above one holds its units between its incr and its decr, so a racing
// request that would fit may be denied.
func (h *harness) Limitations() conformance.Caveats {
	return conformance.Caveats{CostAboveOneInexactUnderConcurrency: true}
}

func makerFor(servers int) conformance.HarnessMaker {
	return func(_ context.Context, tb testing.TB) (conformance.Harness, error) {
		return &harness{addrs: sharedAddrs(tb, servers), prefix: freshPrefix()}, nil
	}
}

func TestConformance(t *testing.T) {
	t.Run("one", func(t *testing.T) { conformance.Run(t, makerFor(1)) })
	t.Run("three", func(t *testing.T) { conformance.Run(t, makerFor(sharedServerCount)) })
}
