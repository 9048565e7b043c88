package redisgroups

import (
	"errors"
	"fmt"
	"strings"

	goredis "github.com/redis/go-redis/v9"

	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	shardedbackend "github.com/throttlekit/throttlekit/backend/sharded"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// Option configures New and Open.
type Option interface {
	apply(*options) error
}

// optionFunc adapts a function to Option.
type optionFunc func(*options) error

func (f optionFunc) apply(o *options) error { return f(o) }

type options struct {
	backend []redisbackend.Option
	sharded []shardedbackend.Option
}

// WithBackendOptions passes opts to the redisbackend.New of every server:
// a key prefix (redisbackend.WithPrefix), an expiry grace, circuit breakers
// (redisbackend.WithBreaker: each server, primary or replica, then has a
// breaker of its own, so that one group's outage costs the others
// nothing). Every server gets redisbackend.WithRoundTripsInFlight(1) first,
// as a Cluster primary does, since the groups run in parallel; opts may
// set another.
func WithBackendOptions(opts ...redisbackend.Option) Option {
	return optionFunc(func(o *options) error { o.backend = append(o.backend, opts...); return nil })
}

// WithShardedOptions passes opts to the shardedbackend.New that routes over
// the groups, such as shardedbackend.WithReplicaErrorHandler.
func WithShardedOptions(opts ...shardedbackend.Option) Option {
	return optionFunc(func(o *options) error { o.sharded = append(o.sharded, opts...); return nil })
}

// New returns a sharded backend over Redis groups: for each group, a
// go-redis client and a redisbackend.Backend for the primary, which
// decides, and one for each replica, whose Peek runs the read-only peek
// script there. The options in groups are copied, never modified.
//
// Every client it makes has ContextTimeoutEnabled set, whatever the options
// say, so that go-redis itself ends each command at its context's deadline:
// the throttler's per-call timeout, and the share of it a peek gives each
// replica, hold with no goroutine per call and no command left waiting on a
// hung server after its caller has gone.
//
// The layout is checked as Parse checks it (names, duplicates, addresses);
// the error wraps driver.ErrInvalidOption and names the offending part. The
// backend owns the clients New made: its Close closes them.
func New(groups []Config, opts ...Option) (*shardedbackend.Backend, error) {
	return newGroups(groups, false, opts)
}

// newGroups is New; fromString says the layout was read from a string, so
// that errors name groups by position (see checkLayout).
func newGroups(groups []Config, fromString bool, opts []Option) (*shardedbackend.Backend, error) {
	if err := checkLayout(groups, fromString); err != nil {
		return nil, err
	}
	var o options
	for _, opt := range opts {
		if opt == nil {
			return nil, driver.Errorf("%w: redisgroups: nil Option", driver.ErrInvalidOption)
		}
		if err := opt.apply(&o); err != nil {
			return nil, err
		}
	}
	var made []*ownedBackend
	fail := func(err error) (*shardedbackend.Backend, error) {
		for _, b := range made {
			_ = b.Close()
		}
		return nil, err
	}
	label := func(i int) string {
		if fromString {
			return fmt.Sprintf("entry %d", i+1)
		}
		return fmt.Sprintf("group %q", groups[i].Name)
	}
	layout := make([]shardedbackend.Shard, len(groups))
	for i, g := range groups {
		primary, err := open(g.Primary, o.backend)
		if primary != nil {
			made = append(made, primary)
		}
		if err != nil {
			return fail(invalidAt(label(i)+" primary", err))
		}
		layout[i] = shardedbackend.Shard{Name: g.Name, Primary: primary}
		for j, ro := range g.Replicas {
			replica, err := open(ro, o.backend)
			if replica != nil {
				made = append(made, replica)
			}
			if err != nil {
				return fail(invalidAt(fmt.Sprintf("%s replica %d", label(i), j), err))
			}
			layout[i].Replicas = append(layout[i].Replicas, replica)
		}
	}
	b, err := shardedbackend.New(layout, o.sharded...)
	if err != nil {
		return fail(err)
	}
	return b, nil
}

// ownedBackend is a redisbackend.Backend over a client it owns: its Close
// closes the client.
type ownedBackend struct {
	*redisbackend.Backend
	client *goredis.Client
}

var _ driver.Closer = (*ownedBackend)(nil)

// Close closes the client.
func (b *ownedBackend) Close() error { return b.client.Close() }

// open makes a client from a copy of opts (go-redis fills in defaults in the
// options it is given), with ContextTimeoutEnabled set, and a backend over
// it that owns it.
func open(opts *goredis.Options, backendOpts []redisbackend.Option) (*ownedBackend, error) {
	own := *opts
	own.ContextTimeoutEnabled = true
	client := goredis.NewClient(&own)
	// The groups' primaries run in parallel, as a Cluster's do: one round
	// trip in flight to each keeps them busy with larger batches (see
	// redisbackend.WithRoundTripsInFlight). The caller's options come
	// after, so they may set another.
	opts2 := append([]redisbackend.Option{redisbackend.WithRoundTripsInFlight(1)}, backendOpts...)
	b, err := redisbackend.New(client, opts2...)
	if err != nil {
		return nil, errors.Join(err, client.Close())
	}
	return &ownedBackend{Backend: b, client: client}, nil
}

// Open returns a sharded backend over the Redis groups config describes, in
// Parse's grammar:
//
//	a=redis://10.0.0.1:6379?replica=redis://10.0.0.2:6379,b=redis://10.0.0.3:6379
//
// It is Parse followed by New; the error wraps driver.ErrInvalidOption and
// names the offending part, never a password. Close the backend to close
// its clients.
func Open(config string, opts ...Option) (*shardedbackend.Backend, error) {
	groups, err := Parse(config)
	if err != nil {
		return nil, err
	}
	return newGroups(groups, true, opts)
}

// invalidAt returns err, a failure to open the server at where, as a
// driver.ErrInvalidOption that names where. An err that already is one
// (a bad redisbackend option) keeps its own text after where, without a
// second "invalid option".
func invalidAt(where string, err error) error {
	if errors.Is(err, driver.ErrInvalidOption) {
		return &placedError{where: where, err: err}
	}
	return driver.Errorf("%w: %s: %w", driver.ErrInvalidOption, where, err)
}

// placedError is an ErrInvalidOption error err, told where it happened.
type placedError struct {
	where string
	err   error
}

func (e *placedError) Error() string {
	prefix := driver.ErrInvalidOption.Error()
	return prefix + ": " + e.where + ": " + strings.TrimPrefix(e.err.Error(), prefix+": ")
}

func (e *placedError) Unwrap() error { return e.err }
