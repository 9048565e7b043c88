package shardedbackend

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit/internal/hrw"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// MaxNameLen is the longest shard name, in bytes.
const MaxNameLen = 64

// Shard is one group of servers: a primary that decides, and replicas that
// may answer peeks. The name, not the servers behind it, decides which
// identifiers the shard owns (see Score): name shards by role ("a", "eu-1"),
// never by address, so that replacing a server moves no identifier.
type Shard struct {
	// Name is 1 to MaxNameLen bytes of ASCII letters, digits, '.', '_' and
	// '-', unique among the shards of a Backend.
	Name string
	// Primary decides, refunds, resets, and answers peeks when no replica
	// can.
	Primary driver.Backend
	// Replicas answer peeks, tried in turn (starting from a different one
	// on each peek, to spread the load). They must return the states they
	// read, even stale ones; the throttler ignores windows closed at the
	// request's now. A Redis backend built over a replica's client
	// (redisbackend.New(replicaClient)) is such a Peeker: its Peek runs a
	// read-only script.
	Replicas []driver.Peeker
}

// ShardError is the error of an operation on one shard. The throttler wraps
// it in throttler.ErrBackend, so a degraded Result's Err names the shard:
// use errors.As to read it.
type ShardError struct {
	// Shard is the shard's name.
	Shard string
	// Op is the operation: "decide", "take", "peek", "refund", "reset",
	// "seed", "ping", "acquire" or "release".
	Op string
	// Err is the shard's own error. For a peek that no server answered, it
	// joins the errors of every replica and of the primary.
	Err error
}

// Error returns `throttlekit: sharded: shard "name": op: err`.
func (e *ShardError) Error() string {
	return fmt.Sprintf("throttlekit: sharded: shard %q: %s: %s", e.Shard, e.Op, strings.TrimPrefix(fmt.Sprint(e.Err), driver.ErrorPrefix))
}

// Unwrap returns the shard's own error.
func (e *ShardError) Unwrap() error { return e.Err }

// Backend is a driver.Backend over named shards. Every operation for an
// identifier goes to the one shard that owns it by rendezvous hashing over
// the shard names (see Score): decisions, refunds and resets to its
// primary, peeks to one of its replicas and, when no replica answers, to
// its primary. It implements Peeker, Refunder, Resetter, Pinger, Leaser
// (concurrency leases go to the primary too) and Seeder (given states go to
// the primary too); a shard whose primary lacks one of these makes the
// operation return an error wrapping errors.ErrUnsupported for its
// identifiers. It is Nonblocking when every primary and replica is.
//
// It is safe for concurrent use. Build it with New, or over Redis groups
// with package redisgroups (backend/redis/groups).
type Backend struct {
	shards []*shard
	// onReplicaError is told about every replica that failed a peek.
	onReplicaError func(error)
}

// shard is a Shard ready for routing.
type shard struct {
	name     string
	seed     uint64
	primary  driver.Backend
	replicas []driver.Peeker
	// nextReplica rotates the replica a peek tries first.
	nextReplica atomic.Uint32
}

var (
	_ driver.Backend  = (*Backend)(nil)
	_ driver.Peeker   = (*Backend)(nil)
	_ driver.Refunder = (*Backend)(nil)
	_ driver.Taker    = (*Backend)(nil)
	_ driver.Resetter = (*Backend)(nil)
	_ driver.Pinger   = (*Backend)(nil)
	_ driver.Closer   = (*Backend)(nil)
	_ driver.Leaser   = (*Backend)(nil)
	_ driver.Seeder   = (*Backend)(nil)

	_ driver.Nonblocking   = (*Backend)(nil)
	_ driver.LoggerSetter  = (*Backend)(nil)
	_ driver.ConfigChecker = (*Backend)(nil)
)

// Option configures a Backend (New).
type Option interface {
	apply(*options) error
}

// optionFunc adapts a function to Option.
type optionFunc func(*options) error

func (f optionFunc) apply(o *options) error { return f(o) }

type options struct {
	onReplicaError func(error)
}

// WithReplicaErrorHandler sets a function told about every replica that
// failed to answer a peek; the peek then went on to the next replica or the
// primary, so the caller saw no error. The error is a *ShardError. It runs
// on the request path: it must be fast and safe for concurrent use. By
// default such failures are not reported (a peek that no server answers is
// reported as the peek's error, as always).
func WithReplicaErrorHandler(f func(error)) Option {
	return optionFunc(func(o *options) error { o.onReplicaError = f; return nil })
}

// New returns a Backend over shards, which may be any backends: memory,
// Redis, another sharded backend. The order of shards does not matter for
// routing. The error wraps driver.ErrInvalidOption and names the offending shard.
func New(shards []Shard, opts ...Option) (*Backend, error) {
	var o options
	for _, opt := range opts {
		if opt == nil {
			return nil, driver.Errorf("%w: sharded: nil Option", driver.ErrInvalidOption)
		}
		if err := opt.apply(&o); err != nil {
			return nil, err
		}
	}
	return newBackend(shards, o)
}

func newBackend(shards []Shard, o options) (*Backend, error) {
	if len(shards) == 0 {
		return nil, driver.Errorf("%w: sharded: no shards", driver.ErrInvalidOption)
	}
	b := &Backend{shards: make([]*shard, len(shards)), onReplicaError: o.onReplicaError}
	seen := make(map[string]bool, len(shards))
	for i, s := range shards {
		if err := CheckName(s.Name); err != nil {
			return nil, driver.Errorf("%w (shard %d)", err, i)
		}
		if seen[s.Name] {
			return nil, driver.Errorf("%w: sharded: duplicate shard name %q", driver.ErrInvalidOption, s.Name)
		}
		seen[s.Name] = true
		if s.Primary == nil {
			return nil, driver.Errorf("%w: sharded: shard %q: nil primary", driver.ErrInvalidOption, s.Name)
		}
		for j, r := range s.Replicas {
			if r == nil {
				return nil, driver.Errorf("%w: sharded: shard %q: replica %d is nil", driver.ErrInvalidOption, s.Name, j)
			}
		}
		b.shards[i] = &shard{
			name:     s.Name,
			seed:     hrw.Hash(s.Name),
			primary:  s.Primary,
			replicas: append([]driver.Peeker(nil), s.Replicas...),
		}
	}
	return b, nil
}

// CheckName reports whether name may name a shard; the error wraps
// driver.ErrInvalidOption and says why not. The character set keeps
// names free of the routing hash's separator and of every delimiter of the
// configuration string, and makes them safe to print in logs and errors.
func CheckName(name string) error {
	if name == "" {
		return driver.Errorf("%w: sharded: empty shard name", driver.ErrInvalidOption)
	}
	if len(name) > MaxNameLen {
		return driver.Errorf("%w: sharded: shard name %.16q... is longer than %d bytes", driver.ErrInvalidOption, name, MaxNameLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return driver.Errorf("%w: sharded: shard name %q holds %q: use letters, digits, '.', '_' and '-'", driver.ErrInvalidOption, name, c)
		}
	}
	return nil
}

// Shards returns the shard names, in the order given to New.
func (b *Backend) Shards() []string {
	if b == nil {
		return nil
	}
	names := make([]string, len(b.shards))
	for i, s := range b.shards {
		names[i] = s.name
	}
	return names
}

// ShardFor returns the name of the shard that owns identifier: the same as
// Owner(b.Shards(), identifier).
func (b *Backend) ShardFor(identifier string) string {
	if s := b.route(identifier); s != nil {
		return s.name
	}
	return ""
}

// errNoShards is the error of a Backend not built by a constructor.
var errNoShards = driver.Errorf("%w: sharded: Backend has no shards (build it with New)", driver.ErrNotInitialized)

// route returns the shard that owns identifier (see Score), or nil for a
// zero or nil Backend. Each shard's name hash is precomputed, so routing
// hashes the identifier once.
func (b *Backend) route(identifier string) *shard {
	if b == nil || len(b.shards) == 0 {
		return nil
	}
	h := hrw.Hash(identifier)
	best, bestScore := b.shards[0], hrw.Score(h, b.shards[0].seed)
	for _, s := range b.shards[1:] {
		score := hrw.Score(h, s.seed)
		if score > bestScore || score == bestScore && s.name < best.name {
			best, bestScore = s, score
		}
	}
	return best
}

// Decide implements driver.Backend on the primary of the identifier's
// shard. Its failure is returned as a *ShardError; it concerns that shard's
// identifiers only.
func (b *Backend) Decide(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	s := b.route(req.Identifier)
	if s == nil {
		return driver.Outcome{}, errNoShards
	}
	out, err := s.primary.Decide(ctx, req)
	if err != nil {
		return driver.Outcome{}, &ShardError{Shard: s.name, Op: "decide", Err: err}
	}
	return out, nil
}

// Take implements driver.Taker on the identifier's primary, with its own
// Take or driver.TakeWith's rounds of a peek and a decision.
func (b *Backend) Take(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	s := b.route(req.Identifier)
	if s == nil {
		return driver.Outcome{}, errNoShards
	}
	out, err := driver.TakeWith(ctx, s.primary, req)
	if err != nil {
		return driver.Outcome{}, &ShardError{Shard: s.name, Op: "take", Err: err}
	}
	return out, nil
}

// Peek implements driver.Peeker. The replicas of the identifier's shard
// are tried in turn, starting from a different one on each call; when every
// replica fails (or the shard has none) the primary answers, with its own
// Peek or else Decide with cost 0. Everything runs within ctx. Each replica
// is given a context with at most half of ctx's remaining time, so that a
// hung replica leaves the primary time to answer, provided the replica's
// Peek returns when its context is done: the Redis backend's does on every
// client (see Timeouts in package redisbackend), and on those
// redisgroups makes it needs no extra goroutine.
//
// A replica may lag behind its primary. It can show fewer units than the
// primary holds (a peek is advice, the next decision on the primary is
// exact), and it can hold windows the primary has seen close; those the
// throttler ignores, since Evaluate treats every window that ends at or
// before the request's now as absent, whatever a replica or its TTLs say.
func (b *Backend) Peek(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	req.Cost = 0
	s := b.route(req.Identifier)
	if s == nil {
		return driver.Outcome{}, errNoShards
	}
	var errs []error
	if n := len(s.replicas); n > 0 {
		start := int(s.nextReplica.Add(1) % uint32(n))
		for k := range n {
			i := (start + k) % n
			out, err := peekWithin(ctx, s.replicas[i], req)
			if err == nil {
				return out, nil
			}
			err = driver.Errorf("replica %d: %w", i, err)
			if b.onReplicaError != nil {
				b.onReplicaError(&ShardError{Shard: s.name, Op: "peek", Err: err})
			}
			errs = append(errs, err)
			if ctx.Err() != nil {
				return driver.Outcome{}, &ShardError{Shard: s.name, Op: "peek", Err: errors.Join(errs...)}
			}
		}
	}
	var out driver.Outcome
	var err error
	if pk, ok := s.primary.(driver.Peeker); ok {
		out, err = pk.Peek(ctx, req)
	} else {
		out, err = s.primary.Decide(ctx, req)
	}
	if err != nil {
		if len(errs) > 0 {
			err = driver.Errorf("primary: %w", err)
		}
		return driver.Outcome{}, &ShardError{Shard: s.name, Op: "peek", Err: errors.Join(append(errs, err)...)}
	}
	return out, nil
}

// peekWithin runs one replica's peek with at most half of ctx's remaining
// time, keeping the rest for the servers after it.
func peekWithin(ctx context.Context, replica driver.Peeker, req driver.Request) (driver.Outcome, error) {
	if deadline, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Until(deadline)/2)
		defer cancel()
	}
	return replica.Peek(ctx, req)
}

// Refund implements driver.Refunder on the primary of the identifier's
// shard. A primary without Refunder gives an error wrapping
// errors.ErrUnsupported.
func (b *Backend) Refund(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	s := b.route(req.Identifier)
	if s == nil {
		return driver.Outcome{}, errNoShards
	}
	rf, ok := s.primary.(driver.Refunder)
	if !ok {
		return driver.Outcome{}, &ShardError{Shard: s.name, Op: "refund",
			Err: driver.Errorf("%w: the primary cannot refund", errors.ErrUnsupported)}
	}
	out, err := rf.Refund(ctx, req)
	if err != nil {
		return driver.Outcome{}, &ShardError{Shard: s.name, Op: "refund", Err: err}
	}
	return out, nil
}

// Reset implements driver.Resetter on the primary of the identifier's
// shard. A primary without Resetter gives an error wrapping
// errors.ErrUnsupported.
func (b *Backend) Reset(ctx context.Context, p *driver.Policy, identifier string) error {
	s := b.route(identifier)
	if s == nil {
		return errNoShards
	}
	rs, ok := s.primary.(driver.Resetter)
	if !ok {
		return &ShardError{Shard: s.name, Op: "reset",
			Err: driver.Errorf("%w: the primary cannot reset", errors.ErrUnsupported)}
	}
	if err := rs.Reset(ctx, p, identifier); err != nil {
		return &ShardError{Shard: s.name, Op: "reset", Err: err}
	}
	return nil
}

// Seed implements driver.Seeder on the primary of the identifier's shard,
// the one store that decides for the identifier, so that the given states
// land where its next decision reads them. A primary without Seeder gives
// an error wrapping errors.ErrUnsupported; other failures are returned as a
// *ShardError too.
func (b *Backend) Seed(ctx context.Context, req driver.Request, given []driver.State) (driver.Outcome, error) {
	s := b.route(req.Identifier)
	if s == nil {
		return driver.Outcome{}, errNoShards
	}
	sd, ok := s.primary.(driver.Seeder)
	if !ok {
		return driver.Outcome{}, &ShardError{Shard: s.name, Op: "seed",
			Err: driver.Errorf("%w: the primary cannot take states", errors.ErrUnsupported)}
	}
	out, err := sd.Seed(ctx, req, given)
	if err != nil {
		return driver.Outcome{}, &ShardError{Shard: s.name, Op: "seed", Err: err}
	}
	return out, nil
}

// Nonblocking implements driver.Nonblocking: true when the primary and
// every replica of every shard are nonblocking (in-process stores), so
// that the throttler gives their calls no call timeout. A Backend no
// constructor built reports false.
func (b *Backend) Nonblocking() bool {
	if b == nil || len(b.shards) == 0 {
		return false
	}
	for _, s := range b.shards {
		if !nonblocking(s.primary) {
			return false
		}
		for _, r := range s.replicas {
			if !nonblocking(r) {
				return false
			}
		}
	}
	return true
}

// nonblocking reports whether server says it never blocks.
func nonblocking(server any) bool {
	nb, ok := server.(driver.Nonblocking)
	return ok && nb.Nonblocking()
}

// Acquire implements driver.Leaser on the primary of the identifier's
// shard, so that every lease of an identifier is counted in one place. A
// primary without Leaser gives an error wrapping errors.ErrUnsupported.
func (b *Backend) Acquire(ctx context.Context, req driver.LeaseRequest) (driver.LeaseOutcome, error) {
	return b.lease(ctx, "acquire", req, driver.Leaser.Acquire)
}

// Release implements driver.Leaser on the primary of the identifier's
// shard. A primary without Leaser gives an error wrapping
// errors.ErrUnsupported.
func (b *Backend) Release(ctx context.Context, req driver.LeaseRequest) (driver.LeaseOutcome, error) {
	return b.lease(ctx, "release", req, driver.Leaser.Release)
}

func (b *Backend) lease(ctx context.Context, op string, req driver.LeaseRequest,
	f func(driver.Leaser, context.Context, driver.LeaseRequest) (driver.LeaseOutcome, error)) (driver.LeaseOutcome, error) {
	s := b.route(req.Identifier)
	if s == nil {
		return driver.LeaseOutcome{}, errNoShards
	}
	lr, ok := s.primary.(driver.Leaser)
	if !ok {
		return driver.LeaseOutcome{}, &ShardError{Shard: s.name, Op: op,
			Err: driver.Errorf("%w: the primary has no concurrency leases", errors.ErrUnsupported)}
	}
	out, err := f(lr, ctx, req)
	if err != nil {
		return driver.LeaseOutcome{}, &ShardError{Shard: s.name, Op: op, Err: err}
	}
	return out, nil
}

// Ping implements driver.Pinger: it pings the primary and every replica
// of every shard, all at once, and joins the failures, each a *ShardError
// naming its shard and server, in shard order. Servers without Pinger count
// as reachable. A failing replica fails Ping although peeks still work
// through the primary: Ping is a health check, and a lost replica needs
// attention. A Backend no constructor built has no server to ping: its
// Ping fails, wrapping driver.ErrNotInitialized.
func (b *Backend) Ping(ctx context.Context) error {
	if b == nil || len(b.shards) == 0 {
		return errNoShards
	}
	errs := make([][]error, len(b.shards))
	var wg sync.WaitGroup
	for i, s := range b.shards {
		errs[i] = make([]error, 1+len(s.replicas))
		ping := func(slot int, server string, target any) {
			pg, ok := target.(driver.Pinger)
			if !ok {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := pg.Ping(ctx); err != nil {
					errs[i][slot] = &ShardError{Shard: s.name, Op: "ping", Err: driver.Errorf("%s: %w", server, err)}
				}
			}()
		}
		ping(0, "primary", s.primary)
		for j, r := range s.replicas {
			ping(1+j, fmt.Sprintf("replica %d", j), r)
		}
	}
	wg.Wait()
	var all []error
	for _, shardErrs := range errs {
		all = append(all, shardErrs...)
	}
	return errors.Join(all...)
}

// CheckConfig implements driver.ConfigChecker: it asks every primary and
// replica that implements it, and joins their errors, each naming its
// shard.
func (b *Backend) CheckConfig(callTimeout time.Duration) error {
	if b == nil {
		return nil
	}
	var errs []error
	for _, s := range b.shards {
		if err := driver.CheckConfig(s.primary, callTimeout); err != nil {
			errs = append(errs, driver.Errorf("throttlekit: sharded: shard %q: primary: %w", s.name, err))
		}
		for i, r := range s.replicas {
			if err := driver.CheckConfig(r, callTimeout); err != nil {
				errs = append(errs, driver.Errorf("throttlekit: sharded: shard %q: replica %d: %w", s.name, i, err))
			}
		}
	}
	return errors.Join(errs...)
}

// SetLogger implements driver.LoggerSetter: it passes l to every primary
// and replica that implements driver.LoggerSetter.
func (b *Backend) SetLogger(l *slog.Logger) {
	if b == nil {
		return
	}
	for _, s := range b.shards {
		if ls, ok := s.primary.(driver.LoggerSetter); ok {
			ls.SetLogger(l)
		}
		for _, r := range s.replicas {
			if ls, ok := r.(driver.LoggerSetter); ok {
				ls.SetLogger(l)
			}
		}
	}
}

// Close implements driver.Closer: the Backend owns the backends it shards,
// so it closes every primary and replica that implements driver.Closer, and
// returns their errors joined. Do not use the Backend after Close.
func (b *Backend) Close() error {
	if b == nil {
		return nil
	}
	var errs []error
	for _, s := range b.shards {
		if c, ok := s.primary.(driver.Closer); ok {
			errs = append(errs, c.Close())
		}
		for _, r := range s.replicas {
			if c, ok := r.(driver.Closer); ok {
				errs = append(errs, c.Close())
			}
		}
	}
	return errors.Join(errs...)
}
