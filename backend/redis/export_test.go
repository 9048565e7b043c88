package redisbackend

import (
	"context"
	"slices"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// ParseReply exposes parseReply to the external tests, which feed it the
// replies a proxy or an incompatible server might send.
var ParseReply = parseReply

// Detached reports whether the backend enforces the caller's context itself
// for c, running each command on a goroutine of its own.
func Detached(c Client) bool { return newConn(c).detached }

// IsBatchHash reports whether hash is the SHA1 of a batch decision
// script the backend sent: decide_many.lua or a shape's.
func IsBatchHash(hash string) bool {
	found := false
	manyScripts.Range(func(_, many any) bool {
		found = many.(*goredis.Script).Hash() == hash
		return !found
	})
	return found
}

// DecideMany decides reqs with one call of the generic decide_many.lua,
// laid out and read as WithBatching lays out a batch, and returns each
// decision's outcome or error.
func (b *Backend) DecideMany(ctx context.Context, reqs []driver.Request) ([]driver.Outcome, []error, error) {
	return b.decideMany(ctx, reqs, false)
}

// DecideManyShaped is DecideMany with the batch scripts WithBatching
// sends: one call per shape of the requests' policies, in the order the
// shapes first appear.
func (b *Backend) DecideManyShaped(ctx context.Context, reqs []driver.Request) ([]driver.Outcome, []error, error) {
	return b.decideMany(ctx, reqs, true)
}

// DecideGeneric decides req with one call of the generic decide.lua.
func (b *Backend) DecideGeneric(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	reply, err := b.eval(ctx, b.client, decideScript, false, []string{b.Key(req.Policy, req.Identifier)}, b.scriptArgs(req), nil)
	if err != nil {
		return driver.Outcome{}, err
	}
	return parseReply(reply, req.Policy, false)
}

func (b *Backend) decideMany(ctx context.Context, reqs []driver.Request, shaped bool) ([]driver.Outcome, []error, error) {
	calls := make([]*pending, len(reqs))
	var scripts []*goredis.Script
	for i, req := range reqs {
		script := decideScript
		if shaped {
			script = decideScriptFor(req.Policy)
		}
		if !slices.Contains(scripts, script) {
			scripts = append(scripts, script)
		}
		calls[i] = &pending{script: script, keys: []string{b.Key(req.Policy, req.Identifier)}, args: b.scriptArgs(req),
			policy: req.Policy, done: make(chan struct{}, 1)}
	}
	for _, lone := range scripts {
		var group []*pending
		for _, p := range calls {
			if p.script == lone {
				group = append(group, p)
			}
		}
		m := newManyCall(group, lone != decideScript)
		reply, err := manyFor(lone).Run(ctx, b.client.Client, m.keys, m.args...).Result()
		if err != nil {
			return nil, nil, err
		}
		m.deliver(reply, nil)
	}
	outs := make([]driver.Outcome, len(reqs))
	errs := make([]error, len(reqs))
	for i, p := range calls {
		if p.err != nil {
			errs[i] = classify(p.err)
			continue
		}
		outs[i], errs[i] = parseReply(p.reply, reqs[i].Policy, false)
	}
	return outs, errs, nil
}

// ParseSeedReply exposes parseSeedReply to the external tests.
var ParseSeedReply = parseSeedReply

// ScriptBody returns what Redis runs for a decision under p, lone or in a
// batch when many is set, without the shebang line, for BenchmarkScriptBody
// to run in a loop: p's shape's script, or the generic decide.lua or
// decide_many.lua (common.lua spliced in) when generic is set.
func ScriptBody(many, generic bool, p *driver.Policy) string {
	var script string
	switch {
	case generic && many:
		script = withCommon(decideManySource)
	case generic:
		script = withCommon(decideSource)
	case many:
		script, _ = renderShape(p, true)
	default:
		script, _ = renderShape(p, false)
	}
	_, body, _ := strings.Cut(script, "\n")
	return body
}

// ScriptArgs is the ARGV of decide.lua for req.
func (b *Backend) ScriptArgs(req driver.Request) []any { return b.scriptArgs(req) }

// ClusterResent is the number of calls the Cluster batcher of b's main
// client sent again after their node turned them away (a redirect, a key
// the node does not serve), or -1 when the client is not batched per node.
func (b *Backend) ClusterResent() int64 {
	if cb, ok := b.client.batch.(*clusterBatcher); ok {
		return cb.resent.Load()
	}
	return -1
}
