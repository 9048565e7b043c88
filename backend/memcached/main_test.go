package memcachedbackend

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/stretchr/testify/require"
	"github.com/throttlekit/throttlekit/internal/localserver"
)

// The shared servers are started once per test binary, on first use, and
// closed by TestMain. Tests that stop a server or need a small memory
// limit start their own with localserver.MemcachedT.
var shared struct {
	once    sync.Once
	servers []*localserver.Memcached
	err     error
}

// sharedServerCount is how many shared servers exist (for /three).
const sharedServerCount = 3

func TestMain(m *testing.M) {
	code := m.Run()
	for _, s := range shared.servers {
		if err := s.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "closing memcached:", err)
		}
	}
	os.Exit(code)
}

// sharedAddrs returns the addresses of the first n shared servers, starting
// them on first use; it skips the test when memcached is not installed
// (fails instead when localserver.RequireServers says so).
func sharedAddrs(tb testing.TB, n int) []string {
	localserver.SkipIfShort(tb)
	tb.Helper()
	shared.once.Do(func() {
		for range sharedServerCount {
			s, err := localserver.StartMemcached(localserver.MemcachedOptions{})
			if err != nil {
				shared.err = err
				return
			}
			shared.servers = append(shared.servers, s)
		}
	})
	if shared.err != nil {
		if errors.Is(shared.err, localserver.ErrBinaryNotFound) && !localserver.RequireServers() {
			tb.Skipf("skipping: memcached not installed: %v", shared.err)
		}
		tb.Fatalf("starting memcached: %v", shared.err)
	}
	addrs := make([]string, n)
	for i := range addrs {
		addrs[i] = shared.servers[i].Addr()
	}
	return addrs
}

// testTimeout bounds each round trip in tests that do not test timeouts:
// generous, so that a slow -race run never turns into degraded results.
const testTimeout = 5 * time.Second

// freshPrefix returns a key prefix no other test uses.
func freshPrefix() string {
	return fmt.Sprintf("t%016x", rand.Uint64())
}

// newTestBackend returns a backend over addrs with a fresh prefix, and a
// raw client over the same servers for inspecting or disturbing state.
func newTestBackend(tb testing.TB, addrs []string, opts ...Option) (*Backend, *memcache.Client) {
	tb.Helper()
	client, err := NewClient(testTimeout, addrs...)
	require.NoError(tb, err)
	b, err := New(client, append([]Option{WithPrefix(freshPrefix())}, opts...)...)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = client.Close(); b.CloseIdleConnections() })
	return b, client
}

// localserverT starts a memcached of the test's own, for tests that stop it.
func localserverT(tb testing.TB) *localserver.Memcached {
	tb.Helper()
	return localserver.MemcachedT(tb, localserver.MemcachedOptions{})
}

// dummyClient is a client whose server nobody listens on, for tests that
// never reach a server.
func dummyClient() *memcache.Client { return memcache.New("127.0.0.1:1") }
