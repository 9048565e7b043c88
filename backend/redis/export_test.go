package redisbackend

import (
	"context"
	"strings"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// ParseReply exposes parseReply to the external tests, which feed it the
// replies a proxy or an incompatible server might send.
var ParseReply = parseReply

// Detached reports whether the backend enforces the caller's context itself
// for c, running each command on a goroutine of its own.
func Detached(c Client) bool { return newConn(c).detached }

// DecideManyHash is the SHA1 of decide_many.lua as the backend sends it.
var DecideManyHash = decideManyScript.Hash()

// DecideMany decides reqs with one call of decide_many.lua, laid out and
// read as WithBatching does on a standalone client, and returns each
// decision's outcome or error.
func (b *Backend) DecideMany(ctx context.Context, reqs []driver.Request) ([]driver.Outcome, []error, error) {
	calls := make([]*pending, len(reqs))
	for i, req := range reqs {
		calls[i] = &pending{keys: []string{b.Key(req.Policy, req.Identifier)}, args: b.scriptArgs(req), policy: req.Policy,
			done: make(chan struct{}, 1)}
	}
	m := newManyCall(calls)
	reply, err := decideManyScript.Run(ctx, b.client.Client, m.keys, m.args...).Result()
	if err != nil {
		return nil, nil, err
	}
	m.deliver(reply, nil)
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

// ScriptBody returns what Redis runs for decide.lua, or for decide_many.lua
// when many is set, common.lua spliced in, without the shebang line, for
// BenchmarkScriptBody to run in a loop.
func ScriptBody(many bool) string {
	script := withCommon(decideSource)
	if many {
		script = withCommon(decideManySource)
	}
	_, body, _ := strings.Cut(script, "\n")
	return body
}

// ScriptArgs is the ARGV of decide.lua for req.
func (b *Backend) ScriptArgs(req driver.Request) []any { return b.scriptArgs(req) }
