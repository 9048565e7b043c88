package redisbackend

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/backend/breaker"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// This file holds the circuit breakers: one per server, installed as a
// go-redis hook on the client of that server.

// WithBreaker configures the circuit breaker every Redis server the backend
// talks to has by default (see package breaker): once a server has failed
// opts' number of consecutive calls, calls to it fail at once with an error
// wrapping breaker.ErrOpen, and the throttler answers them by their failure
// mode in microseconds instead of waiting out the per-call timeout. A probe
// goes through after the open period; the server is used again as soon as
// one succeeds. WithoutBreaker turns them off.
//
// Breakers are on by default because the figures say so (docs/DESIGN.md,
// Outages): with Redis stopped or hung, a decision costs microseconds with
// them and the whole call timeout without; recovery after the outage stays
// well under a second (the rest of the open period and one probe); and a
// healthy Redis on a loaded machine never trips them.
//
// A breaker is per server: with a *goredis.Client, one for its server (for
// a Sentinel failover client, one for whichever primary it follows); with a
// *goredis.ClusterClient or *goredis.Ring, one per node, installed as the
// client connects to each node, so build the backend before the client's
// first command. The read client of WithReadClient gets breakers too. Other
// client types (an auto-pipeliner, a UniversalClient of another type) have
// no breaker by default, and WithBreaker given for one is an error
// wrapping driver.ErrInvalidOption.
//
// Network errors and timeouts count as failures; every reply of the server,
// an error reply included, counts as a success. A breaker opens on a run of
// failures that lasted breaker.DefaultFailingFor, not on a burst (see
// package breaker). When it opens, and before each probe, the server's
// pooled connections are marked stale, so the probe after an outage dials
// afresh instead of meeting a connection the outage killed.
func WithBreaker(opts ...breaker.Option) Option {
	return optionFunc(func(c *config) error {
		c.breaker, c.breakerAsked, c.breakerOpts = true, true, opts
		return nil
	})
}

// WithoutBreaker turns off the servers' circuit breakers (see WithBreaker):
// every call then goes to its server, and one to a server that is down
// waits for the network's answer, up to the throttler's call timeout. The
// connection hook that keeps an outage's dead connections out of the pool
// stays.
func WithoutBreaker() Option {
	return optionFunc(func(c *config) error {
		c.breaker, c.breakerAsked, c.breakerOpts = false, false, nil
		return nil
	})
}

// breakable reports whether c is a client type installBreakers can give
// breakers to.
func breakable(c Client) bool {
	switch c.(type) {
	case *goredis.Client, *goredis.ClusterClient, *goredis.Ring:
		return true
	}
	return false
}

// Breakers returns the state of every breaker the backend has made so far,
// sorted by server; nil with WithoutBreaker, or for a client type that has
// none (see WithBreaker).
func (b *Backend) Breakers() []breaker.Status {
	if b == nil || b.breakers == nil {
		return nil
	}
	return b.breakers.Statuses()
}

// installBreakers adds a connection hook to c, or to each node c connects
// to: with set, the server's breaker guards every command (see
// WithBreaker); with or without it, the hook keeps the client's pool clear
// of the connections an outage killed (see poolEpoch). With a nil set a
// client of another type is left alone; with a set it is an error
// wrapping driver.ErrInvalidOption.
func installBreakers(c Client, set *breaker.Set) error {
	var mu sync.Mutex
	pools := map[*breaker.Breaker]*poolEpoch{}
	hook := func(addr string) connHook {
		if set == nil {
			return connHook{pool: new(poolEpoch), addr: addr}
		}
		// A Cluster may make a new client for a node it knew: the
		// node's breaker, and so its pool epoch, stay the same.
		br := set.For(addr)
		mu.Lock()
		defer mu.Unlock()
		p, ok := pools[br]
		if !ok {
			p = new(poolEpoch)
			pools[br] = p
			br.AddDrain(p.drain)
		}
		return connHook{br: br, pool: p, addr: addr}
	}
	switch c := c.(type) {
	case *goredis.ClusterClient:
		c.OnNewNode(func(node *goredis.Client) { node.AddHook(hook(node.Options().Addr)) })
	case *goredis.Ring:
		c.OnNewNode(func(node *goredis.Client) { node.AddHook(hook(node.Options().Addr)) })
	case *goredis.Client:
		c.AddHook(hook(c.Options().Addr))
	default:
		if set == nil {
			return nil
		}
		return driver.Errorf("%w: WithBreaker needs a *goredis.Client, *goredis.ClusterClient or *goredis.Ring, not %T",
			driver.ErrInvalidOption, c)
	}
	return nil
}

// connHook puts one server's breaker, if any, in front of the commands sent
// to it, and marks its pooled connections stale when a command fails on
// the network or the breaker opens or probes.
type connHook struct {
	br   *breaker.Breaker // nil with WithoutBreaker
	pool *poolEpoch
	addr string // the server's, for the cause of a timeout (withCause)
}

// DialHook implements goredis.Hook: every connection is dialed in the
// pool's current epoch (see poolEpoch). Dials are not guarded by the
// breaker separately: a failed dial fails the command that needed it.
//
// A failed dial is handed to the pool as a connection that fails on first
// use with the dial's error, not as a dial error: go-redis v9 counts dial
// errors for the pool's lifetime, never resetting the count on a successful
// dial, and once they reach PoolSize it stops dialing and answers every
// caller with the last error until a background retry, a second later,
// succeeds. Over repeated outages a server that was back then stayed out of
// use for up to a second (TestRecoveryGroupPrimary). The command that needed
// the connection fails with the same error either way, and the pool drops
// the connection at once.
func (h connHook) DialHook(next goredis.DialHook) goredis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil {
			h.pool.noteFailure(err)
			return failedDial{err: err}, nil
		}
		return h.pool.track(conn), nil
	}
}

// failedDial is the connection DialHook hands over for a dial that failed:
// every read and write returns the dial's error.
type failedDial struct{ err error }

func (f failedDial) Read([]byte) (int, error)         { return 0, f.err }
func (f failedDial) Write([]byte) (int, error)        { return 0, f.err }
func (f failedDial) Close() error                     { return nil }
func (f failedDial) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (f failedDial) RemoteAddr() net.Addr             { return &net.TCPAddr{} }
func (f failedDial) SetDeadline(time.Time) error      { return nil }
func (f failedDial) SetReadDeadline(time.Time) error  { return nil }
func (f failedDial) SetWriteDeadline(time.Time) error { return nil }

// ProcessHook implements goredis.Hook.
func (h connHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if connectionSetup(cmd.Name()) {
			return next(ctx, cmd)
		}
		var done func(error)
		if h.br != nil {
			var err error
			if done, err = h.br.Allow(); err != nil {
				cmd.SetErr(err)
				return err
			}
		}
		seen := h.pool.failures.Load()
		err := next(ctx, cmd)
		if kept := h.pool.withCause(err, seen, h.addr); kept != err {
			err = kept
			cmd.SetErr(err)
		}
		h.finished(done, err)
		return err
	}
}

// ProcessPipelineHook implements goredis.Hook.
func (h connHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if setupOnly(cmds) {
			return next(ctx, cmds)
		}
		var done func(error)
		if h.br != nil {
			var err error
			if done, err = h.br.Allow(); err != nil {
				for _, cmd := range cmds {
					cmd.SetErr(err)
				}
				return err
			}
		}
		seen := h.pool.failures.Load()
		err := next(ctx, cmds)
		if kept := h.pool.withCause(err, seen, h.addr); kept != err {
			for _, cmd := range cmds {
				if cmd.Err() == err {
					cmd.SetErr(kept)
				}
			}
			err = kept
		}
		h.finished(done, err)
		return err
	}
}

// finished counts a command's result in the breaker and, when the network
// failed it, marks the idle connections stale before the breaker can send
// a probe.
func (h connHook) finished(done func(error), err error) {
	failure := serverFailure(err)
	if failure != nil && !errors.Is(failure, context.Canceled) {
		h.pool.drain()
	}
	if done != nil {
		done(failure)
	}
}

// poolEpoch marks one server's pooled connections stale in one step,
// without touching the pool: go-redis checks every idle connection before
// it hands it out (a nonblocking read on its socket, through
// syscall.Conn), and a connection dialed before the latest drain fails
// that check, so the pool closes it and takes or dials another. A
// connection carrying a command is left alone: it is checked when it next
// leaves the pool. Drains come from the first command that fails on the
// network (its siblings idle in the pool most likely met the same fate: a
// restarted server, a black hole, reset connections) and from the breaker,
// when it opens and before each probe, so that the probe that follows an
// outage always dials a fresh connection.
//
// It also keeps the server's latest dial failure, for withCause.
type poolEpoch struct {
	epoch    atomic.Uint64
	failures atomic.Uint64         // dial failures so far
	last     atomic.Pointer[error] // the latest of them
}

// noteFailure records a failed dial to the server.
func (p *poolEpoch) noteFailure(err error) {
	p.last.Store(&err)
	p.failures.Add(1)
}

// withCause returns err, a command's error to the server at addr, with
// what kept the command from an answer joined to it when err is only the
// context's, so that a degraded result says why. go-redis returns nothing
// but the context's error in two cases:
//
//   - it retries a refused dial with a backoff until the deadline, and a
//     deadline that ends the backoff is all it returns: a Redis that is
//     down read as "context deadline exceeded". The server's latest dial
//     failure since the command began (failures was seen then) is the
//     cause: "connect: connection refused", a dial's i/o timeout;
//   - a read that the deadline ends (a hung server, a black hole) returns
//     the context's error, not the socket's. With no dial failure, the
//     cause is that the server sent no reply in time, which matches
//     os.ErrDeadlineExceeded ("i/o timeout") as the socket's error would.
//
// The context's error and the cause both match errors.Is.
func (p *poolEpoch) withCause(err error, seen uint64, addr string) error {
	if err == nil || !isContextOnly(err) {
		return err
	}
	if p.failures.Load() != seen {
		if last := p.last.Load(); last != nil {
			return &causedError{err: err, cause: *last}
		}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return &causedError{err: err, cause: &noReplyError{addr: addr}}
	}
	return err
}

// noReplyError is the cause of a deadline that ended a command with no
// dial failure: the server at addr did not reply in time.
type noReplyError struct{ addr string }

func (e *noReplyError) Error() string {
	return "no reply from " + e.addr + ": " + os.ErrDeadlineExceeded.Error()
}

func (e *noReplyError) Unwrap() error { return os.ErrDeadlineExceeded }

// isContextOnly reports an error that is the context's and says nothing
// else: its text is the context error's own.
func isContextOnly(err error) bool {
	return (errors.Is(err, context.DeadlineExceeded) && err.Error() == context.DeadlineExceeded.Error()) ||
		(errors.Is(err, context.Canceled) && err.Error() == context.Canceled.Error())
}

// causedError is a context error with the failure that kept the command
// from an answer before it.
type causedError struct{ err, cause error }

func (e *causedError) Error() string {
	return e.err.Error() + " (the last attempt: " + e.cause.Error() + ")"
}

func (e *causedError) Unwrap() []error { return []error{e.err, e.cause} }

// errStale is what the health check of a connection dialed before the
// latest drain meets.
var errStale = errors.New("throttlekit: connection dialed before the server failed")

// drain marks every connection dialed so far stale.
func (p *poolEpoch) drain() { p.epoch.Add(1) }

// track wraps conn so that the pool's health check sees it stale after the
// next drain. A connection without a socket (a TLS connection) cannot be
// checked by go-redis: it is closed on its first write after a drain
// instead, which fails that command with an error go-redis retries.
func (p *poolEpoch) track(conn net.Conn) net.Conn {
	t := trackedConn{Conn: conn, pool: p, epoch: p.epoch.Load()}
	if sc, ok := conn.(syscall.Conn); ok {
		return &trackedSocket{trackedConn: t, sc: sc}
	}
	return &t
}

// trackedConn is a connection with the epoch it was dialed in.
type trackedConn struct {
	net.Conn
	pool  *poolEpoch
	epoch uint64
}

func (c *trackedConn) stale() bool { return c.epoch != c.pool.epoch.Load() }

// Write implements net.Conn.
func (c *trackedConn) Write(b []byte) (int, error) {
	if c.stale() {
		_ = c.Conn.Close()
		return 0, driver.Errorf("%w: %w", errStale, io.EOF)
	}
	return c.Conn.Write(b)
}

// trackedSocket is a trackedConn over a socket, which go-redis's health
// check reads.
type trackedSocket struct {
	trackedConn
	sc syscall.Conn
}

// Write implements net.Conn. A socket is checked by go-redis as it leaves
// the pool; one made stale while it carries a command keeps it.
func (c *trackedSocket) Write(b []byte) (int, error) { return c.Conn.Write(b) }

// SyscallConn implements syscall.Conn for go-redis's health check, which
// a stale connection fails.
func (c *trackedSocket) SyscallConn() (syscall.RawConn, error) {
	if c.stale() {
		return nil, errStale
	}
	return c.sc.SyscallConn()
}

// connectionSetup reports the commands go-redis sends on a new connection
// before the command that needed it. They pass the breaker unchecked: they
// run inside that command's own passage (a half-open probe would otherwise
// be refused its own connection), and its result counts for both.
func connectionSetup(name string) bool {
	switch name {
	case "hello", "auth", "select", "client", "readonly", "readwrite":
		return true
	}
	return false
}

// setupOnly reports a pipeline of connection setup commands alone, which
// go-redis sends on a new connection.
func setupOnly(cmds []goredis.Cmder) bool {
	for _, cmd := range cmds {
		if !connectionSetup(cmd.Name()) {
			return false
		}
	}
	return len(cmds) > 0
}

// serverFailure returns err when it says the server could not be reached
// or did not answer in time, and nil for anything the server answered
// (a reply error such as NOSCRIPT or MOVED, a missing key).
func serverFailure(err error) error {
	if err == nil || errors.Is(err, goredis.Nil) || errors.Is(err, context.Canceled) {
		return err
	}
	var reply goredis.Error
	if errors.As(err, &reply) {
		// The node answered, CLUSTERDOWN included: that is the cluster's
		// state, which the breaker of one node must not hide.
		return nil
	}
	return err
}
