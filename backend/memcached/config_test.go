package memcachedbackend

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	shardedbackend "github.com/throttlekit/throttlekit/backend/sharded"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// A client Timeout longer than the call timeout it runs under is refused
// where the two meet, throttler.New: gomemcache cannot cut a round trip
// short, so every call to a silent server would last the client's Timeout.
// No server is needed: neither NewClient nor New dials.
func TestClientTimeoutAboveCallTimeoutIsRefused(t *testing.T) {
	client, err := NewClient(time.Second, "127.0.0.1:11211")
	require.NoError(t, err)
	b, err := New(client)
	require.NoError(t, err)

	th, err := throttler.New(b)
	assert.Nil(t, th)
	require.ErrorIs(t, err, throttler.ErrInvalidOption)
	assert.EqualError(t, err, "throttlekit: invalid option: memcached: client Timeout 1s is longer than the throttler's call timeout 100ms (WithCallTimeout):"+
		" keep it at most the call timeout, as NewClient(timeout, ...) sets it")

	// Inside a decorator too, named by its shard.
	sh, err := shardedbackend.New([]shardedbackend.Shard{{Name: "a", Primary: memorybackend.New()}, {Name: "b", Primary: b}})
	require.NoError(t, err)
	_, err = throttler.New(sh)
	require.ErrorIs(t, err, throttler.ErrInvalidOption)
	assert.Contains(t, err.Error(), `throttlekit: sharded: shard "b": primary: invalid option: memcached: client Timeout 1s is longer`)

	for _, callTimeout := range []time.Duration{time.Second, 2 * time.Second, 0} {
		_, err := throttler.New(b, throttler.WithCallTimeout(callTimeout), throttler.WithLogger(nil))
		assert.NoError(t, err, "call timeout %v", callTimeout)
	}
	client.Timeout = 0 // gomemcache then uses its DefaultTimeout, 500 ms
	assert.ErrorIs(t, b.CheckConfig(100*time.Millisecond), driver.ErrInvalidOption)
	assert.NoError(t, b.CheckConfig(500*time.Millisecond))
}
