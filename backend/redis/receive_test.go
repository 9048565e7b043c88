package redisbackend

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A reply that is there when the caller's context has ended too is the
// caller's answer: the store decided. A plain select would take either
// case at random, so a hundred tries would show a lost reply about fifty
// times.
func TestReceivePrefersTheReplyToAnEndedContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	done := make(chan int, 1)
	for i := range 100 {
		done <- i
		v, ok := receive(ctx, done)
		require.True(t, ok, "try %d: the reply was ready but the ended context won", i)
		assert.Equal(t, i, v)
	}
	// Without a reply, an ended context ends the wait.
	v, ok := receive(ctx, done)
	assert.False(t, ok)
	assert.Zero(t, v)
}
