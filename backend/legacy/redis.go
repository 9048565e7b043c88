package legacybackend

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// Redis reads the counters of a hand-written Redis limiter: a counter key
// raised with INCR and given its window's length as a TTL with EXPIRE
// (or PEXPIRE) when it was created. It implements driver.Backend,
// driver.Peeker and driver.Pinger, and never writes. It is safe for
// concurrent use.
type Redis struct {
	reader
	client goredis.UniversalClient
	noTTL  time.Duration
}

var (
	_ driver.Backend = (*Redis)(nil)
	_ driver.Peeker  = (*Redis)(nil)
	_ driver.Pinger  = (*Redis)(nil)

	_ driver.LoggerSetter = (*Redis)(nil)
)

// NewRedis returns a read-only backend over the legacy counters client
// holds (a standalone, Sentinel or Cluster client). Options: WithKeyFunc,
// WithMatcher, WithWindow, WithNoTTLWindow, WithLogger. The client stays the
// caller's. The error wraps driver.ErrInvalidOption.
func NewRedis(client goredis.UniversalClient, opts ...Option) (*Redis, error) {
	if isNilClient(client) {
		return nil, driver.Errorf("%w: legacy: nil redis client", driver.ErrInvalidOption)
	}
	o, err := buildOptions("NewRedis", opts, "WithResetMillis", "Deciding")
	if err != nil {
		return nil, err
	}
	if o.match == nil {
		o.match = MatchWindow(o.window)
	}
	r := &Redis{reader: reader{name: "redis", window: o.window, key: o.key, match: o.match}, client: client, noTTL: o.noTTL}
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

// Decide implements driver.Backend for peeks only: cost 0 is Peek; any
// other cost returns an error wrapping errors.ErrUnsupported, never a
// verdict, since the legacy store is read-only.
func (r *Redis) Decide(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	if err := r.ready(); err != nil {
		return driver.Outcome{}, err
	}
	if req.Cost != 0 {
		return driver.Outcome{}, r.refuse(req)
	}
	return r.Peek(ctx, req)
}

// Peek implements driver.Peeker: GET and PTTL of the counter in one
// MULTI, so both describe the same key. The limit the matcher picks holds
// State{Used: count, End: req.Now + PTTL in Unix milliseconds}; the window
// end is thus taken from req.Now, never from the server's clock, and a
// peek later by d reads the same end as long as both clocks advance
// alike. Every other limit holds the zero State, and so does that one when
// the key is missing, its count is 0 or less, or it has no TTL (unless
// WithNoTTLWindow). A value that is not a decimal integer, or a key of
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
