package redisbackend

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// This file holds the batching of WithBatching: script calls that arrive
// while a round trip is in flight go out together in the next one.

// DefaultMaxBatch is the largest number of script calls one round trip of
// WithBatching carries unless told otherwise.
const DefaultMaxBatch = 128

// WithBatching sends the script calls that arrive while a round trip is in
// flight together, as one pipeline, in the next round trip: one write and
// one read on the connection for many decisions instead of one each. A
// call that finds nothing in flight goes out at once, alone, so batching
// never waits on a timer and adds nothing at low load. maxBatch bounds a
// round trip's calls (DefaultMaxBatch when 0).
//
// On a standalone client (*goredis.Client: one server, a Sentinel failover
// client, or one group of package redisgroups) the decisions of a round
// trip are moreover decided by one script call, decide_many.lua, which
// runs decide.lua's logic for each in turn: Redis then pays its per-call
// cost (parsing, the script's setup, the reply) once per round trip
// instead of once per decision. On a Cluster the keys of one script call
// must share a slot, so there each decision keeps its own call, and
// go-redis sends each node its part of the pipeline.
//
// Each call still waits on its own context: one that ends before its round
// trip returns fails alone with the context's error (its decision may still
// apply, as with any timed-out call), and a call whose reply is an error
// (a foreign value under its keys, say) fails alone too. A round trip's
// deadline is the latest of its calls' deadlines. With a Cluster client,
// go-redis splits each pipeline by node and sends the parts in parallel.
//
// The client must have a Pipeline method (*goredis.Client, ClusterClient,
// Ring, or a UniversalClient): an auto-pipeliner is an error wrapping
// driver.ErrInvalidOption, since it batches by itself.
func WithBatching(maxBatch int) Option {
	return func(c *config) { c.batching, c.maxBatch = true, maxBatch }
}

// pipeliner is a client that can pipeline commands.
type pipeliner interface {
	Pipeline() goredis.Pipeliner
}

// Call states, in pending.state.
const (
	callQueued    int32 = iota // waiting in the queue
	callSent                   // taken into a round trip
	callAbandoned              // its caller left before it was sent
)

// pending is one script call waiting for its round trip.
type pending struct {
	ctx      context.Context
	script   *goredis.Script
	readOnly bool
	keys     []string
	args     []any
	state    atomic.Int32
	done     chan struct{} // receives once the reply is in
	reply    any
	err      error
}

var pendings = sync.Pool{New: func() any { return &pending{done: make(chan struct{}, 1)} }}

// batcher queues the script calls of one client and sends them in rounds
// from one goroutine, which runs while there is work and exits when the
// queue is empty.
type batcher struct {
	client Client
	pipe   pipeliner
	max    int
	// inline lets a call that finds the batcher idle run on its caller's
	// goroutine, bounded by its own context; only for clients that honour
	// context deadlines.
	inline bool
	// many sends a round trip's decisions as one call of decide_many.lua;
	// only for a client whose commands all go to one server.
	many bool

	mu      sync.Mutex
	queue   []*pending
	running bool
}

func newBatcher(c Client, maxBatch int, inline bool) (*batcher, error) {
	if maxBatch < 0 {
		return nil, fmt.Errorf("%w: WithBatching(%d): negative batch size", driver.ErrInvalidOption, maxBatch)
	}
	if maxBatch == 0 {
		maxBatch = DefaultMaxBatch
	}
	if _, ok := c.(*goredis.AutoPipeliner); ok {
		return nil, fmt.Errorf("%w: WithBatching with an auto-pipeliner, which batches by itself", driver.ErrInvalidOption)
	}
	p, ok := c.(pipeliner)
	if !ok {
		return nil, fmt.Errorf("%w: WithBatching needs a client with a Pipeline method, not %T", driver.ErrInvalidOption, c)
	}
	_, standalone := c.(*goredis.Client)
	return &batcher{client: c, pipe: p, max: maxBatch, inline: inline, many: standalone}, nil
}

// run sends one script call with the next round trip and waits for its
// reply or for ctx to end. With nothing in flight it runs the call at once.
func (bt *batcher) run(ctx context.Context, script *goredis.Script, readOnly bool, keys []string, args []any) (any, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	_, hasDeadline := ctx.Deadline()
	bt.mu.Lock()
	if bt.inline && !bt.running && (hasDeadline || ctx.Done() == nil) {
		// Nothing in flight: this call goes out at once on the caller's
		// goroutine. Calls that arrive meanwhile queue, and the sender
		// takes them when it returns.
		bt.running = true
		bt.mu.Unlock()
		var reply any
		var err error
		if readOnly {
			reply, err = script.RunRO(ctx, bt.client, keys, args...).Result()
		} else {
			reply, err = script.Run(ctx, bt.client, keys, args...).Result()
		}
		bt.mu.Lock()
		if len(bt.queue) > 0 {
			go bt.send()
		} else {
			bt.running = false
		}
		bt.mu.Unlock()
		return reply, withContextError(ctx, err)
	}
	p := pendings.Get().(*pending)
	p.ctx, p.script, p.readOnly, p.keys, p.args = ctx, script, readOnly, keys, args
	p.state.Store(callQueued)
	bt.queue = append(bt.queue, p)
	if !bt.running {
		bt.running = true
		go bt.send()
	}
	bt.mu.Unlock()

	select {
	case <-p.done:
		reply, err := p.reply, withContextError(ctx, p.err)
		p.release()
		return reply, err
	case <-ctx.Done():
		if p.state.CompareAndSwap(callQueued, callAbandoned) {
			// Never sent: the sender skips it and never touches it again.
			err := ctx.Err()
			p.release()
			return nil, err
		}
		// In flight: the sender still owns p and will write to it, so it
		// is left to the garbage collector rather than reused.
		return nil, ctx.Err()
	}
}

func (p *pending) release() {
	p.ctx, p.script, p.keys, p.args, p.reply, p.err = nil, nil, nil, nil, nil, nil
	pendings.Put(p)
}

// send runs round trips until the queue is empty.
func (bt *batcher) send() {
	var batch []*pending
	for {
		bt.mu.Lock()
		batch = batch[:0]
		n := 0
		for n < len(bt.queue) && len(batch) < bt.max {
			p := bt.queue[n]
			n++
			if p.state.CompareAndSwap(callQueued, callSent) {
				batch = append(batch, p)
			}
		}
		rest := copy(bt.queue, bt.queue[n:])
		clear(bt.queue[rest:])
		bt.queue = bt.queue[:rest]
		if len(batch) == 0 && rest == 0 {
			bt.running = false
			bt.mu.Unlock()
			return
		}
		bt.mu.Unlock()
		if len(batch) > 0 {
			bt.roundTrip(batch)
		}
	}
}

// roundTrip sends batch as one pipeline, its decisions as one call of
// decide_many.lua when the batcher has many set, and hands each call its
// reply.
func (bt *batcher) roundTrip(batch []*pending) {
	ctx, cancel := batchContext(batch)
	defer cancel()
	if len(batch) == 1 {
		p := batch[0]
		p.reply, p.err = runOne(ctx, bt.client, p)
		p.done <- struct{}{}
		return
	}
	pipe := bt.pipe.Pipeline()
	cmds := make([]*goredis.Cmd, len(batch))
	var many manyCall
	if bt.many {
		many = bt.collectDecisions(ctx, pipe, batch)
	}
	// inMany[i]: batch[i] rides in the decide_many.lua call. Read before
	// any reply is handed out: a caller reuses its pending once answered.
	inMany := make([]bool, len(batch))
	for i, p := range batch {
		if inMany[i] = many.cmd != nil && isDecision(p); inMany[i] {
			continue
		}
		if p.readOnly {
			cmds[i] = pipe.EvalShaRO(ctx, p.script.Hash(), p.keys, p.args...)
		} else {
			cmds[i] = pipe.EvalSha(ctx, p.script.Hash(), p.keys, p.args...)
		}
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	if many.cmd != nil {
		bt.answerDecisions(ctx, many)
	}
	for i, p := range batch {
		if inMany[i] {
			continue
		}
		p.reply, p.err = cmds[i].Result()
		if p.err != nil && goredis.HasErrorPrefix(p.err, "NOSCRIPT") {
			// The server lost its script cache (a restart, SCRIPT FLUSH):
			// this call goes again with the whole script, which also loads
			// it for the next rounds.
			p.reply, p.err = runOne(ctx, bt.client, p)
		}
		p.done <- struct{}{}
	}
}

// runOne runs one call on its own, with the script's EVALSHA-then-EVAL.
func runOne(ctx context.Context, c Client, p *pending) (any, error) {
	if p.readOnly {
		return p.script.RunRO(ctx, c, p.keys, p.args...).Result()
	}
	return p.script.Run(ctx, c, p.keys, p.args...).Result()
}

// batchContext bounds a round trip by the latest deadline among its calls,
// or by none when one of them has none (the client's timeouts then bound
// it). It is never canceled by a caller: a caller that leaves fails alone.
func batchContext(batch []*pending) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, p := range batch {
		d, ok := p.ctx.Deadline()
		if !ok {
			return context.Background(), func() {}
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.Background(), latest)
}

// manyCall is the decide_many.lua call that carries a round trip's
// decisions.
type manyCall struct {
	cmd   *goredis.Cmd
	calls []*pending // the decisions, in the order of the script's reply
	keys  []string
	args  []any
}

// isDecision reports whether p is a call of decide.lua, which a
// decide_many.lua call can carry.
func isDecision(p *pending) bool {
	return p.script == decideScript && !p.readOnly
}

// collectDecisions queues, on pipe, one call of decide_many.lua for the
// decisions of batch when there are at least two; the other calls of the
// batch go on their own. It returns the zero manyCall when it queued
// nothing.
func (bt *batcher) collectDecisions(ctx context.Context, pipe goredis.Pipeliner, batch []*pending) manyCall {
	var calls []*pending
	for _, p := range batch {
		if isDecision(p) {
			calls = append(calls, p)
		}
	}
	if len(calls) < 2 {
		return manyCall{}
	}
	m := newManyCall(calls)
	m.cmd = pipe.EvalSha(ctx, decideManyScript.Hash(), m.keys, m.args...)
	return m
}

// newManyCall lays out the keys and arguments of one decide_many.lua call
// for calls: the number of decisions, then each decision's number of keys
// and its decide.lua arguments; the keys one decision's after another's.
func newManyCall(calls []*pending) manyCall {
	nkeys, nargs := 0, 1
	for _, p := range calls {
		nkeys += len(p.keys)
		nargs += 1 + len(p.args)
	}
	m := manyCall{calls: calls, keys: make([]string, 0, nkeys), args: make([]any, 0, nargs)}
	m.args = append(m.args, len(calls))
	for _, p := range calls {
		m.keys = append(m.keys, p.keys...)
		m.args = append(m.args, len(p.keys))
		m.args = append(m.args, p.args...)
	}
	return m
}

// answerDecisions hands each decision of m its part of the reply. A
// server that lost its script cache gets the call again with the whole
// script.
func (bt *batcher) answerDecisions(ctx context.Context, m manyCall) {
	reply, err := m.cmd.Result()
	if err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") {
		reply, err = decideManyScript.Run(ctx, bt.client, m.keys, m.args...).Result()
	}
	m.deliver(reply, err)
}

// deliver gives each decision of m its element of reply and wakes its
// caller. An element that is an error (a foreign value under that
// decision's keys) fails that decision alone; an error of the whole call
// fails every decision of it.
func (m *manyCall) deliver(reply any, err error) {
	items, ok := reply.([]any)
	if err == nil && (!ok || len(items) != len(m.calls)) {
		err = fmt.Errorf("%w: decide_many.lua answered %T for %d decisions", ErrUnexpectedReply, reply, len(m.calls))
	}
	for i, p := range m.calls {
		switch {
		case err != nil:
			p.reply, p.err = nil, err
		default:
			if e, isErr := items[i].(error); isErr {
				p.reply, p.err = nil, e
			} else {
				p.reply, p.err = items[i], nil
			}
		}
		p.done <- struct{}{}
	}
}
