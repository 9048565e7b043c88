package redisbackend

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

var (
	//go:embed layout2.lua
	layout2Source string
	//go:embed decide_layout2.lua
	decideLayout2Source string
	// decideLayout2Script decides on the strings of layouts 1 and 2 and the
	// hash of layout 3 together (Backend.Layout2Beside).
	decideLayout2Script = goredis.NewScript(withLayout2(decideLayout2Source))
)

// withLayout2 is withCommon with layout2.lua after common.lua: the reading
// of layout 2's strings, for the scripts that read them.
func withLayout2(script string) string {
	shebang, body, _ := strings.Cut(script, "\n")
	return withCommon(shebang + "\n" + layout2Source + body)
}

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
// old side of a rollout at 100 % never needs them. The upgrade reads the
// strings once per identifier and horizon, so it is for a deploy after the
// last process of the old release stopped; while they may still decide,
// deploy Layout2Beside instead.
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
	return driver.Errorf("throttlekit: redis: %w: the layout-2 view is read-only: it cannot %s", errors.ErrUnsupported, what)
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

// Layout2Beside returns the backend to deploy while processes of a release
// that kept layout 1 or 2 (one string per limit, Layout2Keys) may still
// decide on the same store: the first deploy of a rolling upgrade in which
// old and new processes serve the same identifiers together. keyLayout is
// the driver.KeyLayout of that release: 1 for releases whose unnamed limits
// were keyed by their notation (before key layout 2), 2 after.
//
// Its Decide counts where the old processes count and in the layout-3 hash
// at once, in one script call on the identifier's keys (decide_layout2.lua,
// one round trip, atomic, on a Cluster too since both layouts share the
// identifier's hash tag): it reads both, decides on what they hold
// together (the larger count of one window, the later window, the later
// GCRA TAT), and writes the result to both. The old processes see every
// unit it grants and it sees theirs, so while the versions overlap no
// window restarts and none grants twice.
//
// The next deploy, once no process of the old release runs (processes of
// this one may still), is rollout.Upgrade(b.Layout2(), b), or
// rollout.Upgrade(rollout.KeyLayoutV1(b.Layout2()), b) from key layout 1:
// the units the old processes granted last live in the strings alone, and
// Upgrade reads them once per identifier and horizon, while this backend
// keeps seeing what Upgrade's processes write to the hash. The Backend
// alone may follow one horizon (the policies' longest window, twice it for
// a sliding window) after the last old process stopped.
//
// It peeks with the same script (cost 0, nothing written) on the main
// client and takes with driver.TakeWith; Reset deletes both layouts' keys.
// It has no Refund (errors.ErrUnsupported: an old process could not see a
// refund of the hash alone).
//
// Any other keyLayout is an error wrapping driver.ErrInvalidOption.
func (b *Backend) Layout2Beside(keyLayout int) (driver.Backend, error) {
	if keyLayout != 1 && keyLayout != 2 {
		return nil, fmt.Errorf("%w: redis: Layout2Beside(%d): key layout 1 or 2", driver.ErrInvalidOption, keyLayout)
	}
	return &beside{b: b, keyV1: keyLayout == 1}, nil
}

// beside is the backend Layout2Beside returns.
type beside struct {
	b     *Backend
	keyV1 bool
}

var (
	_ driver.Peeker   = (*beside)(nil)
	_ driver.Taker    = (*beside)(nil)
	_ driver.Refunder = (*beside)(nil)
	_ driver.Resetter = (*beside)(nil)
	_ driver.Pinger   = (*beside)(nil)

	_ driver.LoggerSetter = (*beside)(nil)
)

// stringKeys returns the strings the old release keeps req's state in.
func (v *beside) stringKeys(p *driver.Policy, identifier string) []string {
	keys := v.b.Layout2Keys(p, identifier)
	if v.keyV1 {
		prefix := v.b.prefix + "{" + driver.EscapeKey(identifier) + "}:" + p.Key + ":"
		for i := range keys {
			keys[i] = prefix + driver.KeyV1(&p.Limits[i])
		}
	}
	return keys
}

func (v *beside) run(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	if err := v.b.ready(); err != nil {
		return driver.Outcome{}, err
	}
	if err := checkRequest(req); err != nil {
		return driver.Outcome{}, err
	}
	keys := append([]string{v.b.Key(req.Policy, req.Identifier)}, v.stringKeys(req.Policy, req.Identifier)...)
	reply, err := v.b.eval(ctx, v.b.client, decideLayout2Script, false, keys, v.b.scriptArgs(req), nil)
	if err != nil {
		return driver.Outcome{}, err
	}
	return parseReply(reply, req.Policy, false)
}

// Decide implements driver.Backend with one call of decide_layout2.lua.
func (v *beside) Decide(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	return v.run(ctx, req)
}

// Peek implements driver.Peeker: decide_layout2.lua with cost 0, which
// writes nothing.
func (v *beside) Peek(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	req.Cost = 0
	return v.run(ctx, req)
}

// Take implements driver.Taker with driver.TakeWith's rounds of a peek and
// a decision, each one script call.
func (v *beside) Take(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	return driver.TakeWith(ctx, besideDecider{v}, req)
}

// besideDecider is beside without Take, for driver.TakeWith.
type besideDecider struct{ v *beside }

func (d besideDecider) Decide(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	return d.v.Decide(ctx, req)
}

func (d besideDecider) Peek(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	return d.v.Peek(ctx, req)
}

// Refund implements driver.Refunder: it refuses (errors.ErrUnsupported).
func (v *beside) Refund(context.Context, driver.Request) (driver.Outcome, error) {
	return driver.Outcome{}, fmt.Errorf("throttlekit: redis: %w: the backend beside layout 2 cannot refund", errors.ErrUnsupported)
}

// Reset implements driver.Resetter: one DEL of the identifier's hash and
// strings under p.
func (v *beside) Reset(ctx context.Context, p *driver.Policy, identifier string) error {
	if err := v.b.ready(); err != nil {
		return err
	}
	if err := checkInput(p, identifier, 0); err != nil {
		return err
	}
	return v.b.del(ctx, append([]string{v.b.Key(p, identifier)}, v.stringKeys(p, identifier)...)...)
}

// Ping implements driver.Pinger: the store's Ping.
func (v *beside) Ping(ctx context.Context) error { return v.b.Ping(ctx) }

// SetLogger implements driver.LoggerSetter: the store's SetLogger.
func (v *beside) SetLogger(l *slog.Logger) { v.b.SetLogger(l) }

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
