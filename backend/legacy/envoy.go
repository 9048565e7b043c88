package legacybackend

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// EnvoyRedis is a backend over the Redis counters of envoy ratelimit
// (github.com/envoyproxy/ratelimit, its fixed-window Redis cache): one
// string key per descriptor and window, named
//
//	<prefix><identifier>_<window start in Unix seconds>
//
// raised with INCRBY and given the unit's length as a TTL with EXPIRE on
// every hit. The identifier is envoy's key without its prefix and its
// window start: the domain and each entry's key and value, joined by "_"
// ("rl_remote_address_10.0.0.1"). It feeds every AlignedWindow limit of a
// policy whose window is one of envoy's units (a second, minute, hour, day,
// week, 30 days or 365 days), each from the key of its own unit's window,
// and gives every other limit the zero State. See the package
// documentation, "envoy ratelimit".
//
// It implements driver.Backend, driver.Peeker, driver.Pinger,
// driver.Seeder and driver.LoggerSetter. Built without Deciding it never
// writes: Decide answers cost 0 only, and Seed is unsupported. With
// Deciding it counts in envoy's keys as envoy does, so that envoy
// ratelimit processes and throttlekit processes count together. It is safe
// for concurrent use.
type EnvoyRedis struct {
	reader
	client   goredis.UniversalClient
	prefix   string
	deciding bool
}

var (
	_ driver.Backend = (*EnvoyRedis)(nil)
	_ driver.Peeker  = (*EnvoyRedis)(nil)
	_ driver.Pinger  = (*EnvoyRedis)(nil)
	_ driver.Seeder  = (*EnvoyRedis)(nil)

	_ driver.LoggerSetter = (*EnvoyRedis)(nil)
)

// envoyPrefixOption is WithEnvoyPrefix. NewEnvoyRedis takes it out of the
// options before the others are applied; given to any other constructor,
// its apply refuses it.
type envoyPrefixOption struct{ prefix string }

func (envoyPrefixOption) apply(*options) error {
	return driver.Errorf("%w: legacy: WithEnvoyPrefix applies to NewEnvoyRedis only", driver.ErrInvalidOption)
}

// WithEnvoyPrefix sets the prefix envoy ratelimit puts before every key:
// its CACHE_KEY_PREFIX setting, "" (the default) unless the deployment set
// one. NewEnvoyRedis only.
func WithEnvoyPrefix(prefix string) Option { return envoyPrefixOption{prefix: prefix} }

// NewEnvoyRedis returns a backend over envoy ratelimit's counters in client
// (a standalone, Sentinel or Cluster client): read-only unless Deciding is
// given. Options: WithEnvoyPrefix, Deciding, WithLogger. The key is
// envoy's, raw (never escaped nor hashed), so WithKeyFunc and WithMatcher
// do not apply, nor do WithWindow, WithNoTTLWindow or WithResetMillis. The
// client stays the caller's. The error wraps driver.ErrInvalidOption.
func NewEnvoyRedis(client goredis.UniversalClient, opts ...Option) (*EnvoyRedis, error) {
	if isNilClient(client) {
		return nil, driver.Errorf("%w: legacy: nil redis client", driver.ErrInvalidOption)
	}
	var prefix string
	rest := make([]Option, 0, len(opts))
	for _, opt := range opts {
		if po, ok := opt.(envoyPrefixOption); ok {
			prefix = po.prefix
			continue
		}
		rest = append(rest, opt)
	}
	o, err := buildOptions("NewEnvoyRedis", rest, "WithKeyFunc", "WithMatcher", "WithResetMillis", "WithWindow", "WithNoTTLWindow")
	if err != nil {
		return nil, err
	}
	e := &EnvoyRedis{
		reader:   reader{name: "envoy redis", key: o.key, match: MatchWindow(0)},
		client:   client,
		prefix:   prefix,
		deciding: o.deciding,
	}
	e.initLog(o)
	return e, nil
}

// ready reports an EnvoyRedis that NewEnvoyRedis did not build.
func (e *EnvoyRedis) ready() error {
	if e == nil || e.client == nil {
		return driver.Errorf("%w: legacy: EnvoyRedis not built by NewEnvoyRedis", driver.ErrNotInitialized)
	}
	return nil
}

// Stats returns the backend's counters (zero for one NewEnvoyRedis did not
// build). Contended stays 0: envoy's counters are raised, never replaced,
// so no write of this backend can lose a race.
func (e *EnvoyRedis) Stats() Stats {
	if e.ready() != nil {
		return Stats{}
	}
	return e.stats.snapshot()
}

// SetLogger implements driver.LoggerSetter: warnings go to l (nil: none),
// unless WithLogger chose a logger.
func (e *EnvoyRedis) SetLogger(l *slog.Logger) {
	if e.ready() == nil {
		e.setLogger(l)
	}
}

// envoyDivider returns the length in seconds of the envoy unit whose window
// is l's, and whether l is an AlignedWindow limit of such a window: only
// those read the same windows as envoy's keys.
func envoyDivider(l *driver.Limit) (int64, bool) {
	if l.Algorithm != driver.AlignedWindow {
		return 0, false
	}
	switch s := l.WindowMillis / 1000; {
	case l.WindowMillis%1000 != 0:
		return 0, false
	case s == 1, s == 60, s == 3600, s == 86400, s == 7*86400, s == 30*86400, s == 365*86400:
		return s, true
	}
	return 0, false
}

// envoyCounter is one envoy key a call reads or writes.
type envoyCounter struct {
	key string
	// ttl is the EXPIRE a write gives the key, in seconds: the longest
	// unit among the limits counted under it.
	ttl int64
}

// envoyPlan says which envoy keys hold a policy's limits at one instant.
type envoyPlan struct {
	counters []envoyCounter
	// of holds, per limit, the index in counters of its key, -1 for a
	// limit envoy does not count.
	of []int
	// ends holds, per fed limit, the end of its window in Unix
	// milliseconds.
	ends []int64
	// fed is how many limits have a key.
	fed int
}

// plan returns the keys of identifier's windows of p at now. Two units
// whose windows start at the same second (a minute and an hour at the top
// of an hour) name the same key: it is one counter of the requests since
// that second, which both limits read and a decision raises once.
func (e *EnvoyRedis) plan(p *driver.Policy, identifier string, now time.Time) envoyPlan {
	pl := envoyPlan{of: make([]int, len(p.Limits)), ends: make([]int64, len(p.Limits))}
	sec := now.Unix() // now is never before the epoch: the floor
	for i := range p.Limits {
		pl.of[i] = -1
		div, ok := envoyDivider(&p.Limits[i])
		if !ok {
			continue
		}
		start := sec / div * div
		pl.ends[i] = (start + div) * 1000
		key := e.envoyKey(identifier, start)
		c := -1
		for j := range pl.counters {
			if pl.counters[j].key == key {
				c = j
				break
			}
		}
		if c < 0 {
			c = len(pl.counters)
			pl.counters = append(pl.counters, envoyCounter{key: key})
		}
		pl.counters[c].ttl = max(pl.counters[c].ttl, div)
		pl.of[i] = c
		pl.fed++
	}
	return pl
}

// envoyKey returns envoy's key of identifier's window starting at start
// (Unix seconds).
func (e *EnvoyRedis) envoyKey(identifier string, start int64) string {
	var b strings.Builder
	b.Grow(len(e.prefix) + len(identifier) + 12)
	b.WriteString(e.prefix)
	b.WriteString(identifier)
	b.WriteByte('_')
	b.WriteString(strconv.FormatInt(start, 10))
	return b.String()
}

// envoyState returns the state of limit l whose key holds count at nowMs,
// in the window ending at endMs. A count above Max (envoy counts denied
// hits) is reported as Max: its remaining is 0 either way, as envoy says.
func envoyState(l *driver.Limit, count, endMs, nowMs int64) driver.State {
	s := window(count, endMs, nowMs)
	s.Used = min(s.Used, l.Max)
	return s
}

// states fills the outcome's states from the counts of pl's keys.
func (e *EnvoyRedis) states(req driver.Request, pl envoyPlan, counts []int64) []driver.State {
	states := req.States()[:len(req.Policy.Limits)]
	clear(states)
	nowMs := req.Now.UnixMilli()
	for i, c := range pl.of {
		if c >= 0 {
			states[i] = envoyState(&req.Policy.Limits[i], counts[c], pl.ends[i], nowMs)
		}
	}
	return states
}

// Decide implements driver.Backend. Cost 0 is Peek. Without Deciding any
// other cost returns an error wrapping errors.ErrUnsupported, never a
// verdict. With Deciding it decides as envoy ratelimit does (see the
// package documentation, "envoy ratelimit"): each limit's key is raised by
// the cost with INCRBY and given its unit as a TTL with EXPIRE, denied or
// not, and the request is allowed when every count after it is at most its
// limit's Max. A policy with a limit envoy does not count (another
// algorithm or window) gives an error wrapping errors.ErrUnsupported.
func (e *EnvoyRedis) Decide(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	if err := e.ready(); err != nil {
		return driver.Outcome{}, err
	}
	if req.Cost == 0 {
		return e.Peek(ctx, req)
	}
	if !e.deciding {
		return driver.Outcome{}, e.refuse(req)
	}
	pl, err := e.writable(ctx, req, nil)
	if err != nil {
		return driver.Outcome{}, err
	}
	after, opened, err := e.incr(ctx, pl, req.Cost)
	if err != nil {
		return driver.Outcome{}, err
	}
	e.stats.decided.Add(1)
	if opened {
		e.stats.opened.Add(1)
	}
	states := e.states(req, pl, after)
	return driver.Outcome{Allowed: e.within(req.Policy, pl, after), States: states}, nil
}

// within reports that every fed limit's count is at most its Max.
func (e *EnvoyRedis) within(p *driver.Policy, pl envoyPlan, counts []int64) bool {
	for i, c := range pl.of {
		if c >= 0 && counts[c] > p.Limits[i].Max {
			return false
		}
	}
	return true
}

// writable runs the checks Decide and Seed share before any round trip
// and returns the policy's keys: every limit must be one envoy counts,
// since the others could not be counted while envoy processes, which
// never count them, serve beside this one.
func (e *EnvoyRedis) writable(ctx context.Context, req driver.Request, given []driver.State) (envoyPlan, error) {
	if err := e.check(ctx, req); err != nil {
		return envoyPlan{}, err
	}
	if given != nil {
		if err := driver.CheckGiven(req.Policy, given); err != nil {
			return envoyPlan{}, err
		}
		for i, g := range given {
			if g.Used > maxSeedCount {
				return envoyPlan{}, driver.Errorf("%w: legacy: envoy redis: given count %d of limit %q is above 2^53", driver.ErrInvalidState, g.Used, req.Policy.Limits[i].Name)
			}
		}
	}
	if req.Cost < 0 {
		return envoyPlan{}, driver.Errorf("%w: legacy: negative cost %d", driver.ErrInvalidOption, req.Cost)
	}
	pl := e.plan(req.Policy, req.Identifier, req.Now)
	if pl.fed != len(req.Policy.Limits) {
		for i, c := range pl.of {
			if c < 0 {
				l := &req.Policy.Limits[i]
				return envoyPlan{}, driver.Errorf("%w: legacy: envoy redis: policy %q, limit %q (%v, %v): envoy ratelimit counts only aligned windows of its units (1s, 1m, 1h, 24h, 7d, 30d, 365d); a deciding backend decides only policies it holds whole",
					errors.ErrUnsupported, req.Policy.Name, l.Name, l.Algorithm, l.Window)
			}
		}
	}
	return pl, nil
}

// maxSeedCount is the largest count Seed takes: every count stays exact in
// the Lua script's doubles.
const maxSeedCount = int64(1) << 53

// Peek implements driver.Peeker: one GET per key of the policy's fed
// limits (one key per distinct window start), pipelined in one round trip
// (with a Cluster client, one per primary holding a key). Each fed limit
// holds State{Used: count, End: end of its envoy window in Unix
// milliseconds}, Used at most Max; every other limit, and a fed one whose
// key is missing or holds 0 or less, holds the zero State. A value that is
// not a decimal integer, or a key of another type, is an error wrapping
// driver.ErrBadReply. A policy with no fed limit costs no round trip, is
// counted in Stats.Unmatched and logged once.
func (e *EnvoyRedis) Peek(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	if err := e.ready(); err != nil {
		return driver.Outcome{}, err
	}
	if err := e.check(ctx, req); err != nil {
		return driver.Outcome{}, err
	}
	pl := e.plan(req.Policy, req.Identifier, req.Now)
	if pl.fed == 0 {
		e.unmatchedEnvoy(req.Policy)
		return e.outcome(req, -1, driver.State{}), nil
	}
	counts, err := e.read(ctx, pl)
	if err != nil {
		return driver.Outcome{}, err
	}
	states := e.states(req, pl, counts)
	for _, s := range states {
		if s != (driver.State{}) {
			e.stats.found.Add(1)
			break
		}
	}
	return driver.Outcome{Allowed: driver.Decide(req.Policy, req.Now, 0, states), States: states}, nil
}

// unmatchedEnvoy counts a peek for a policy none of whose limits envoy
// counts, and warns once per policy name.
func (e *EnvoyRedis) unmatchedEnvoy(p *driver.Policy) {
	e.stats.unmatched.Add(1)
	if _, seen := e.warned.Load(p.Name); seen || e.warnedN.Load() >= maxWarnedPolicies {
		return
	}
	if _, seen := e.warned.LoadOrStore(p.Name, struct{}{}); seen {
		return
	}
	e.warnedN.Add(1)
	limits := make([]string, 0, len(p.Limits))
	for i := range p.Limits {
		limits = append(limits, p.Limits[i].Name)
	}
	e.log.Load().Warn("throttlekit: legacy: no limit of the policy is an aligned window of an envoy ratelimit unit: its envoy windows are not carried; write its limits with \"aligned\" and envoy's unit (1s, 1m, 1h, 1d, 7d, 30d, 365d)",
		slog.String("backend", e.name), slog.String("policy", p.Name), slog.Any("limits", limits))
}

// read returns the counts of pl's keys, 0 for a missing key, in one
// pipelined round trip.
func (e *EnvoyRedis) read(ctx context.Context, pl envoyPlan) ([]int64, error) {
	e.stats.reads.Add(1)
	cmds, err := await(ctx, func() ([]*goredis.StringCmd, error) {
		cmds := make([]*goredis.StringCmd, len(pl.counters))
		// Each command carries its own error, checked below; a missing key's
		// goredis.Nil makes Pipelined's error useless here.
		_, _ = e.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
			for i, c := range pl.counters {
				cmds[i] = p.Get(ctx, c.key)
			}
			return nil
		})
		return cmds, nil
	})
	if err != nil {
		return nil, driver.Errorf("throttlekit: legacy: envoy redis: get: %w", err)
	}
	counts := make([]int64, len(cmds))
	for i, cmd := range cmds {
		key := pl.counters[i].key
		v, err := cmd.Result()
		switch {
		case errors.Is(err, goredis.Nil):
			continue
		case isWrongType(err):
			return nil, e.badReply("key %q is not a string counter: %v", key, err)
		case err != nil:
			return nil, driver.Errorf("throttlekit: legacy: envoy redis: get %q: %w", key, err)
		}
		n, ok := parseEnvoyCount(v)
		if !ok {
			return nil, e.badReply("counter %q holds %q, not a decimal count", key, v)
		}
		counts[i] = n
	}
	return counts, nil
}

// parseEnvoyCount reads a count as Redis holds one: a decimal integer with
// nothing around it (INCRBY refuses anything else).
func parseEnvoyCount(v string) (int64, bool) {
	if v == "" || strings.TrimSpace(v) != v {
		return 0, false
	}
	return parseCount(v)
}

// isNotInteger reports the server's refusal to INCRBY a value that is not
// a 64-bit decimal integer (or the same refusal from envoySeedScript).
func isNotInteger(err error) bool {
	var re goredis.Error
	return errors.As(err, &re) && strings.Contains(re.Error(), "not an integer")
}

// incr raises each of pl's keys by cost and gives it its TTL, as envoy
// ratelimit does on a hit: INCRBY then EXPIRE, pipelined in one round
// trip. It returns the counts after, and whether one of them was opened
// by this call (its count is the cost).
func (e *EnvoyRedis) incr(ctx context.Context, pl envoyPlan, cost int64) ([]int64, bool, error) {
	type cmdPair struct {
		incr   *goredis.IntCmd
		expire *goredis.BoolCmd
	}
	cmds, err := await(ctx, func() ([]cmdPair, error) {
		cmds := make([]cmdPair, len(pl.counters))
		_, _ = e.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
			for i, c := range pl.counters {
				cmds[i].incr = p.IncrBy(ctx, c.key, cost)
				cmds[i].expire = p.Expire(ctx, c.key, time.Duration(c.ttl)*time.Second)
			}
			return nil
		})
		return cmds, nil
	})
	if err != nil {
		return nil, false, driver.Errorf("throttlekit: legacy: envoy redis: incrby: %w", err)
	}
	counts := make([]int64, len(cmds))
	opened := false
	for i, cmd := range cmds {
		key := pl.counters[i].key
		n, err := cmd.incr.Result()
		switch {
		case isWrongType(err) || isNotInteger(err):
			return nil, false, e.badReply("cannot count in %q: %v", key, err)
		case err != nil:
			return nil, false, driver.Errorf("throttlekit: legacy: envoy redis: incrby %q: %w", key, err)
		}
		if err := cmd.expire.Err(); err != nil {
			return nil, false, driver.Errorf("throttlekit: legacy: envoy redis: expire %q: %w", key, err)
		}
		counts[i] = n
		opened = opened || n == cost
	}
	return counts, opened, nil
}

// envoySeedScript merges a count into one envoy key and then counts a cost
// in it, atomically: the key's count becomes the larger of its own and
// ARGV[1], then ARGV[2] is added with INCRBY; when either changed the key,
// it gets the TTL ARGV[3] (seconds), as a hit gives it. It returns the
// value before and after, nil for a missing key. A value that is no
// decimal integer is refused before anything is written.
var envoySeedScript = goredis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and not string.match(v, '^%-?%d+$') then
  return redis.error_reply('ERR value is not an integer or out of range')
end
local changed = false
local given = tonumber(ARGV[1])
if given > 0 and (not v or given > tonumber(v)) then
  redis.call('SET', KEYS[1], ARGV[1])
  changed = true
end
if ARGV[2] ~= '0' then
  redis.call('INCRBY', KEYS[1], ARGV[2])
  changed = true
end
if changed then
  redis.call('EXPIRE', KEYS[1], ARGV[3])
end
return {v or false, redis.call('GET', KEYS[1]) or false}
`)

// Seed implements driver.Seeder for a Deciding EnvoyRedis (without
// Deciding: an error wrapping errors.ErrUnsupported). Per key of the
// policy, one script sets the count to the larger of the stored one and
// the given state's Used, when that state is in force at req.Now and is
// the same envoy window (same End); a given window with another end
// (written on a clock a window apart from this one) cannot be held in the
// key of the window now falls in, and is ignored. The script then counts
// req.Cost in the key as Decide does (denied or not) and gives it its
// unit's TTL. The scripts of one call are pipelined in one round trip;
// each is atomic on its key, and a policy's keys are not written together
// (see the package documentation). Outcome.Prior holds the states read
// before the step; Allowed is Decide's verdict for a cost above 0, and for
// a cost of 0 what driver.Decide says of the states after the merge.
func (e *EnvoyRedis) Seed(ctx context.Context, req driver.Request, given []driver.State) (driver.Outcome, error) {
	if err := e.ready(); err != nil {
		return driver.Outcome{}, err
	}
	if !e.deciding {
		return driver.Outcome{}, driver.Errorf("%w: legacy: envoy redis: read-only (no Deciding): cannot take states", errors.ErrUnsupported)
	}
	if given == nil {
		given = []driver.State{}
	}
	pl, err := e.writable(ctx, req, given)
	if err != nil {
		return driver.Outcome{}, err
	}
	p := req.Policy
	floors := make([]int64, len(pl.counters))
	for i, c := range pl.of {
		g := driver.InForce(&p.Limits[i], given[i], req.Now)
		if g != (driver.State{}) && g.End == pl.ends[i] {
			floors[c] = max(floors[c], g.Used)
		}
	}
	prior, after, err := e.seed(ctx, pl, floors, req.Cost)
	if err != nil {
		return driver.Outcome{}, err
	}
	for c, f := range floors {
		if f > max(prior[c], 0) {
			e.stats.seeded.Add(1)
			break
		}
	}
	priorStates := e.states(driver.Request{Policy: p, Now: req.Now}, pl, prior)
	states := e.states(req, pl, after)
	var allowed bool
	if req.Cost > 0 {
		e.stats.decided.Add(1)
		allowed = e.within(p, pl, after)
	} else {
		allowed = driver.Decide(p, req.Now, 0, states)
	}
	return driver.Outcome{Allowed: allowed, States: states, Prior: priorStates}, nil
}

// seed runs envoySeedScript on each of pl's keys in one pipelined round
// trip (a second one, with the script's text, on a server that did not
// know the script yet), and returns the counts before and after.
func (e *EnvoyRedis) seed(ctx context.Context, pl envoyPlan, floors []int64, cost int64) (prior, after []int64, err error) {
	args := func(c int) []any {
		return []any{strconv.FormatInt(floors[c], 10), strconv.FormatInt(cost, 10), strconv.FormatInt(pl.counters[c].ttl, 10)}
	}
	cmds, err := await(ctx, func() ([]*goredis.Cmd, error) {
		cmds := make([]*goredis.Cmd, len(pl.counters))
		_, _ = e.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
			for i, c := range pl.counters {
				cmds[i] = envoySeedScript.EvalSha(ctx, p, []string{c.key}, args(i)...)
			}
			return nil
		})
		var missing []int
		for i, cmd := range cmds {
			if goredis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
				missing = append(missing, i)
			}
		}
		if len(missing) > 0 {
			// NOSCRIPT: the script did not run, so running it now counts once.
			_, _ = e.client.Pipelined(ctx, func(p goredis.Pipeliner) error {
				for _, i := range missing {
					cmds[i] = envoySeedScript.Eval(ctx, p, []string{pl.counters[i].key}, args(i)...)
				}
				return nil
			})
		}
		return cmds, nil
	})
	if err != nil {
		return nil, nil, driver.Errorf("throttlekit: legacy: envoy redis: seed: %w", err)
	}
	prior, after = make([]int64, len(cmds)), make([]int64, len(cmds))
	for i, cmd := range cmds {
		key := pl.counters[i].key
		reply, err := cmd.Slice()
		switch {
		case isWrongType(err) || isNotInteger(err):
			return nil, nil, e.badReply("cannot count in %q: %v", key, err)
		case err != nil:
			return nil, nil, driver.Errorf("throttlekit: legacy: envoy redis: seed %q: %w", key, err)
		case len(reply) != 2:
			return nil, nil, e.badReply("seeding %q: script replied %v", key, reply)
		}
		for j, dst := range []*int64{&prior[i], &after[i]} {
			if reply[j] == nil {
				continue
			}
			s, ok := reply[j].(string)
			var n int64
			if ok {
				n, ok = parseEnvoyCount(s)
			}
			if !ok {
				return nil, nil, e.badReply("seeding %q: script replied %v", key, reply)
			}
			*dst = n
		}
	}
	return prior, after, nil
}

// Ping implements driver.Pinger: the server answers, or with a Cluster
// client every primary does, which is where envoy's keys are.
func (e *EnvoyRedis) Ping(ctx context.Context) error {
	if err := e.ready(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	_, err := await(ctx, func() (struct{}, error) {
		if cc, ok := e.client.(*goredis.ClusterClient); ok {
			return struct{}{}, cc.ForEachMaster(ctx, func(ctx context.Context, node *goredis.Client) error {
				return node.Ping(ctx).Err()
			})
		}
		return struct{}{}, e.client.Ping(ctx).Err()
	})
	if err != nil {
		return driver.Errorf("throttlekit: legacy: envoy redis: ping: %w", err)
	}
	return nil
}
