package localserver

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
)

// In a test binary, go-redis's own log lines are dropped. Tests stop,
// kill and restart servers on purpose, and go-redis logs every dial that
// fails ("connection refused") on its global logger; each failure still
// reaches the test as an error, so the lines only hide the output that
// matters. Setting the logger here, at package initialisation, happens
// before any test starts a client, so no client reads it concurrently.
// Programs that merely import this package (cmd/migrate-demo) keep
// go-redis's logging: testing.Testing is false for them.
func init() {
	if testing.Testing() {
		redis.SetLogger(discardRedisLog{})
	}
}

// discardRedisLog is a go-redis logger that drops every line.
type discardRedisLog struct{}

func (discardRedisLog) Printf(context.Context, string, ...any) {}
