package legacybackend

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"strconv"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// Redis reads the counters of a hand-written Redis limiter: a counter key
// raised with INCR and given its window's length as a TTL with EXPIRE
// (or PEXPIRE) when it was created. It implements driver.Backend,
// driver.Peeker, driver.Pinger, driver.Seeder and driver.LoggerSetter.
// Built with Deciding, it also decides and takes states in that layout
// (see the package documentation, "Deciding on Redis"); otherwise it
// never writes. It is safe for concurrent use.
type Redis struct {
	reader
	client   goredis.UniversalClient
	noTTL    time.Duration
	deciding bool
}

var (
	_ driver.Backend = (*Redis)(nil)
	_ driver.Peeker  = (*Redis)(nil)
	_ driver.Pinger  = (*Redis)(nil)
	_ driver.Seeder  = (*Redis)(nil)

	_ driver.LoggerSetter = (*Redis)(nil)
)

// NewRedis returns a backend over the legacy counters client holds (a
// standalone, Sentinel or Cluster client): read-only unless Deciding is
// given, which needs WithWindow and Redis 7.0 or later. Options:
// WithKeyFunc, WithMatcher, WithWindow, WithNoTTLWindow, Deciding,
// WithLogger. The client stays the caller's. The error wraps
// driver.ErrInvalidOption.
func NewRedis(client goredis.UniversalClient, opts ...Option) (*Redis, error) {
	if isNilClient(client) {
		return nil, driver.Errorf("%w: legacy: nil redis client", driver.ErrInvalidOption)
	}
	o, err := buildOptions("NewRedis", opts, "WithResetMillis")
	if err != nil {
		return nil, err
	}
	if o.deciding && !o.set["WithWindow"] {
		return nil, driver.Errorf("%w: legacy: NewRedis with Deciding needs WithWindow: the TTL the legacy code gives a new counter with EXPIRE", driver.ErrInvalidOption)
	}
	if o.match == nil {
		o.match = MatchWindow(o.window)
	}
	r := &Redis{reader: reader{name: "redis", window: o.window, key: o.key, match: o.match}, client: client, noTTL: o.noTTL, deciding: o.deciding}
	r.initLog(o)
	return r, nil
}

// SetLogger implements driver.LoggerSetter: warnings go to l (nil: none),
// unless WithLogger chose a logger.
func (r *Redis) SetLogger(l *slog.Logger) {
	if r.ready() == nil {
		r.setLogger(l)
	}
}

// isNilClient reports a nil client, including a nil pointer in the
// interface.
func isNilClient(c goredis.UniversalClient) bool {
	if c == nil {
		return true
	}
	v := reflect.ValueOf(c)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// ready reports a Redis that NewRedis did not build.
func (r *Redis) ready() error {
	if r == nil || r.client == nil || r.key == nil || r.match == nil {
		return driver.Errorf("%w: legacy: Redis not built by NewRedis", driver.ErrNotInitialized)
	}
	return nil
}

// Stats returns the backend's counters (zero for one NewRedis did not
// build).
func (r *Redis) Stats() Stats {
	if r.ready() != nil {
		return Stats{}
	}
	return r.stats.snapshot()
}

// Decide implements driver.Backend. Cost 0 is Peek. Without Deciding any
// other cost returns an error wrapping errors.ErrUnsupported, never a
// verdict, since the legacy store is read-only. With Deciding it decides
// as the hand-written limiter does, in one script (see the package
// documentation, "Deciding on Redis"): INCRBY of the cost, denied or not,
// and PEXPIRE of the window when that created the counter; the request is
// allowed when the count after it is at most the limit's Max, and the
// window ends at the counter's PEXPIRETIME. A policy the legacy counter
// cannot hold alone (none of its limits matches, or it has other limits)
// gives an error wrapping errors.ErrUnsupported.
func (r *Redis) Decide(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	if err := r.ready(); err != nil {
		return driver.Outcome{}, err
	}
	if req.Cost == 0 {
		return r.Peek(ctx, req)
	}
	if !r.deciding {
		return driver.Outcome{}, r.refuse(req)
	}
	i, key, err := r.writable(ctx, req, nil)
	if err != nil {
		return driver.Outcome{}, err
	}
	return r.run(ctx, req, i, key, driver.State{})
}

// Seed implements driver.Seeder for a Deciding Redis (without Deciding:
// an error wrapping errors.ErrUnsupported). In one script it reads the
// counter and its PEXPIRETIME, merges given into that window by
// driver.Merge's rule at req.Now (a larger count of the window held open
// is set with its TTL kept; a given window open at req.Now when none is
// held is written with SET ... PXAT its End), then counts req.Cost as
// Decide does. Outcome.Prior holds the window read first. A given window
// holding no unit is written only with a cost to count in it: the old
// code would give a counter it finds at 0 a TTL of its own.
func (r *Redis) Seed(ctx context.Context, req driver.Request, given []driver.State) (driver.Outcome, error) {
	if err := r.ready(); err != nil {
		return driver.Outcome{}, err
	}
	if !r.deciding {
		return driver.Outcome{}, driver.Errorf("%w: legacy: redis: read-only (no Deciding): cannot take states", errors.ErrUnsupported)
	}
	if given == nil {
		given = []driver.State{}
	}
	i, key, err := r.writable(ctx, req, given)
	if err != nil {
		return driver.Outcome{}, err
	}
	return r.run(ctx, req, i, key, given[0])
}

// writable runs the checks Decide and Seed share before any round trip
// (the request, the given states when seeding, the cost) and returns the
// limit the counter holds and the counter's key.
func (r *Redis) writable(ctx context.Context, req driver.Request, given []driver.State) (int, string, error) {
	if err := r.check(ctx, req); err != nil {
		return 0, "", err
	}
	if given != nil {
		if err := driver.CheckGiven(req.Policy, given); err != nil {
			return 0, "", err
		}
	}
	if req.Cost < 0 {
		return 0, "", driver.Errorf("%w: legacy: negative cost %d", driver.ErrInvalidOption, req.Cost)
	}
	p := req.Policy
	i, key := r.target(p, req.Identifier)
	if i < 0 {
		return -1, "", driver.Errorf("%w: legacy: redis: policy %q, identifier %q: no legacy counter to decide with (no FixedWindow limit of the legacy window %v, or an empty key)",
			errors.ErrUnsupported, p.Name, req.Identifier, r.window)
	}
	if len(p.Limits) != 1 {
		return -1, "", driver.Errorf("%w: legacy: redis: policy %q has %d limits, the legacy counter holds one: give a Deciding backend the legacy limiter's own policy",
			errors.ErrUnsupported, p.Name, len(p.Limits))
	}
	return i, key, nil
}

// decideScript counts in a legacy INCR+EXPIRE counter as the hand-written
// limiter does, after merging a given window into it, and reads the
// window's end as an absolute time. KEYS[1] is the counter; ARGV: the
// cost, the window (ms), the request's now (Unix ms), the given window's
// count and end (0 0 for none), and the TTL (ms) a counter without one is
// given. All times are the server's but now, which only says which
// windows have ended. It returns the count and end (PEXPIRETIME) of the
// window held before, 0 0 when none was open at now; the count and end
// after; and flags: 1 when it opened a window, 2 when the merge changed
// the counter.
var decideScript = goredis.NewScript(`
local key = KEYS[1]
local cost = tonumber(ARGV[1])
local now = tonumber(ARGV[3])
local gused = tonumber(ARGV[4])
local gend = tonumber(ARGV[5])
local count, e, open = 0, 0, false
local v = redis.call('GET', key)
if v then
  if string.len(v) > 20 or not string.match(v, '^%-?%d+$') then
    return redis.error_reply('THROTTLEKIT_NOTCOUNT value is not an integer')
  end
  count = tonumber(v)
  e = redis.call('PEXPIRETIME', key)
  if e == -1 then
    redis.call('PEXPIRE', key, ARGV[6])
    e = redis.call('PEXPIRETIME', key)
  end
  open = e > now
  if not open then
    redis.call('DEL', key)
    count, e = 0, 0
  end
end
local pc, pe = 0, 0
if open then pc, pe = count, e end
local flags = 0
if gend > now and (gused > 0 or cost > 0) then
  if open then
    if gused > count then
      redis.call('SET', key, ARGV[4], 'KEEPTTL')
      count = gused
      flags = 2
    end
  else
    redis.call('SET', key, ARGV[4], 'PXAT', ARGV[5])
    count, e, open = gused, gend, true
    flags = 2
  end
end
if cost > 0 then
  count = redis.call('INCRBY', key, ARGV[1])
  e = redis.call('PEXPIRETIME', key)
  if e < 0 then
    redis.call('PEXPIRE', key, ARGV[2])
    e = redis.call('PEXPIRETIME', key)
    if not open then flags = flags + 1 end
  end
end
return {pc, pe, count, e, flags}
`)

// run decides req.Cost on the counter key, limit i of req's policy, after
// merging given into it (the zero State: nothing), in one script.
func (r *Redis) run(ctx context.Context, req driver.Request, i int, key string, given driver.State) (driver.Outcome, error) {
	nowMs := req.Now.UnixMilli()
	heal := r.window
	if r.noTTL > 0 {
		heal = r.noTTL
	}
	args := []any{
		strconv.FormatInt(req.Cost, 10), strconv.FormatInt(r.window.Milliseconds(), 10), strconv.FormatInt(nowMs, 10),
		strconv.FormatInt(given.Used, 10), strconv.FormatInt(given.End, 10), strconv.FormatInt(heal.Milliseconds(), 10),
	}
	r.stats.reads.Add(1)
	reply, err := await(ctx, func() ([]int64, error) {
		return decideScript.Run(ctx, r.client, []string{key}, args...).Int64Slice()
	})
	switch {
	case isWrongType(err):
		return driver.Outcome{}, r.badReply("key %q is not a string counter: %v", key, err)
	case err != nil && strings.Contains(err.Error(), "THROTTLEKIT_NOTCOUNT"):
		return driver.Outcome{}, r.badReply("counter %q does not hold a decimal count", key)
	case err != nil && isUnknownCommand(err):
		return driver.Outcome{}, driver.Errorf("throttlekit: legacy: redis: %q: a Deciding Redis needs Redis 7.0 or later (PEXPIRETIME): %w", key, err)
	case err != nil:
		return driver.Outcome{}, driver.Errorf("throttlekit: legacy: redis: decide %q: %w", key, err)
	case len(reply) != 5:
		return driver.Outcome{}, r.badReply("deciding %q: script replied %v", key, reply)
	}
	for _, end := range []int64{reply[1], reply[3]} {
		if end > driver.MaxUnixMilli {
			return driver.Outcome{}, r.badReply("counter %q expires after %s", key, time.UnixMilli(driver.MaxUnixMilli).UTC().Format(time.DateOnly))
		}
	}
	if reply[4]&1 != 0 {
		r.stats.opened.Add(1)
	}
	if reply[4]&2 != 0 {
		r.stats.seeded.Add(1)
	}
	p := req.Policy
	states := req.States()[:len(p.Limits)]
	clear(states)
	states[i] = window(reply[2], reply[3], nowMs)
	out := driver.Outcome{States: states, Prior: make([]driver.State, len(p.Limits))}
	out.Prior[i] = window(reply[0], reply[1], nowMs)
	if req.Cost > 0 {
		r.stats.decided.Add(1)
		out.Allowed = reply[2] <= p.Limits[i].Max
	} else {
		out.Allowed = driver.Decide(p, req.Now, 0, states)
	}
	return out, nil
}

// isUnknownCommand reports a server that does not know a command the
// backend sends (PEXPIRETIME before Redis 7.0).
func isUnknownCommand(err error) bool {
	msg := strings.ToLower(err.Error())
	return strings.Contains(msg, "unknown command") || strings.Contains(msg, "unknown redis command")
}

// Peek implements driver.Peeker. Built with Deciding, it reads the counter
// as Decide does: GET and PEXPIRETIME in one MULTI, the window ending at
// the counter's absolute expiry (a counter without a TTL is read as a
// window ending WithNoTTLWindow's length, or WithWindow's, after
// req.Now, the TTL a decision would give it; one whose expiry is at or
// before req.Now is an ended window). Otherwise it reads GET and PTTL of
// the counter in one MULTI, so both describe the same key: the limit the
// matcher picks holds State{Used: count, End: req.Now + PTTL in Unix
// milliseconds}; the window end is thus taken from req.Now, never from the
// server's clock, and a peek later by d reads the same end as long as both
// clocks advance alike. Every other limit holds the zero State, and so
// does that one when the key is missing, its count is 0 or less, or it
// has no TTL (unless WithNoTTLWindow, or Deciding). A value that is not a decimal integer, or a key of
// another type, is an error wrapping driver.ErrBadReply.
func (r *Redis) Peek(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	if err := r.ready(); err != nil {
		return driver.Outcome{}, err
	}
	if err := r.check(ctx, req); err != nil {
		return driver.Outcome{}, err
	}
	i, key := r.target(req.Policy, req.Identifier)
	if i < 0 {
		return r.outcome(req, -1, driver.State{}), nil
	}
	if r.deciding {
		return r.peekAbsolute(ctx, req, i, key)
	}
	r.stats.reads.Add(1)
	type reply struct {
		value string
		found bool
		ttl   time.Duration
	}
	got, err := await(ctx, func() (reply, error) {
		var get *goredis.StringCmd
		var pttl *goredis.DurationCmd
		_, err := r.client.TxPipelined(ctx, func(p goredis.Pipeliner) error {
			get = p.Get(ctx, key)
			pttl = p.PTTL(ctx, key)
			return nil
		})
		if err != nil && !errors.Is(err, goredis.Nil) {
			return reply{}, err
		}
		v, err := get.Result()
		if errors.Is(err, goredis.Nil) {
			return reply{}, nil
		}
		if err != nil {
			return reply{}, err
		}
		ttl, err := pttl.Result()
		return reply{value: v, found: true, ttl: ttl}, err
	})
	if err != nil {
		if isWrongType(err) {
			return driver.Outcome{}, r.badReply("key %q is not a string counter: %v", key, err)
		}
		return driver.Outcome{}, driver.Errorf("throttlekit: legacy: redis: get %q: %w", key, err)
	}
	if !got.found {
		return r.outcome(req, i, driver.State{}), nil
	}
	count, ok := parseCount(got.value)
	if !ok {
		return driver.Outcome{}, r.badReply("counter %q holds %q, not a decimal count", key, got.value)
	}
	nowMs := req.Now.UnixMilli()
	var endMs int64
	switch {
	case got.ttl >= 0:
		// go-redis reads PTTL's milliseconds into a Duration.
		endMs = nowMs + got.ttl.Milliseconds()
	case got.ttl == -1 && r.noTTL > 0:
		// PTTL -1 (as a Duration of -1 ns): the key has no TTL.
		endMs = nowMs + r.noTTL.Milliseconds()
	default:
		// No TTL, or gone (-2) in between: absent.
		return r.outcome(req, i, driver.State{}), nil
	}
	if endMs > driver.MaxUnixMilli {
		return driver.Outcome{}, r.badReply("counter %q has a TTL of %v, ending after %s", key, got.ttl, time.UnixMilli(driver.MaxUnixMilli).UTC().Format(time.DateOnly))
	}
	return r.outcome(req, i, window(count, endMs, nowMs)), nil
}

// peekAbsolute is Peek for a Deciding Redis: GET and PEXPIRETIME of the
// counter in one MULTI.
func (r *Redis) peekAbsolute(ctx context.Context, req driver.Request, i int, key string) (driver.Outcome, error) {
	r.stats.reads.Add(1)
	type reply struct {
		value string
		found bool
		end   int64
	}
	got, err := await(ctx, func() (reply, error) {
		var get *goredis.StringCmd
		var expiry *goredis.Cmd
		_, err := r.client.TxPipelined(ctx, func(p goredis.Pipeliner) error {
			get = p.Get(ctx, key)
			expiry = p.Do(ctx, "pexpiretime", key)
			return nil
		})
		if err != nil && !errors.Is(err, goredis.Nil) {
			return reply{}, err
		}
		v, err := get.Result()
		if errors.Is(err, goredis.Nil) {
			return reply{}, nil
		}
		if err != nil {
			return reply{}, err
		}
		end, err := expiry.Int64()
		return reply{value: v, found: true, end: end}, err
	})
	if err != nil {
		switch {
		case isWrongType(err):
			return driver.Outcome{}, r.badReply("key %q is not a string counter: %v", key, err)
		case isUnknownCommand(err) || strings.Contains(err.Error(), "EXECABORT"):
			return driver.Outcome{}, driver.Errorf("throttlekit: legacy: redis: get %q: a Deciding Redis needs Redis 7.0 or later (PEXPIRETIME): %w", key, err)
		}
		return driver.Outcome{}, driver.Errorf("throttlekit: legacy: redis: get %q: %w", key, err)
	}
	if !got.found {
		return r.outcome(req, i, driver.State{}), nil
	}
	count, ok := parseCount(got.value)
	if !ok {
		return driver.Outcome{}, r.badReply("counter %q holds %q, not a decimal count", key, got.value)
	}
	nowMs := req.Now.UnixMilli()
	endMs := got.end
	switch {
	case endMs == -1:
		// No TTL: the one a decision would give it.
		heal := r.window
		if r.noTTL > 0 {
			heal = r.noTTL
		}
		endMs = nowMs + heal.Milliseconds()
	case endMs < 0:
		// Gone (-2) in between: absent.
		return r.outcome(req, i, driver.State{}), nil
	}
	if endMs > driver.MaxUnixMilli {
		return driver.Outcome{}, r.badReply("counter %q expires after %s", key, time.UnixMilli(driver.MaxUnixMilli).UTC().Format(time.DateOnly))
	}
	return r.outcome(req, i, window(count, endMs, nowMs)), nil
}

// isWrongType reports the server's refusal to GET a key of another type.
func isWrongType(err error) bool {
	var re goredis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), "WRONGTYPE")
}

// Ping implements driver.Pinger: the server answers, or with a Cluster
// client every primary does, which is where the reads go.
func (r *Redis) Ping(ctx context.Context) error {
	if err := r.ready(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	_, err := await(ctx, func() (struct{}, error) {
		if cc, ok := r.client.(*goredis.ClusterClient); ok {
			return struct{}{}, cc.ForEachMaster(ctx, func(ctx context.Context, node *goredis.Client) error {
				return node.Ping(ctx).Err()
			})
		}
		return struct{}{}, r.client.Ping(ctx).Err()
	})
	if err != nil {
		return driver.Errorf("throttlekit: legacy: redis: ping: %w", err)
	}
	return nil
}
