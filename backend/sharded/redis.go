package sharded

import (
	"errors"
	"fmt"
	"io"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/backend/redis"
)

// NewRedis returns a Backend over Redis shards: for each shard, a go-redis
// client and a redis.Backend for the primary, which decides, and one for
// each replica, whose Peek runs the read-only peek script there. Options
// given with WithRedisOptions (a key prefix, say) apply to every server.
// The options in shards are copied, never modified.
//
// Every client it makes has ContextTimeoutEnabled set, whatever the options
// say, so that go-redis itself ends each command at its context's deadline:
// the throttler's per-call timeout, and the share of it Peek gives each
// replica, hold with no goroutine per call and no command left waiting on a
// hung server after its caller has gone.
//
// The layout is checked as ParseConfig checks it (names, duplicates,
// addresses); the error wraps ErrBadConfig and names the offending part.
// The Backend owns the clients it made: Close closes them.
func NewRedis(shards []ShardConfig, opts ...Option) (*Backend, error) {
	if err := validateConfigs(shards); err != nil {
		return nil, err
	}
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	var owned []io.Closer
	fail := func(err error) (*Backend, error) {
		for _, c := range owned {
			_ = c.Close()
		}
		return nil, err
	}
	layout := make([]Shard, len(shards))
	for i, sc := range shards {
		primary, client, err := redisBackend(sc.Primary, o.redisOptions)
		if client != nil {
			owned = append(owned, client)
		}
		if err != nil {
			return fail(fmt.Errorf("%w: shard %q primary: %w", ErrBadConfig, sc.Name, err))
		}
		layout[i] = Shard{Name: sc.Name, Primary: primary}
		for j, ro := range sc.Replicas {
			replica, client, err := redisBackend(ro, o.redisOptions)
			if client != nil {
				owned = append(owned, client)
			}
			if err != nil {
				return fail(fmt.Errorf("%w: shard %q replica %d: %w", ErrBadConfig, sc.Name, j, err))
			}
			layout[i].Replicas = append(layout[i].Replicas, replica)
		}
	}
	b, err := newBackend(layout, o)
	if err != nil {
		return fail(err)
	}
	b.owned = owned
	return b, nil
}

// redisBackend makes a client from a copy of opts (go-redis fills in
// defaults in the options it is given), with ContextTimeoutEnabled set, and
// a redis.Backend over it.
func redisBackend(opts *goredis.Options, backendOpts []redis.Option) (*redis.Backend, *goredis.Client, error) {
	own := *opts
	own.ContextTimeoutEnabled = true
	client := goredis.NewClient(&own)
	b, err := redis.New(client, backendOpts...)
	if err != nil {
		return nil, client, err
	}
	return b, client, nil
}

// OpenRedis returns a Backend over the Redis shards config describes, in
// ParseConfig's grammar:
//
//	a=redis://10.0.0.1:6379?replica=redis://10.0.0.2:6379,b=redis://10.0.0.3:6379
//
// It is ParseConfig followed by NewRedis; the error wraps ErrBadConfig and
// names the offending part. Close the Backend to close its clients.
func OpenRedis(config string, opts ...Option) (*Backend, error) {
	shards, err := ParseConfig(config)
	if err != nil {
		return nil, err
	}
	b, err := NewRedis(shards, opts...)
	if err != nil {
		if !errors.Is(err, ErrBadConfig) {
			err = fmt.Errorf("%w: %w", ErrBadConfig, err)
		}
		return nil, err
	}
	return b, nil
}
