package redisbackend

import (
	"context"
	"errors"
	"fmt"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/backend/breaker"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// This file holds the circuit breakers: one per server, installed as a
// go-redis hook on the client of that server.

// WithBreaker gives every Redis server the backend talks to a circuit
// breaker (see package breaker): once a server has failed opts' number of
// consecutive calls, calls to it fail at once with an error wrapping
// breaker.ErrOpen, and the throttler answers them by their failure mode in
// microseconds instead of waiting out the per-call timeout. A probe goes
// through after the open period; the server is used again as soon as one
// succeeds.
//
// A breaker is per server: with a *goredis.Client, one for its server (for
// a Sentinel failover client, one for whichever primary it follows); with a
// *goredis.ClusterClient or *goredis.Ring, one per node, installed as the
// client connects to each node, so build the backend before the client's
// first command. The read client of WithReadClient gets breakers too. Other
// client types (an auto-pipeliner, a UniversalClient of another type) are
// an error wrapping driver.ErrInvalidOption.
//
// Network errors and timeouts count as failures; every reply of the server,
// an error reply included, counts as a success.
func WithBreaker(opts ...breaker.Option) Option {
	return func(c *config) { c.breaker, c.breakerOpts = true, opts }
}

// Breakers returns the state of every breaker the backend has made so far,
// sorted by server; nil without WithBreaker.
func (b *Backend) Breakers() []breaker.Status {
	if b == nil || b.breakers == nil {
		return nil
	}
	return b.breakers.Statuses()
}

// installBreakers adds a breaker hook to c, or to each node c connects to.
func installBreakers(c Client, set *breaker.Set) error {
	switch c := c.(type) {
	case *goredis.ClusterClient:
		c.OnNewNode(func(node *goredis.Client) { node.AddHook(breakerHook{set.For(node.Options().Addr)}) })
	case *goredis.Ring:
		c.OnNewNode(func(node *goredis.Client) { node.AddHook(breakerHook{set.For(node.Options().Addr)}) })
	case *goredis.Client:
		c.AddHook(breakerHook{set.For(c.Options().Addr)})
	default:
		return fmt.Errorf("%w: WithBreaker needs a *goredis.Client, *goredis.ClusterClient or *goredis.Ring, not %T",
			driver.ErrInvalidOption, c)
	}
	return nil
}

// breakerHook puts one server's breaker in front of the commands sent to
// it.
type breakerHook struct{ br *breaker.Breaker }

// DialHook implements goredis.Hook; dials are not guarded separately: a
// failed dial fails the command that needed it.
func (h breakerHook) DialHook(next goredis.DialHook) goredis.DialHook { return next }

// ProcessHook implements goredis.Hook.
func (h breakerHook) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if connectionSetup(cmd.Name()) {
			return next(ctx, cmd)
		}
		done, err := h.br.Allow()
		if err != nil {
			cmd.SetErr(err)
			return err
		}
		err = next(ctx, cmd)
		done(serverFailure(err))
		return err
	}
}

// ProcessPipelineHook implements goredis.Hook.
func (h breakerHook) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if setupOnly(cmds) {
			return next(ctx, cmds)
		}
		done, err := h.br.Allow()
		if err != nil {
			for _, cmd := range cmds {
				cmd.SetErr(err)
			}
			return err
		}
		err = next(ctx, cmds)
		done(serverFailure(err))
		return err
	}
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
