package redisbackend

import (
	"context"
	_ "embed"
	"errors"
	"io"
	"log/slog"
	"net"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	goredis "github.com/redis/go-redis/v9"

	"github.com/throttlekit/throttlekit/backend/breaker"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// Errors of this package, matched with errors.Is. Bad options wrap
// driver.ErrInvalidOption, and calls on a Backend New did not build wrap
// driver.ErrNotInitialized, as in every package of the module; the
// throttler also wraps every backend failure in throttler.ErrBackend.
var (
	// ErrUnexpectedReply reports a reply this package cannot read: the wrong
	// shape, type or length, as a proxy or an incompatible server might send.
	// It also matches driver.ErrBadReply.
	ErrUnexpectedReply = driver.Errorf("throttlekit: redis: unexpected reply: %w", driver.ErrBadReply)

	// ErrForeignValue reports that a key of this backend holds a value it
	// did not write: another type (Redis answers WRONGTYPE) or a string not
	// in the "used:end" format. The script stops before any write, so the
	// decision changes nothing; the throttler applies the failure mode. It
	// also matches driver.ErrBadReply.
	ErrForeignValue = driver.Errorf("throttlekit: redis: key holds a value this backend did not write: %w", driver.ErrBadReply)
)

// DefaultPrefix starts every key unless WithPrefix says otherwise.
const DefaultPrefix = "throttlekit:"

// DefaultExpiryGrace is how long a state outlives the moment it stops
// mattering (its window's end, or its GCRA bucket being full again) unless
// WithExpiryGrace says otherwise.
const DefaultExpiryGrace = driver.DefaultExpiryGrace

// maxExactMicros bounds |now| in Unix microseconds, so that every number a
// script computes stays below 2^53: a stored GCRA TAT lies at most
// 10 * driver.MaxWindow after the latest now.
const maxExactMicros = 1<<53 - int64(10*driver.MaxWindow/time.Microsecond)

// maxExact is the largest integer a Lua number holds exactly, and the
// largest field the scripts read from a stored state (MAX_EXACT in
// common.lua).
const maxExact = 1<<53 - 1

// foreignValueReply starts the error reply of a script that found a value it
// did not write.
const foreignValueReply = "THROTTLEKIT_FOREIGN_VALUE"

// The scripts, one per operation, each with common.lua spliced in after its
// shebang. goredis.Script runs EVALSHA and falls back to EVAL on NOSCRIPT,
// so decisions survive SCRIPT FLUSH, restarts and failovers to a server
// that never saw the script.
var (
	//go:embed common.lua
	commonSource string
	//go:embed decide.lua
	decideSource string
	//go:embed decide_many.lua
	decideManySource string
	//go:embed peek.lua
	peekSource string
	//go:embed refund.lua
	refundSource string
	//go:embed take.lua
	takeSource string
	//go:embed seed.lua
	seedSource string
	//go:embed acquire.lua
	acquireSource string
	//go:embed release.lua
	releaseSource string
	//go:embed peek_layout2.lua
	peekLayout2Source string

	// decideScript and decideManyScript decide one request and a batch of
	// them for a policy past the shape scripts' bounds (shape.go), and are
	// the reference the shape scripts are tested against.
	decideScript     = goredis.NewScript(withCommon(decideSource))
	decideManyScript = goredis.NewScript(withCommon(decideManySource))
	peekScript       = goredis.NewScript(withCommon(peekSource))
	refundScript     = goredis.NewScript(withCommon(refundSource))
	takeScript       = goredis.NewScript(withCommon(takeSource))
	seedScript       = goredis.NewScript(withCommon(seedSource))
	// peekLayout2Script reads the strings of layout 2 (Backend.Layout2).
	peekLayout2Script = goredis.NewScript(withLayout2(peekLayout2Source))
	// The lease scripts use none of common.lua.
	acquireScript = goredis.NewScript(acquireSource)
	releaseScript = goredis.NewScript(releaseSource)
)

// withCommon returns script with common.lua inserted after its first line:
// Redis reads script flags only from a shebang on the very first line.
func withCommon(script string) string {
	shebang, body, _ := strings.Cut(script, "\n")
	return shebang + "\n" + commonSource + body
}

// Client is the part of a go-redis client the backend uses. Every go-redis
// client implements it: *goredis.Client (standalone, or a Sentinel failover
// client from NewFailoverClient), *goredis.ClusterClient (also from
// NewFailoverClusterClient), *goredis.Ring, *goredis.AutoPipeliner and the
// goredis.UniversalClient interface. Set ContextTimeoutEnabled on the
// client where it has the option: see Timeouts in the package
// documentation.
type Client interface {
	goredis.Scripter
	Del(ctx context.Context, keys ...string) *goredis.IntCmd
	Ping(ctx context.Context) *goredis.StatusCmd
}

var (
	_ driver.Backend  = (*Backend)(nil)
	_ driver.Peeker   = (*Backend)(nil)
	_ driver.Refunder = (*Backend)(nil)
	_ driver.Resetter = (*Backend)(nil)
	_ driver.Pinger   = (*Backend)(nil)
	_ driver.Taker    = (*Backend)(nil)
	_ driver.Leaser   = (*Backend)(nil)
	_ driver.Seeder   = (*Backend)(nil)

	_ driver.LoggerSetter = (*Backend)(nil)

	_ Client = (*goredis.Client)(nil)
	_ Client = (*goredis.ClusterClient)(nil)
	_ Client = (*goredis.Ring)(nil)
	_ Client = (*goredis.AutoPipeliner)(nil)
	_ Client = goredis.UniversalClient(nil)
)

// Backend is a driver.Backend over Redis: one script call decides all the
// limits of one identifier's policy, atomically, in one round trip. It is
// safe for concurrent use by any number of goroutines, processes and hosts.
// Build it with New.
type Backend struct {
	client conn
	reader conn
	// ownReader is set when WithReadClient gave peeks a client of their own.
	ownReader bool
	prefix    string
	// graceMs is the expiry grace in milliseconds, boxed once for ARGV.
	graceMs any
	// evictionOnce guards the eviction-policy check of the first Ping.
	evictionOnce sync.Once
	// logger is where the backend's own lines go (SetLogger); nil means
	// slog.Default().
	logger atomic.Pointer[slog.Logger]
	// argsCache maps a *driver.Policy to its *policyCall.
	argsCache  sync.Map
	argsCached atomic.Int64
	// breakers holds the servers' circuit breakers (WithBreaker), nil
	// with WithoutBreaker.
	breakers *breaker.Set
	// reloaded is when a failure last asked a Cluster client to reload its
	// slot map (Unix nanoseconds).
	reloaded atomic.Int64
}

// clusterReloadInterval is the least time between two slot-map reloads that
// connection failures ask a Cluster client for.
const clusterReloadInterval = 100 * time.Millisecond

// noticeFailure asks a Cluster client to reload its slot map when a call
// failed to reach a node, at most once per clusterReloadInterval. A primary
// that died sends no MOVED, so without this go-redis keeps sending its
// slots to the dead address until its own periodic reload, about a minute
// later; with it, the promoted replica serves within a reload of the
// promotion.
func (b *Backend) noticeFailure(c conn, err error) {
	cc, ok := c.Client.(*goredis.ClusterClient)
	if !ok || !unreachable(err) {
		return
	}
	now := time.Now().UnixNano()
	last := b.reloaded.Load()
	if now-last < int64(clusterReloadInterval) || !b.reloaded.CompareAndSwap(last, now) {
		return
	}
	cc.ReloadState(context.Background()) // asynchronous; go-redis coalesces reloads
}

// unreachable reports an error of a node that could not be reached or did
// not answer, as opposed to an answer the node gave.
func unreachable(err error) bool {
	var netErr net.Error
	return errors.As(err, &netErr) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		goredis.HasErrorPrefix(err, "CLUSTERDOWN") || errors.Is(err, breaker.ErrOpen)
}

// conn is a client and whether the backend must enforce the caller's context
// itself because the client does not.
type conn struct {
	Client
	detached bool
	batch    scriptRunner // nil without WithBatching
}

func newConn(c Client) conn {
	return conn{Client: c, detached: !honoursDeadlines(c)}
}

// honoursDeadlines reports whether c ends a command at its context's
// deadline. go-redis clients do only with ContextTimeoutEnabled: otherwise
// they read replies on a background context, bounded by ReadTimeout alone
// (5 s by default). An auto-pipeliner runs queued commands on a context of
// its own, and a client of another type is not known to do either, so both
// count as detached: the safe answer costs a goroutine per call, never a
// missed deadline.
func honoursDeadlines(c Client) bool {
	switch c := c.(type) {
	case *goredis.Client:
		o := c.Options()
		return o != nil && o.ContextTimeoutEnabled
	case *goredis.ClusterClient:
		o := c.Options()
		return o != nil && o.ContextTimeoutEnabled
	case *goredis.Ring:
		o := c.Options()
		return o != nil && o.ContextTimeoutEnabled
	}
	return false
}

// Option configures a Backend (New).
type Option interface {
	apply(*config) error
}

// optionFunc adapts a function to Option.
type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	prefix  string
	reader  Client
	grace   time.Duration
	breaker bool // on by default; WithoutBreaker turns it off
	// breakerAsked is set by WithBreaker: a client that cannot have
	// breakers is then an error rather than a quiet default.
	breakerAsked bool
	breakerOpts  []breaker.Option
	batching     bool
	// batchingAsked is set by WithBatching: a client that cannot batch
	// is then an error rather than a quiet fallback.
	batchingAsked bool
	maxBatch      int
	inFlight      int // WithRoundTripsInFlight; 0 for the default
}

// WithPrefix sets the string every key starts with; the default is
// DefaultPrefix. It must not contain '{' or '}' (driver.ErrInvalidOption): the
// hash tag of a key belongs to the identifier. Give each application its
// own prefix when several share a Redis.
func WithPrefix(prefix string) Option {
	return optionFunc(func(c *config) error {
		if strings.ContainsAny(prefix, "{}") {
			return driver.Errorf("%w: redis: WithPrefix(%q): a brace would move the hash tag off the identifier", driver.ErrInvalidOption, prefix)
		}
		c.prefix = prefix
		return nil
	})
}

// WithReadClient sends peeks (Throttler.Peek) to r instead of the main
// client: a client connected to a replica, a Sentinel client with
// ReplicaOnly set, or a cluster client with ReadOnly (or RouteRandomly, or
// RouteByLatency) set. Peeks run a read-only script with EVALSHA_RO, which
// replicas accept, and ignore any window that has closed, whatever a lagging
// replica still holds. Decisions, refunds and resets always go to the main
// client. A nil r means the main client.
func WithReadClient(r Client) Option {
	return optionFunc(func(c *config) error { c.reader = r; return nil })
}

// WithExpiryGrace sets how long a stored state outlives the moment it stops
// mattering; the default is DefaultExpiryGrace, and less than a second is
// an error (driver.ErrInvalidOption). Expiry is garbage collection only: it never
// decides anything. Raise it above the largest clock difference between
// the hosts that share this Redis, so that a host whose clock is behind
// never finds live state expired.
func WithExpiryGrace(d time.Duration) Option {
	return optionFunc(func(c *config) error {
		if d < driver.MinExpiryGrace {
			return driver.Errorf("%w: redis: WithExpiryGrace(%v) is below one second", driver.ErrInvalidOption, d)
		}
		c.grace = d
		return nil
	})
}

// New returns a Backend over client. See the package documentation for
// the clients that fit and the keys the backend writes.
func New(client Client, opts ...Option) (*Backend, error) {
	if isNil(client) {
		return nil, driver.Errorf("%w: redis: nil client", driver.ErrInvalidOption)
	}
	cfg := config{prefix: DefaultPrefix, grace: DefaultExpiryGrace, batching: true, breaker: true}
	for _, opt := range opts {
		if opt == nil {
			return nil, driver.Errorf("%w: redis: nil Option", driver.ErrInvalidOption)
		}
		if err := opt.apply(&cfg); err != nil {
			return nil, err
		}
	}
	if strings.ContainsAny(cfg.prefix, "{}") {
		return nil, driver.Errorf("%w: key prefix %q holds a brace, which would move the hash tag off the identifier", driver.ErrInvalidOption, cfg.prefix)
	}
	if cfg.grace < driver.MinExpiryGrace {
		return nil, driver.Errorf("%w: expiry grace %v is below one second", driver.ErrInvalidOption, cfg.grace)
	}
	b := &Backend{client: newConn(client), prefix: cfg.prefix, graceMs: any(cfg.grace.Milliseconds())}
	b.reader = b.client
	if cfg.reader != nil {
		if isNil(cfg.reader) {
			return nil, driver.Errorf("%w: redis: nil read client", driver.ErrInvalidOption)
		}
		b.reader, b.ownReader = newConn(cfg.reader), true
	}
	if cfg.batching {
		// Batching is the default wherever the client can pipeline; asked
		// for with WithBatching, a client that cannot is an error.
		bt, err := newBatcher(b.client.Client, cfg.maxBatch, cfg.inFlight, !b.client.detached)
		switch {
		case err == nil:
			b.client.batch, b.reader.batch = bt, bt
		case cfg.batchingAsked:
			return nil, err
		}
		if b.ownReader {
			b.reader.batch = nil
			rbt, err := newBatcher(b.reader.Client, cfg.maxBatch, cfg.inFlight, !b.reader.detached)
			switch {
			case err == nil:
				b.reader.batch = rbt
			case cfg.batchingAsked:
				return nil, err
			}
		}
	}
	// Every client gets the connection hook: with breakers (the default)
	// it carries them, and without still marks the idle connections stale
	// when a command fails on the network, so the pool does not hand out
	// the connections an outage killed (see Circuit breakers). A client
	// type that cannot have breakers goes without by default.
	if cfg.breaker && !cfg.breakerAsked && (!breakable(client) || cfg.reader != nil && !breakable(cfg.reader)) {
		cfg.breaker = false
	}
	var set *breaker.Set
	if cfg.breaker {
		var err error
		if set, err = breaker.NewSet(cfg.breakerOpts...); err != nil {
			return nil, err
		}
		b.breakers = set
	}
	if err := installBreakers(client, set); err != nil {
		return nil, err
	}
	if b.ownReader && cfg.reader != client {
		if err := installBreakers(cfg.reader, set); err != nil {
			return nil, err
		}
	}
	return b, nil
}

// isNil reports whether c is nil or holds a nil pointer, such as a
// (*goredis.Client)(nil), whose every method would panic.
func isNil(c Client) bool {
	if c == nil {
		return true
	}
	v := reflect.ValueOf(c)
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return v.IsNil()
	}
	return false
}

// ready reports errNotInitialized for a Backend that New did not build.
func (b *Backend) ready() error {
	if b == nil || b.client.Client == nil || b.reader.Client == nil {
		return errNotInitialized
	}
	return nil
}

// Layout is the version of the stored layout this package writes. Layout 3
// keeps an identifier's state under one policy in one hash, whatever the
// number of limits, with the version in its key (see Key). Layouts 1 and 2
// kept one string per limit, under keys without a version (see Layout2);
// they differ in the limit keys (driver.KeyLayout).
const Layout = 3

// Key returns the key that holds identifier's state under p, a hash with
// the fields of every limit (see "Stored layout" in the package
// documentation):
//
//	<prefix>v3:{<escaped identifier>}:<p.Key>
//
// The identifier is escaped with driver.EscapeKey, whose output holds no
// brace, so the part in braces is the hash tag: an identifier's keys, its
// leases' included, land in one Redis Cluster slot whatever bytes it holds.
// A nil policy has no key, and neither has a nil *Backend.
func (b *Backend) Key(p *driver.Policy, identifier string) string {
	if b == nil || p == nil {
		return ""
	}
	id := driver.EscapeKey(identifier)
	key := make([]byte, 0, len(b.prefix)+len(id)+len(p.Key)+6)
	key = append(key, b.prefix...)
	key = append(key, "v3:{"...)
	key = append(key, id...)
	key = append(key, "}:"...)
	key = append(key, p.Key...)
	return string(key)
}

// LeaseKey returns the key that holds identifier's concurrency leases
// under l, a sorted set of lease IDs scored by their expiry in Unix ms:
//
//	<prefix>{<escaped identifier>}:lease:<l.Key>
//
// It shares the identifier's hash tag with the policy keys (see Key), and
// no policy key of any layout has this form: a layout-3 key starts with
// "v3:" after the prefix, and a layout-2 key ends with a limit key, which
// always holds a colon, where l.Key, escaped, never does. A nil limit has
// no key, and neither has a nil *Backend.
func (b *Backend) LeaseKey(l *driver.ConcurrencyLimit, identifier string) string {
	if b == nil || l == nil {
		return ""
	}
	return b.prefix + "{" + driver.EscapeKey(identifier) + "}:lease:" + l.Key
}

// Acquire implements driver.Leaser with one call of acquire.lua: one round
// trip.
func (b *Backend) Acquire(ctx context.Context, req driver.LeaseRequest) (driver.LeaseOutcome, error) {
	return b.runLease(ctx, acquireScript, req)
}

// Release implements driver.Leaser with one call of release.lua: one round
// trip.
func (b *Backend) Release(ctx context.Context, req driver.LeaseRequest) (driver.LeaseOutcome, error) {
	return b.runLease(ctx, releaseScript, req)
}

// runLease runs a lease script for req on the main client and reads its
// reply.
func (b *Backend) runLease(ctx context.Context, script *goredis.Script, req driver.LeaseRequest) (driver.LeaseOutcome, error) {
	if err := b.ready(); err != nil {
		return driver.LeaseOutcome{}, err
	}
	if err := req.Check(); err != nil {
		return driver.LeaseOutcome{}, err
	}
	keys := []string{b.LeaseKey(req.Limit, req.Identifier)}
	args := []any{req.Now.UnixMilli(), req.Limit.TTLMillis, req.Limit.Max, b.graceMs, req.Lease}
	reply, err := b.eval(ctx, b.client, script, false, keys, args, nil)
	if err != nil {
		return driver.LeaseOutcome{}, err
	}
	return parseLeaseReply(reply)
}

// parseLeaseReply reads a lease script's reply, {acquired, held, in_flight,
// next_expiry}. Anything else is ErrUnexpectedReply, never a panic.
func parseLeaseReply(reply any) (driver.LeaseOutcome, error) {
	items, ok := reply.([]any)
	if !ok || len(items) != 4 {
		return driver.LeaseOutcome{}, driver.Errorf("%w: %T of %d elements, want an array of 4", ErrUnexpectedReply, reply, len(items))
	}
	var ints [4]int64
	for i, item := range items {
		v, ok := item.(int64)
		if !ok {
			return driver.LeaseOutcome{}, driver.Errorf("%w: element %d is %T, want an integer", ErrUnexpectedReply, i, item)
		}
		ints[i] = v
	}
	if ints[0]&^1 != 0 || ints[1]&^1 != 0 || ints[2] < 0 || ints[3] < 0 {
		return driver.LeaseOutcome{}, driver.Errorf("%w: lease reply %v", ErrUnexpectedReply, ints)
	}
	return driver.LeaseOutcome{Acquired: ints[0] == 1, Held: ints[1] == 1, InFlight: ints[2], NextExpiry: ints[3]}, nil
}

// Decide implements driver.Backend with one call of decide.lua.
func (b *Backend) Decide(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	if err := b.ready(); err != nil {
		return driver.Outcome{}, err
	}
	return b.runScript(ctx, b.client, decideScript, false, req)
}

// Peek implements driver.Peeker with one call of the read-only peek.lua
// (EVALSHA_RO) on the read client (WithReadClient), or the main client.
func (b *Backend) Peek(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	if err := b.ready(); err != nil {
		return driver.Outcome{}, err
	}
	return b.runScript(ctx, b.reader, peekScript, true, req)
}

// Refund implements driver.Refunder with one call of refund.lua.
func (b *Backend) Refund(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	if err := b.ready(); err != nil {
		return driver.Outcome{}, err
	}
	return b.runScript(ctx, b.client, refundScript, false, req)
}

// Take implements driver.Taker with one call of take.lua.
func (b *Backend) Take(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	if err := b.ready(); err != nil {
		return driver.Outcome{}, err
	}
	return b.runScript(ctx, b.client, takeScript, false, req)
}

// Seed implements driver.Seeder with one call of seed.lua: the merge of
// given into the stored states (driver.Merge) and the decision of req.Cost
// on the result (driver.Decide) run in one script, so no other call falls
// between them. The states after the step are in Outcome.States and the
// states read before it in Outcome.Prior. given is checked before any round
// trip: driver.CheckGiven's rules, and no field above 2^53 - 1, which the
// script could not hold exactly (driver.ErrInvalidState).
func (b *Backend) Seed(ctx context.Context, req driver.Request, given []driver.State) (driver.Outcome, error) {
	if err := b.ready(); err != nil {
		return driver.Outcome{}, err
	}
	if err := checkRequest(req); err != nil {
		return driver.Outcome{}, err
	}
	if err := driver.CheckGiven(req.Policy, given); err != nil {
		return driver.Outcome{}, err
	}
	args := b.scriptArgs(req)
	for i, s := range given {
		if s.Used > maxExact || s.End > maxExact || s.Prev > maxExact {
			return driver.Outcome{}, driver.Errorf("%w: limit %q: %+v holds a field above 2^53 - 1", driver.ErrInvalidState, req.Policy.Limits[i].Name, s)
		}
		args = append(args, s.Used, s.End, s.Prev)
	}
	keys := []string{b.Key(req.Policy, req.Identifier)}
	reply, err := b.eval(ctx, b.client, seedScript, false, keys, args, nil)
	if err != nil {
		return driver.Outcome{}, err
	}
	return parseSeedReply(reply, req.Policy)
}

// Reset implements driver.Resetter: it deletes the identifier's key under
// the policy with one DEL, the state of every limit of the policy, and of
// any limit an earlier definition of it held, with it.
func (b *Backend) Reset(ctx context.Context, p *driver.Policy, identifier string) error {
	if err := b.ready(); err != nil {
		return err
	}
	if err := checkInput(p, identifier, 0); err != nil {
		return err
	}
	return b.del(ctx, b.Key(p, identifier))
}

// del deletes keys with one DEL on the main client.
func (b *Backend) del(ctx context.Context, keys ...string) error {
	_, err := await(ctx, b.client, func() (int64, error) { return b.client.Del(ctx, keys...).Result() })
	return err
}

// Ping implements driver.Pinger. It pings the main client and, when
// WithReadClient set one, the read client. A cluster client is pinged on
// every primary, since any of them may hold an identifier's slot. The first
// Ping that succeeds also reads the server's maxmemory-policy and, unless it
// is noeviction, logs a warning (see MaxmemoryPolicy and SetLogger).
func (b *Backend) Ping(ctx context.Context) error {
	if err := b.ready(); err != nil {
		return err
	}
	if err := ping(ctx, b.client); err != nil {
		return err
	}
	b.warnEviction(ctx)
	if b.ownReader {
		if err := ping(ctx, b.reader); err != nil {
			return driver.Errorf("throttlekit: redis: read client: %w", err)
		}
	}
	return nil
}

func ping(ctx context.Context, c conn) error {
	_, err := await(ctx, c, func() (struct{}, error) {
		if cc, ok := c.Client.(*goredis.ClusterClient); ok {
			return struct{}{}, cc.ForEachMaster(ctx, func(ctx context.Context, node *goredis.Client) error {
				return node.Ping(ctx).Err()
			})
		}
		return struct{}{}, c.Ping(ctx).Err()
	})
	return err
}

// runScript runs one of the scripts for req and reads its reply.
func (b *Backend) runScript(ctx context.Context, c conn, script *goredis.Script, readOnly bool, req driver.Request) (driver.Outcome, error) {
	if err := checkRequest(req); err != nil {
		return driver.Outcome{}, err
	}
	keys := []string{b.Key(req.Policy, req.Identifier)}
	pc := b.forPolicy(req.Policy)
	var policy *driver.Policy
	if script == decideScript {
		script, policy = pc.decide, req.Policy
	}
	reply, err := b.eval(ctx, c, script, readOnly, keys, b.argsFor(req, pc), policy)
	if err != nil {
		return driver.Outcome{}, err
	}
	return parseReply(reply, req.Policy, script == takeScript)
}

// eval runs script on c, through the batcher when there is one, retrying
// while its keys' slot is on the move (see tryAgainFirstBackoff).
//
// policy is the request's policy for a call of decide.lua, nil for others:
// the batcher carries decisions of one policy together.
func (b *Backend) eval(ctx context.Context, c conn, script *goredis.Script, readOnly bool, keys []string, args []any, policy *driver.Policy) (any, error) {
	var reply any
	var err error
	for backoff := tryAgainFirstBackoff; ; backoff = min(2*backoff, tryAgainMaxBackoff) {
		if c.batch != nil {
			reply, err = c.batch.run(ctx, script, readOnly, keys, args, policy)
		} else {
			reply, err = await(ctx, c, func() (any, error) {
				if readOnly {
					return script.RunRO(ctx, c, keys, args...).Result()
				}
				return script.Run(ctx, c, keys, args...).Result()
			})
		}
		if err == nil || !migrating(err) || !sleepCtx(ctx, backoff) {
			break
		}
	}
	if err != nil {
		b.noticeFailure(c, err)
		return nil, classify(err)
	}
	return reply, nil
}

// While a Cluster slot migrates, a script whose keys are split between the
// source and the target (MIGRATE moved some of them, not yet the others)
// gets TRYAGAIN (or, once go-redis has spent its redirects between the two
// nodes, the last ASK). The split lasts until the resharding tool's next MIGRATE,
// normally well under a millisecond, so the call is retried after a short
// pause, again and again while its context allows, instead of failing.
const (
	tryAgainFirstBackoff = time.Millisecond
	tryAgainMaxBackoff   = 20 * time.Millisecond
)

// migrating reports the replies of a slot on the move that go-redis
// passes on once its own redirects are spent: TRYAGAIN, and an ASK or MOVED
// it could not follow to the end.
func migrating(err error) bool {
	return goredis.HasErrorPrefix(err, "TRYAGAIN") || goredis.HasErrorPrefix(err, "ASK") ||
		goredis.HasErrorPrefix(err, "MOVED")
}

// sleepCtx sleeps for d, or less if ctx ends first, and reports whether the
// caller may go on: false when ctx would end within d.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) <= d {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// scriptArgs builds ARGV as the scripts read it: now in milliseconds and
// microseconds, the cost, the expiry grace, the number of limits, then each
// limit's algorithm, Max, window in milliseconds, capacity, emission
// interval and key.
//
// The limits' part is built once per policy and kept (the throttler makes
// one compiled policy per user policy, once, and never changes it), so a
// call boxes only its own three numbers.
func (b *Backend) scriptArgs(req driver.Request) []any {
	return b.argsFor(req, b.forPolicy(req.Policy))
}

// argsFor is scriptArgs with p's cached part at hand.
func (b *Backend) argsFor(req driver.Request, pc *policyCall) []any {
	args := make([]any, 4, 4+len(pc.limits))
	args[0], args[1], args[2], args[3] = req.Now.UnixMilli(), req.Now.UnixMicro(), req.Cost, b.graceMs
	return append(args, pc.limits...)
}

// policyCall is what every call under one policy shares: its limits'
// arguments and the lone script that decides it (decideScriptFor).
type policyCall struct {
	// limits is the number of limits, then each limit's algorithm, Max,
	// window in milliseconds, capacity, emission interval in microseconds
	// and key, boxed.
	limits []any
	decide *goredis.Script
}

// forPolicy returns p's policyCall from the cache, or built and cached.
// The cache holds policies by pointer, up to argsCacheMax of them: a
// program that makes policies on the fly gets them built per call past
// that, never a leak.
func (b *Backend) forPolicy(p *driver.Policy) *policyCall {
	if v, ok := b.argsCache.Load(p); ok {
		return v.(*policyCall)
	}
	pc := &policyCall{limits: make([]any, 0, 1+6*len(p.Limits)), decide: decideScriptFor(p)}
	pc.limits = append(pc.limits, int64(len(p.Limits)))
	for i := range len(p.Limits) {
		l := p.Limits[i]
		pc.limits = append(pc.limits, int64(l.Algorithm), l.Max, l.WindowMillis, l.Capacity, l.EmissionMicros, l.Key)
	}
	if b.argsCached.Load() < argsCacheMax {
		if _, loaded := b.argsCache.LoadOrStore(p, pc); !loaded {
			b.argsCached.Add(1)
		}
	}
	return pc
}

// argsCacheMax bounds the policies whose script arguments a Backend keeps.
const argsCacheMax = 4096

// checkRequest checks req as every script call needs it: checkInput, and a
// now whose microseconds the scripts hold exactly.
func checkRequest(req driver.Request) error {
	if err := checkInput(req.Policy, req.Identifier, req.Cost); err != nil {
		return err
	}
	if us := req.Now.UnixMicro(); us > maxExactMicros || us < -maxExactMicros {
		return driver.Errorf("%w: %v", driver.ErrInvalidOption, req.Now)
	}
	return nil
}

// checkInput repeats the throttler's checks for callers that use the
// backend directly, so that no input reaches Redis malformed.
func checkInput(p *driver.Policy, identifier string, cost int64) error {
	// The throttler validated the request; this only keeps a direct caller
	// that did not from reaching the server with nonsense.
	if !p.Valid() {
		return driver.Errorf("%w: nil or zero policy", driver.ErrInvalidPolicy)
	}
	if identifier == "" || cost < 0 {
		return driver.Errorf("%w: empty identifier or negative cost", driver.ErrInvalidOption)
	}
	return nil
}

// await runs f, a command on c under ctx, and returns no later than ctx's
// deadline. A client that honours deadlines runs f on the caller's
// goroutine. Otherwise f runs on a goroutine of its own, and once ctx is done
// await returns ctx's error and leaves that goroutine to finish when the
// client gives up on the command by its own timeouts (ReadTimeout once the
// command is sent; DialTimeout and PoolTimeout before). The abandoned
// command may still run on the server, as a command on a connection that
// timed out may. A context without a deadline that may still be cancelled
// takes that path too: go-redis watches deadlines, not cancellation, while a
// command is on the wire.
func await[T any](ctx context.Context, c conn, f func() (T, error)) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, err
	}
	_, hasDeadline := ctx.Deadline()
	if ctx.Done() == nil || !c.detached && hasDeadline {
		v, err := f()
		return v, withContextError(ctx, err)
	}
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := f()
		done <- result{v, err}
	}()
	r, ok := receive(ctx, done)
	if !ok {
		return zero, ctx.Err()
	}
	return r.v, withContextError(ctx, r.err)
}

// withContextError makes a failure that ended with ctx match ctx's error,
// so that a timed-out call reads the same (context.DeadlineExceeded)
// whichever way it ended. go-redis already reports a socket deadline it took
// from ctx that way; a client that reports a bare i/o timeout would not.
func withContextError(ctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, ctxErr) {
		return driver.Errorf("throttlekit: redis: %w: %w", ctxErr, err)
	}
	return err
}

// classify marks the errors that mean a key holds a value this backend did
// not write.
func classify(err error) error {
	if goredis.HasErrorPrefix(err, "WRONGTYPE") || goredis.HasErrorPrefix(err, foreignValueReply) {
		return driver.Errorf("%w: %w", ErrForeignValue, err)
	}
	return err
}

// stateFields is how many integers a reply holds for one state of limit
// l: the fields its algorithm keeps (append_states in common.lua). Used is
// always 0 for GCRA and Prev for all but sliding windows, so a reply
// carries neither: Redis turns fewer Lua numbers into replies, and the
// client parses fewer.
func stateFields(l *driver.Limit) int {
	switch l.Algorithm {
	case driver.GCRA:
		return 1 // End
	case driver.SlidingWindow:
		return 3 // Used, End, Prev
	}
	return 2 // Used, End
}

// replyLen is the length of a reply of first and one state per limit of p.
func replyLen(p *driver.Policy) int {
	n := 1
	for i := range p.Limits {
		n += stateFields(&p.Limits[i])
	}
	return n
}

// parseStates reads one state per limit of p from items, laid out as
// append_states lays them out, into states. items holds exactly those
// fields.
func parseStates(items []any, offset int, p *driver.Policy, states []driver.State) error {
	ints := func(j int) (int64, error) {
		v, ok := items[j].(int64)
		if !ok {
			return 0, driver.Errorf("%w: element %d is %T, want an integer", ErrUnexpectedReply, offset+j, items[j])
		}
		return v, nil
	}
	var err error
	j := 0
	for i := range states {
		s := &states[i]
		alg := p.Limits[i].Algorithm
		if alg != driver.GCRA {
			if s.Used, err = ints(j); err != nil {
				return err
			}
			j++
		}
		if s.End, err = ints(j); err != nil {
			return err
		}
		j++
		if alg == driver.SlidingWindow {
			if s.Prev, err = ints(j); err != nil {
				return err
			}
			j++
		}
	}
	return nil
}

// parseReply reads a script's reply, {allowed, then each limit's state as
// append_states in common.lua lays it out}, for policy p. Anything else is
// ErrUnexpectedReply, never a panic.
func parseReply(reply any, p *driver.Policy, take bool) (driver.Outcome, error) {
	items, ok := reply.([]any)
	if !ok {
		return driver.Outcome{}, driver.Errorf("%w: %T, want an array", ErrUnexpectedReply, reply)
	}
	if want := replyLen(p); len(items) != want {
		return driver.Outcome{}, driver.Errorf("%w: %d elements, want %d", ErrUnexpectedReply, len(items), want)
	}
	first, ok := items[0].(int64)
	if !ok {
		return driver.Outcome{}, driver.Errorf("%w: element 0 is %T, want an integer", ErrUnexpectedReply, items[0])
	}
	out := driver.Outcome{Allowed: first == 1, States: make([]driver.State, len(p.Limits))}
	switch {
	case take && first >= 0:
		out.Allowed, out.Granted = first > 0, first
	case take:
		return driver.Outcome{}, driver.Errorf("%w: %d units granted", ErrUnexpectedReply, first)
	case first != 0 && first != 1:
		return driver.Outcome{}, driver.Errorf("%w: verdict %d, want 0 or 1", ErrUnexpectedReply, first)
	}
	if err := parseStates(items[1:], 1, p, out.States); err != nil {
		return driver.Outcome{}, err
	}
	return out, nil
}

// parseSeedReply reads seed.lua's reply, {allowed, each limit's state,
// then each limit's state held before}, the states laid out as
// append_states in common.lua lays them out, for policy p. Anything else
// is ErrUnexpectedReply, never a panic.
func parseSeedReply(reply any, p *driver.Policy) (driver.Outcome, error) {
	items, ok := reply.([]any)
	if !ok {
		return driver.Outcome{}, driver.Errorf("%w: %T, want an array", ErrUnexpectedReply, reply)
	}
	half := replyLen(p)
	if len(items) != 2*half-1 {
		return driver.Outcome{}, driver.Errorf("%w: %d elements, want %d", ErrUnexpectedReply, len(items), 2*half-1)
	}
	out, err := parseReply(items[:half], p, false)
	if err != nil {
		return driver.Outcome{}, err
	}
	out.Prior = make([]driver.State, len(p.Limits))
	if err := parseStates(items[half:], half, p, out.Prior); err != nil {
		return driver.Outcome{}, err
	}
	return out, nil
}

// errNotInitialized is the error of every call on a Backend New did not
// build (a zero Backend, or a nil *Backend): it has no client to send to.
var errNotInitialized = driver.Errorf("%w: redis: Backend not built by New", driver.ErrNotInitialized)
