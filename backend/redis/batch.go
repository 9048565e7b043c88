package redisbackend

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// This file holds the batching, on by default: script calls that arrive
// while a round trip is in flight go out together in the next one.

// DefaultMaxBatch is the largest number of script calls one round trip
// carries unless WithBatching says otherwise.
const DefaultMaxBatch = 128

// WithBatching sets the largest number of script calls one round trip
// carries (DefaultMaxBatch when 0), and makes a client that cannot batch an
// error rather than a quiet fallback to one call per round trip.
//
// Batching is on by default wherever the client can pipeline: a
// *goredis.Client (one server, a Sentinel failover client, a group of
// package redisgroups), a ClusterClient, a Ring or a UniversalClient. The
// calls that arrive while a round trip is in flight go out together in the
// next one, as one pipeline: one write and one read on the connection for
// many decisions instead of one each. A call that finds nothing in flight
// goes out at once, alone, on its caller's goroutine when the client honours
// context deadlines, so batching never waits on a timer and a single caller
// pays nothing for it. WithoutBatching turns it off.
//
// What a round trip's calls share: the connection, the write and the read,
// and a deadline, the latest of theirs, for the round trip (a caller whose
// own deadline passes first still returns at it, with the context's error;
// its decision may still apply, as with any timed-out call). What they do
// not share: each decision is decided on its own, exactly as alone, in the
// order the calls arrived among the decisions of its policy (decisions of
// two policies never share a key), and a call whose reply is an error (a
// foreign value under its key) fails alone.
//
// On a standalone client the decisions of a round trip are moreover decided
// by one script call per policy shape (a shape's batch script, or
// decide_many.lua), which runs the lone script's logic for each in turn:
// Redis then pays its per-call cost (parsing, the script's setup, the
// reply) once per round trip instead of once per decision. On a Cluster
// each primary gets round trips of its own, whose decisions go the same
// way whatever their slots (see Batching in the package documentation).
//
// An auto-pipeliner batches by itself: WithBatching with one is an error
// wrapping driver.ErrInvalidOption, and by default it runs unbatched.
func WithBatching(maxBatch int) Option {
	return optionFunc(func(c *config) error {
		if maxBatch < 0 {
			return fmt.Errorf("%w: WithBatching(%d): negative batch size", driver.ErrInvalidOption, maxBatch)
		}
		c.batching, c.batchingAsked, c.maxBatch = true, true, maxBatch
		return nil
	})
}

// WithRoundTripsInFlight sets the most round trips a batcher keeps in
// flight to one server at once, n of at least 1 (driver.ErrInvalidOption
// otherwise): by default two to a standalone server or a Sentinel primary,
// so that the server runs one while the other travels, and one to each
// Cluster primary, whose primaries already run in parallel (see
// maxInFlight). Package redisgroups sets one for the servers of its groups,
// for the same reason. Without batching it has no effect.
func WithRoundTripsInFlight(n int) Option {
	return optionFunc(func(c *config) error {
		if n < 1 {
			return fmt.Errorf("%w: WithRoundTripsInFlight(%d): at least one round trip must be in flight", driver.ErrInvalidOption, n)
		}
		c.inFlight = n
		return nil
	})
}

// WithoutBatching sends every script call in a round trip of its own, as
// releases before batching was the default did.
func WithoutBatching() Option {
	return optionFunc(func(c *config) error { c.batching, c.batchingAsked = false, false; return nil })
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
	policy   *driver.Policy // a decision's policy, nil for other calls
	state    atomic.Int32
	inMany   bool          // rides in a batch call of its round trip
	done     chan struct{} // receives once the reply is in
	reply    any
	err      error
}

var pendings = sync.Pool{New: func() any { return &pending{done: make(chan struct{}, 1)} }}

// maxInFlight is how many round trips the batcher of one server keeps in
// flight at once, each on a connection of the client's pool. With one, the server idles
// while a round trip's reply travels back and the next is written; with
// two, one is on the wire while the server runs the other.
//
// A Cluster's primaries run in parallel, so one round trip in flight per
// primary (clusterInFlight) already keeps the store busy while the client
// handles another primary's reply; a second per primary would halve each
// batch and double the round trips that both sides pay for. Measured on
// the 2-core machine of bench/BENCHMARKS.md with 3 primaries, interleaved:
// 173,000-185,000 decisions/s with one, 135,000-159,000 with two.
const (
	maxInFlight     = 2
	clusterInFlight = 1
)

// scriptRunner runs one script call, batched with others: a batcher, or a
// clusterBatcher that keeps one batcher per Cluster primary.
type scriptRunner interface {
	run(ctx context.Context, script *goredis.Script, readOnly bool, keys []string, args []any, policy *driver.Policy) (any, error)
}

// batcher queues the script calls of one client and sends them in rounds
// from up to inFlight goroutines, which run while there is work and
// exit when the queue is empty.
type batcher struct {
	client Client
	pipe   pipeliner
	max    int
	// inline lets a call that finds the batcher idle run on its caller's
	// goroutine, bounded by its own context; only for clients that honour
	// context deadlines.
	inline bool
	// many sends a round trip's decisions as one batch call per shape
	// (collectDecisions); only for a client whose commands all go to one
	// server.
	many bool

	// inFlight is the most round trips in flight at once: maxInFlight, or
	// clusterInFlight for a Cluster primary's batcher.
	inFlight int

	mu      sync.Mutex
	queue   []*pending
	senders int // round trips in flight, or about to be
}

// newBatcher returns the scriptRunner for c: a batcher, or for a Cluster
// client a batcher per primary.
func newBatcher(c Client, maxBatch, inFlight int, inline bool) (scriptRunner, error) {
	if maxBatch < 0 {
		return nil, fmt.Errorf("%w: WithBatching(%d): negative batch size", driver.ErrInvalidOption, maxBatch)
	}
	if maxBatch == 0 {
		maxBatch = DefaultMaxBatch
	}
	if _, ok := c.(*goredis.AutoPipeliner); ok {
		return nil, fmt.Errorf("%w: WithBatching with an auto-pipeliner, which batches by itself", driver.ErrInvalidOption)
	}
	if cc, ok := c.(*goredis.ClusterClient); ok {
		if inFlight == 0 {
			inFlight = clusterInFlight
		}
		return &clusterBatcher{cluster: newConn(cc), max: maxBatch, inFlight: inFlight, inline: inline, nodes: map[*goredis.Client]*batcher{}}, nil
	}
	p, ok := c.(pipeliner)
	if !ok {
		return nil, fmt.Errorf("%w: WithBatching needs a client with a Pipeline method, not %T", driver.ErrInvalidOption, c)
	}
	_, standalone := c.(*goredis.Client)
	if inFlight == 0 {
		inFlight = maxInFlight
	}
	return &batcher{client: c, pipe: p, max: maxBatch, inline: inline, many: standalone, inFlight: inFlight}, nil
}

// run sends one script call with the next round trip and waits for its
// reply or for ctx to end. With nothing in flight it runs the call at once.
//
// policy is the decision's policy for a call of a lone decision script,
// which a batch call may carry, and nil for any other call.
func (bt *batcher) run(ctx context.Context, script *goredis.Script, readOnly bool, keys []string, args []any, policy *driver.Policy) (any, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	_, hasDeadline := ctx.Deadline()
	bt.mu.Lock()
	if bt.inline && bt.senders == 0 && (hasDeadline || ctx.Done() == nil) {
		// Nothing in flight: this call goes out at once on the caller's
		// goroutine. Calls that arrive meanwhile queue, and the senders
		// take them.
		bt.senders++
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
			bt.senders--
		}
		bt.mu.Unlock()
		return reply, withContextError(ctx, err)
	}
	p := pendings.Get().(*pending)
	p.ctx, p.script, p.readOnly, p.keys, p.args, p.policy = ctx, script, readOnly, keys, args, policy
	p.state.Store(callQueued)
	bt.queue = append(bt.queue, p)
	if bt.senders < bt.inFlight {
		bt.senders++
		go bt.send()
	}
	bt.mu.Unlock()

	if _, ok := receive(ctx, p.done); ok {
		reply, err := p.reply, withContextError(ctx, p.err)
		p.release()
		return reply, err
	}
	if p.state.CompareAndSwap(callQueued, callAbandoned) {
		// Never sent. The queue still holds p, so it is the sender's now:
		// it skips p and puts it back in the pool. Were it put back here,
		// another call (of any batcher: the pool is shared) could take it
		// while this batcher's queue still names it, and this batcher's
		// sender would then send that call to its own server and hand its
		// caller a reply about another identifier's window.
		return nil, ctx.Err()
	}
	// In flight: the sender still owns p and will write to it, so it is
	// left to the garbage collector rather than reused.
	return nil, ctx.Err()
}

// receive waits for a value on done or for ctx to end, and reports
// whether it got the value. A value that is there when ctx has ended too
// wins: a caller scheduled late on a busy machine finds both ready (and
// select picks either at random), but the store has answered, so its
// answer stands.
func receive[T any](ctx context.Context, done <-chan T) (T, bool) {
	select {
	case v := <-done:
		return v, true
	case <-ctx.Done():
		select {
		case v := <-done:
			return v, true
		default:
			var zero T
			return zero, false
		}
	}
}

func (p *pending) release() {
	p.ctx, p.script, p.keys, p.args, p.policy, p.reply, p.err = nil, nil, nil, nil, nil, nil, nil
	pendings.Put(p)
}

// send runs round trips until the queue is empty. Up to bt.inFlight of it
// run at once, each taking the calls queued when it looks.
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
			} else {
				// Abandoned by its caller while queued: this is the last
				// reference to it.
				p.release()
			}
		}
		rest := copy(bt.queue, bt.queue[n:])
		clear(bt.queue[rest:])
		bt.queue = bt.queue[:rest]
		if len(batch) == 0 && rest == 0 {
			bt.senders--
			bt.mu.Unlock()
			return
		}
		bt.mu.Unlock()
		if len(batch) > 0 {
			bt.roundTrip(batch)
		}
	}
}

// roundTrip sends batch as one pipeline, its decisions as one batch call
// per shape when the batcher has many set, and hands each call its reply.
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
	many := bt.collectDecisions(ctx, pipe, batch)
	// inMany[i]: batch[i] rides in a batch call. Read before
	// any reply is handed out: a caller reuses its pending once answered.
	inMany := make([]bool, len(batch))
	for i, p := range batch {
		if inMany[i] = p.inMany; inMany[i] {
			p.inMany = false
			continue
		}
		if p.readOnly {
			cmds[i] = pipe.EvalShaRO(ctx, p.script.Hash(), p.keys, p.args...)
		} else {
			cmds[i] = pipe.EvalSha(ctx, p.script.Hash(), p.keys, p.args...)
		}
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error
	for _, m := range many {
		bt.answerDecisions(ctx, m)
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

// manyCall is the batch call (decide_many.lua, or a shape's batch script)
// that carries a round trip's decisions of one shape.
type manyCall struct {
	script *goredis.Script
	cmd    *goredis.Cmd
	calls  []*pending // the decisions, in the order of the script's reply
	keys   []string
	args   []any
}

// isDecision reports whether p is a call of a lone decision script
// (decide.lua, or a shape's), which a batch call can carry.
func isDecision(p *pending) bool {
	return p.policy != nil && !p.readOnly && manyFor(p.script) != nil
}

// collectDecisions queues, on pipe, one batch call per decision script
// that at least two decisions of batch use, when the batcher's client is
// one server, and marks those decisions inMany; the other calls of the
// batch go on their own. It returns the calls it queued.
func (bt *batcher) collectDecisions(ctx context.Context, pipe goredis.Pipeliner, batch []*pending) []manyCall {
	if !bt.many {
		return nil
	}
	// A round trip's decisions mostly share one or two shapes: a short list
	// of scripts is all the grouping needs.
	var scripts []*goredis.Script
	var groups [][]*pending
	for _, p := range batch {
		if !isDecision(p) {
			continue
		}
		k := slices.Index(scripts, p.script)
		if k < 0 {
			k = len(scripts)
			scripts, groups = append(scripts, p.script), append(groups, nil)
		}
		groups[k] = append(groups[k], p)
	}
	var many []manyCall
	for k, calls := range groups {
		if len(calls) < 2 {
			continue // goes on its own
		}
		for _, p := range calls {
			p.inMany = true
		}
		m := newManyCall(calls, scripts[k] != decideScript)
		m.script = manyFor(scripts[k])
		m.cmd = pipe.EvalSha(ctx, m.script.Hash(), m.keys, m.args...)
		many = append(many, m)
	}
	return many
}

// newManyCall lays out the keys and arguments of one batch call for
// calls, lone decision calls whose arguments are scriptArgs': the grace,
// each distinct policy once (its number of limits and their values), then
// the number of decisions and, for each, its policy's index, now in ms and
// µs, its cost and its key (decide_many.lua's layout), the decisions of
// one policy together. The first
// decision's key is the one declared key, which routes the call on a
// Cluster.
//
// With compact set (a shape's batch script), the number of decisions is
// followed by a form, and each decision carries only what the form says
// it needs: its policy's index when the call has more than one policy
// (form bit 1), now in µs when the shape has a GCRA limit, the only
// algorithm that reads it (bit 2), its cost when some cost is not 1 (bit
// 4); now in ms and the key always. Most round trips need three values per
// decision instead of five, which Redis parses and Lua interns for every
// decision.
func newManyCall(calls []*pending, compact bool) manyCall {
	var policies []*driver.Policy
	index := make([]int, len(calls))
	nargs := 4 + 5*len(calls)
	form := 0
	for i, p := range calls {
		index[i] = slices.Index(policies, p.policy)
		if index[i] < 0 {
			index[i] = len(policies)
			policies = append(policies, p.policy)
			nargs += len(p.args) - 4
		}
		if c, ok := p.args[2].(int64); !ok || c != 1 {
			form |= formCost
		}
	}
	if len(policies) > 1 {
		// The decisions of one policy go together, in the order they
		// came: a shape's script loads a policy's constants when the
		// policy changes from one decision to the next. Decisions of two
		// policies never share a key, so their order does not matter.
		order := make([]int, len(calls))
		for i := range order {
			order[i] = i
		}
		slices.SortStableFunc(order, func(a, b int) int { return index[a] - index[b] })
		sorted, sortedIndex := make([]*pending, len(calls)), make([]int, len(calls))
		for i, j := range order {
			sorted[i], sortedIndex[i] = calls[j], index[j]
		}
		calls, index = sorted, sortedIndex
	}
	m := manyCall{calls: calls, keys: calls[0].keys[:1]}
	if len(policies) > 1 {
		form |= formIndex
	}
	if slices.ContainsFunc(policies[0].Limits, func(l driver.Limit) bool { return l.Algorithm == driver.GCRA }) {
		form |= formMicros
	}
	m.args = make([]any, 0, nargs)
	m.args = append(m.args, calls[0].args[3], len(policies))
	for k := range policies {
		first := calls[slices.Index(index, k)]
		m.args = append(m.args, first.args[4:]...)
	}
	m.args = append(m.args, len(calls))
	if !compact {
		for i, p := range calls {
			m.args = append(m.args, index[i]+1, p.args[0], p.args[1], p.args[2], p.keys[0])
		}
		return m
	}
	m.args = append(m.args, form)
	for i, p := range calls {
		if form&formIndex != 0 {
			m.args = append(m.args, index[i]+1)
		}
		m.args = append(m.args, p.args[0])
		if form&formMicros != 0 {
			m.args = append(m.args, p.args[1])
		}
		if form&formCost != 0 {
			m.args = append(m.args, p.args[2])
		}
		m.args = append(m.args, p.keys[0])
	}
	return m
}

// The bits of a compact batch call's form (newManyCall).
const (
	formIndex  = 1 // each decision carries its policy's index
	formMicros = 2 // each decision carries now in µs
	formCost   = 4 // each decision carries its cost
)

// answerDecisions hands each decision of m its part of the reply. A
// server that lost its script cache gets the call again with the whole
// script.
func (bt *batcher) answerDecisions(ctx context.Context, m manyCall) {
	reply, err := m.cmd.Result()
	if err != nil && goredis.HasErrorPrefix(err, "NOSCRIPT") {
		reply, err = m.script.Run(ctx, bt.client, m.keys, m.args...).Result()
	}
	m.deliver(reply, err)
}

// deliver gives each decision of m its part of reply and wakes its caller.
// The reply is flat: each decision's elements (as many as a reply of its
// policy holds, replyLen) one after the other, or an error alone for a
// decision that failed (a foreign value under its key, a key the node does
// not serve), which fails that decision only. An error of the whole call,
// or a reply of another length, fails every decision of it.
func (m *manyCall) deliver(reply any, err error) {
	items, ok := reply.([]any)
	if err == nil {
		// the layout is checked whole before any caller is answered: a
		// reply that ends before the last decision's part fails them all
		pos, short := 0, !ok
		for _, p := range m.calls {
			if short = short || pos >= len(items); short {
				break
			}
			if _, isErr := items[pos].(error); isErr {
				pos++
			} else {
				pos += replyLen(p.policy)
			}
		}
		if short || pos != len(items) {
			err = fmt.Errorf("%w: a batch call answered %T of %d elements for %d decisions", ErrUnexpectedReply, reply, len(items), len(m.calls))
		}
	}
	pos := 0
	for _, p := range m.calls {
		switch {
		case err != nil:
			p.reply, p.err = nil, err
		default:
			if e, isErr := items[pos].(error); isErr {
				p.reply, p.err = nil, e
				pos++
			} else {
				k := replyLen(p.policy)
				p.reply, p.err = items[pos:pos+k:pos+k], nil
				pos += k
			}
		}
		p.done <- struct{}{}
	}
}
