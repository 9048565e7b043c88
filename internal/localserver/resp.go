package localserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// This file holds the Redis commands the package sends for readiness checks
// and topology queries (PING, INFO, CLUSTER INFO, CLUSTER NODES, SENTINEL),
// through go-redis.

// respConn is one client connection to a Redis server or sentinel, for a
// handful of commands under one context.
type respConn struct {
	client *redis.Client
	ctx    context.Context
	cancel context.CancelFunc
}

// dialRESP returns a connection to addr whose commands must all finish by
// deadline.
func dialRESP(addr string, deadline time.Time) (*respConn, error) {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	return newRESP(ctx, cancel, addr), nil
}

// dialContextRESP returns a connection to addr whose commands fail once ctx
// is done.
func dialContextRESP(ctx context.Context, addr string) (*respConn, error) {
	ctx, cancel := context.WithCancel(ctx)
	return newRESP(ctx, cancel, addr), nil
}

func newRESP(ctx context.Context, cancel context.CancelFunc, addr string) *respConn {
	client := redis.NewClient(&redis.Options{
		Addr: addr,
		// RESP2 keeps replies plain: strings, integers, arrays.
		Protocol: 2,
		// One connection, no retry: a readiness check must see the server
		// as it is.
		PoolSize:   1,
		MaxRetries: -1,
		// The context bounds every command; sentinels answer no CLIENT
		// SETINFO.
		ContextTimeoutEnabled: true,
		DisableIdentity:       true,
	})
	return &respConn{client: client, ctx: ctx, cancel: cancel}
}

// Close closes the connection.
func (c *respConn) Close() error {
	c.cancel()
	return c.client.Close()
}

// do sends one command and returns its reply, decoded as string (simple and
// bulk strings), int64, []any or nil (a null reply). An error reply is an
// error that errors.As matches with redis.Error.
func (c *respConn) do(args ...string) (any, error) {
	cmdArgs := make([]any, len(args))
	for i, a := range args {
		cmdArgs[i] = a
	}
	v, err := c.client.Do(c.ctx, cmdArgs...).Result()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	return v, err
}

// dialContext dials addr over TCP (memcached's text protocol needs no
// client library here). I/O on the connection fails once ctx is done: at its
// deadline, or as soon as it is canceled.
func dialContext(ctx context.Context, addr string) (*connCtx, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if dl, ok := ctx.Deadline(); ok {
		if err := c.SetDeadline(dl); err != nil {
			c.Close()
			return nil, err
		}
	}
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	return &connCtx{Conn: c, stop: stop}, nil
}

// connCtx is a net.Conn tied to a context by dialContext.
type connCtx struct {
	net.Conn
	stop func() bool
}

// Close closes the connection and detaches it from its context.
func (c *connCtx) Close() error {
	c.stop()
	return c.Conn.Close()
}

// redisDo runs a single command on a fresh connection to addr.
func redisDo(addr string, timeout time.Duration, args ...string) (any, error) {
	c, err := dialRESP(addr, time.Now().Add(timeout))
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.do(args...)
}

// redisString runs a command whose reply is a (simple or bulk) string.
func redisString(addr string, timeout time.Duration, args ...string) (string, error) {
	v, err := redisDo(addr, timeout, args...)
	if err != nil {
		return "", err
	}
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("redis: %s: unexpected reply %#v", args[0], v)
	}
	return s, nil
}

// redisInfo runs a command with INFO-style output ("key:value" lines, e.g.
// INFO or CLUSTER INFO) and parses it.
func redisInfo(addr string, timeout time.Duration, args ...string) (map[string]string, error) {
	s, err := redisString(addr, timeout, args...)
	if err != nil {
		return nil, err
	}
	return parseInfo(s), nil
}

// parseInfo parses "key:value" lines, skipping "# Section" headers.
func parseInfo(s string) map[string]string {
	m := make(map[string]string)
	for _, line := range strings.Split(s, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		if k, v, ok := strings.Cut(line, ":"); ok {
			m[k] = v
		}
	}
	return m
}
