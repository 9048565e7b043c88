package localserver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// This file holds the minimal RESP2 client the package needs for readiness
// checks and topology queries (PING, INFO, CLUSTER INFO, CLUSTER NODES).

// respError is an error reply ("-ERR ...") from Redis.
type respError string

func (e respError) Error() string { return "redis: " + string(e) }

// maxBulkLen bounds bulk strings and arrays read from the server.
const maxBulkLen = 64 << 20

// respConn is one connection to a Redis server.
type respConn struct {
	conn net.Conn
	r    *bufio.Reader
}

// dialRESP connects to addr, giving up at deadline. Every later command must
// also finish by that deadline.
func dialRESP(addr string, deadline time.Time) (*respConn, error) {
	d := net.Dialer{Deadline: deadline}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	if err := c.SetDeadline(deadline); err != nil {
		c.Close()
		return nil, err
	}
	return &respConn{conn: c, r: bufio.NewReader(c)}, nil
}

// dialContextRESP connects to addr; I/O fails once ctx is done.
func dialContextRESP(ctx context.Context, addr string) (*respConn, error) {
	c, err := dialContext(ctx, addr)
	if err != nil {
		return nil, err
	}
	return &respConn{conn: c, r: bufio.NewReader(c)}, nil
}

// dialContext dials addr over TCP. I/O on the connection fails once ctx is
// done: at its deadline, or as soon as it is canceled.
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

func (c *respConn) Close() error { return c.conn.Close() }

// do sends one command and reads its reply. Replies are decoded as string
// (simple and bulk strings), int64, []any, nil (null) or a respError.
func (c *respConn) do(args ...string) (any, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := io.WriteString(c.conn, b.String()); err != nil {
		return nil, err
	}
	return readReply(c.r)
}

// readReply decodes one RESP2 reply.
func readReply(r *bufio.Reader) (any, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r")
	if line == "" {
		return nil, errors.New("redis: empty reply line")
	}
	body := line[1:]
	switch line[0] {
	case '+':
		return body, nil
	case '-':
		return nil, respError(body)
	case ':':
		return strconv.ParseInt(body, 10, 64)
	case '$':
		n, err := strconv.Atoi(body)
		if err != nil || n > maxBulkLen {
			return nil, fmt.Errorf("redis: bad bulk length %q", body)
		}
		if n < 0 {
			return nil, nil
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		return string(buf[:n]), nil
	case '*':
		n, err := strconv.Atoi(body)
		if err != nil || n > maxBulkLen {
			return nil, fmt.Errorf("redis: bad array length %q", body)
		}
		if n < 0 {
			return nil, nil
		}
		arr := make([]any, n)
		for i := range arr {
			v, err := readReply(r)
			// An error element is part of the array, not a failure.
			var re respError
			if errors.As(err, &re) {
				arr[i] = re
				continue
			}
			if err != nil {
				return nil, err
			}
			arr[i] = v
		}
		return arr, nil
	default:
		return nil, fmt.Errorf("redis: unexpected reply %q", line)
	}
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
