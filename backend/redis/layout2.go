package redisbackend

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// Layout2 returns a read-only view of the store as layouts 1 and 2 kept it:
// one string per limit, "used:end" ("used:end:prev" for a sliding window),
// under the keys Layout2Keys names. It is the old side of the upgrade to
// layout 3, a split rollout at 100 % with seeding that reads each
// identifier's old state once and carries it into its hash:
//
//	store, err := rollout.Upgrade(b.Layout2(), b)
//
// A deployment whose keys still follow layout 1 (driver.KeyV1) reads them
// with rollout.KeyLayoutV1(b.Layout2()). The view peeks (with the read
// client, as Peek does), pings and resets; it never decides: Decide, Take,
// Refund and Seed fail with an error wrapping errors.ErrUnsupported, as the
// old side of a rollout at 100 % never needs them.
func (b *Backend) Layout2() driver.Backend { return layout2{b} }

// Layout2Keys returns the keys layouts 1 and 2 kept identifier's state
// under p in, one string per limit in the policy's order:
//
//	<prefix>{<escaped identifier>}:<p.Key>:<p.Limits[i].Key>
//
// They share the layout-3 key's hash tag, and none of them equals a
// layout-3 key or a lease key. A nil policy has no keys, and neither has a
// nil *Backend.
func (b *Backend) Layout2Keys(p *driver.Policy, identifier string) []string {
	if b == nil || p == nil {
		return nil
	}
	id := driver.EscapeKey(identifier)
	keys := make([]string, len(p.Limits))
	for i := range keys {
		keys[i] = b.prefix + "{" + id + "}:" + p.Key + ":" + p.Limits[i].Key
	}
	return keys
}

// layout2 is the read-only view Layout2 returns.
type layout2 struct{ b *Backend }

var (
	_ driver.Peeker   = layout2{}
	_ driver.Resetter = layout2{}
	_ driver.Pinger   = layout2{}

	_ driver.LoggerSetter = layout2{}
)

func (layout2) refuse(what string) error {
	return fmt.Errorf("throttlekit: redis: %w: the layout-2 view is read-only: it cannot %s", errors.ErrUnsupported, what)
}

// Decide implements driver.Backend: it refuses (errors.ErrUnsupported).
func (v layout2) Decide(context.Context, driver.Request) (driver.Outcome, error) {
	return driver.Outcome{}, v.refuse("decide")
}

// Peek implements driver.Peeker with one call of the read-only
// peek_layout2.lua on the read client.
func (v layout2) Peek(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	if err := v.b.ready(); err != nil {
		return driver.Outcome{}, err
	}
	if err := checkRequest(req); err != nil {
		return driver.Outcome{}, err
	}
	keys := v.b.Layout2Keys(req.Policy, req.Identifier)
	reply, err := v.b.eval(ctx, v.b.reader, peekLayout2Script, true, keys, v.b.scriptArgs(req), nil)
	if err != nil {
		return driver.Outcome{}, err
	}
	return parseReply(reply, req.Policy, false)
}

// Reset implements driver.Resetter: one DEL of the identifier's layout-2
// keys under p.
func (v layout2) Reset(ctx context.Context, p *driver.Policy, identifier string) error {
	if err := v.b.ready(); err != nil {
		return err
	}
	if err := checkInput(p, identifier, 0); err != nil {
		return err
	}
	return v.b.del(ctx, v.b.Layout2Keys(p, identifier)...)
}

// Ping implements driver.Pinger: the store's Ping.
func (v layout2) Ping(ctx context.Context) error { return v.b.Ping(ctx) }

// SetLogger implements driver.LoggerSetter: the store's SetLogger.
func (v layout2) SetLogger(l *slog.Logger) {
	if v.b != nil {
		v.b.SetLogger(l)
	}
}

// Fields returns the fields of the layout-3 hash (see Key) that hold l's
// state, End's first: for a limit of key K, eK and uK, then pK for a
// sliding window; a GCRA limit has eK alone, as its Used is always 0. A nil
// limit has none.
func Fields(l *driver.Limit) []string {
	if l == nil {
		return nil
	}
	switch l.Algorithm {
	case driver.GCRA:
		return []string{"e" + l.Key}
	case driver.SlidingWindow:
		return []string{"e" + l.Key, "u" + l.Key, "p" + l.Key}
	}
	return []string{"e" + l.Key, "u" + l.Key}
}
