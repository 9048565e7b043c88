package rls

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/throttlekit/throttlekit/middleware/rls/config"
	"github.com/throttlekit/throttlekit/throttler"
)

// Sentinel errors. Every error New and ShouldRateLimit return wraps one of
// these (a request error also carries a gRPC status), so callers branch with
// errors.Is.
var (
	// ErrInvalidRequest reports a request the service refuses: an empty
	// domain, no descriptors, an empty entry key, a value too long, a
	// hits_addend too large, too many descriptors or entries. gRPC callers
	// get codes.InvalidArgument; /json callers get HTTP 400.
	ErrInvalidRequest = errors.New("throttlekit/rls: invalid request")
	// ErrUnknownDomain reports a domain no loaded configuration file
	// names. gRPC callers get codes.NotFound; /json callers get HTTP 400.
	// WithEnvoyCompat answers such requests OK, as envoy ratelimit does.
	ErrUnknownDomain = errors.New("throttlekit/rls: unknown domain")
	// ErrNoConfig reports a request made before any configuration was set.
	ErrNoConfig = errors.New("throttlekit/rls: no configuration loaded")
	// ErrStoreUnavailable reports a decision the store could not make while
	// the failure mode is FailError: gRPC callers get codes.Unavailable, so
	// that the proxy's own failure_mode_deny decides, as with envoy
	// ratelimit.
	ErrStoreUnavailable = errors.New("throttlekit/rls: store unavailable")
	// ErrInvalidOption reports an option New cannot use.
	ErrInvalidOption = errors.New("throttlekit/rls: invalid option")
)

// maxQuota is the largest Max a throttlekit limit takes; a hits_addend
// above it can never be counted, so it is refused as invalid input.
const maxQuota = 1 << 40

// Server answers Envoy's RateLimitService over gRPC and envoy ratelimit's
// /json endpoint over HTTP, deciding every descriptor with a
// throttler.Throttler on whatever store it was built with. Build it with
// New; it is safe for concurrent use, and SetConfig swaps the rules while
// requests are served.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer

	th      *throttler.Throttler
	o       options
	state   atomic.Pointer[snapshot]
	metrics *Metrics
	// overrides caches the policies of descriptors that carry their own
	// limit (Envoy's per-route limit override), keyed by policy name, limit
	// and unit.
	overrides sync.Map
	// overrideCount bounds overrides.
	overrideCount atomic.Int64
}

// snapshot is one configuration with the policies built from it.
type snapshot struct {
	cfg   *config.Config
	rules map[*config.Rule]*compiled
}

// compiled is what a rule needs on every request, built once per
// configuration: its policy, the limit its statuses report, and the window
// of a rule that blocks everything.
type compiled struct {
	policy *throttler.Policy
	limit  *rlsv3.RateLimitResponse_RateLimit
	unit   time.Duration
}

// FailureMode says what the service answers when the store cannot decide.
type FailureMode int

const (
	// FailOpen answers OK (the throttler's default): clients pass while the
	// store is down.
	FailOpen FailureMode = iota
	// FailClosed answers OVER_LIMIT.
	FailClosed
	// FailError answers the gRPC status Unavailable (HTTP 503 on /json), as
	// envoy ratelimit does when Redis fails, so that Envoy's own
	// failure_mode_deny decides.
	FailError
)

// String returns "open", "closed" or "error".
func (m FailureMode) String() string {
	switch m {
	case FailOpen:
		return "open"
	case FailClosed:
		return "closed"
	case FailError:
		return "error"
	}
	return "FailureMode(" + strconv.Itoa(int(m)) + ")"
}

// ParseFailureMode reads "open", "closed" or "error".
func ParseFailureMode(s string) (FailureMode, error) {
	switch s {
	case "open":
		return FailOpen, nil
	case "closed":
		return FailClosed, nil
	case "error":
		return FailError, nil
	}
	return 0, fmt.Errorf("%w: failure mode %q: want open, closed or error", ErrInvalidOption, s)
}

// Bounds limits what one request may hold. A request beyond any bound is
// refused with ErrInvalidRequest before anything is decided.
type Bounds struct {
	// Descriptors is the most descriptors one request may carry (32).
	Descriptors int
	// Entries is the most entries one descriptor may carry (16).
	Entries int
	// ValueBytes is the longest key or value of an entry, in bytes (256).
	ValueBytes int
	// RequestBytes is the largest request body /json and gRPC accept (64 KiB).
	RequestBytes int
}

// DefaultBounds are the bounds a Server has unless WithBounds says otherwise.
var DefaultBounds = Bounds{Descriptors: 32, Entries: 16, ValueBytes: 256, RequestBytes: 64 << 10}

// HeaderNames are the response headers the service asks Envoy to add
// (WithResponseHeaders). envoy ratelimit's defaults are RateLimit-Limit,
// RateLimit-Remaining and RateLimit-Reset; many teams set the x-ratelimit-*
// names instead.
type HeaderNames struct {
	Limit, Remaining, Reset string
}

// Option configures a Server.
type Option func(*options) error

type options struct {
	log            *slog.Logger
	failure        FailureMode
	envoyCompat    bool
	globalShadow   bool
	headers        *HeaderNames
	bounds         Bounds
	nearLimitRatio float64
	metrics        *Metrics
	maxOverrides   int64
	clock          func() time.Time
}

// WithLogger sets the logger for configuration changes and store failures
// (slog.Default() otherwise).
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", ErrInvalidOption)
		}
		o.log = l
		return nil
	}
}

// WithFailureMode sets what a decision becomes when the store fails,
// for rules whose configuration names no failure_mode (FailOpen by default).
func WithFailureMode(m FailureMode) Option {
	return func(o *options) error {
		if m < FailOpen || m > FailError {
			return fmt.Errorf("%w: failure mode %d", ErrInvalidOption, int(m))
		}
		o.failure = m
		return nil
	}
}

// WithEnvoyCompat makes the service count as envoy ratelimit does, for a
// team that needs the same numbers while it migrates: each descriptor is
// decided on its own (a request denied by one descriptor still spends the
// others' quota), a denied hit spends whatever its window had left (so a
// hits_addend larger than what remains empties the window, as envoy
// ratelimit's INCRBY past the limit does), and a request for an unknown
// domain is answered OK. Without it, a request's descriptors are decided all
// or nothing and a denied hit consumes nothing.
func WithEnvoyCompat() Option {
	return func(o *options) error { o.envoyCompat = true; return nil }
}

// WithGlobalShadowMode answers every request OK whatever it decided, as
// envoy ratelimit's SHADOW_MODE does; decisions are still made, counted and
// reported in metrics.
func WithGlobalShadowMode() Option {
	return func(o *options) error { o.globalShadow = true; return nil }
}

// WithResponseHeaders asks Envoy to add the limit, remaining and reset
// headers of the binding descriptor (the one over the limit, or the one with
// the least remaining) to the response, as envoy ratelimit's
// LIMIT_RESPONSE_HEADERS_ENABLED does. The reset header holds whole seconds
// until the stored end of the window, rounded up, so that every response of
// one window names the same moment. Empty names take envoy ratelimit's
// defaults.
func WithResponseHeaders(h HeaderNames) Option {
	return func(o *options) error {
		if h.Limit == "" {
			h.Limit = "RateLimit-Limit"
		}
		if h.Remaining == "" {
			h.Remaining = "RateLimit-Remaining"
		}
		if h.Reset == "" {
			h.Reset = "RateLimit-Reset"
		}
		o.headers = &h
		return nil
	}
}

// WithBounds sets the request bounds; zero fields keep DefaultBounds'.
func WithBounds(b Bounds) Option {
	return func(o *options) error {
		if b.Descriptors < 0 || b.Entries < 0 || b.ValueBytes < 0 || b.RequestBytes < 0 {
			return fmt.Errorf("%w: negative bound in %+v", ErrInvalidOption, b)
		}
		if b.Descriptors > 0 {
			o.bounds.Descriptors = b.Descriptors
		}
		if b.Entries > 0 {
			o.bounds.Entries = b.Entries
		}
		if b.ValueBytes > 0 {
			o.bounds.ValueBytes = b.ValueBytes
		}
		if b.RequestBytes > 0 {
			o.bounds.RequestBytes = b.RequestBytes
		}
		return nil
	}
}

// WithNearLimitRatio sets the share of a limit past which an allowed hit
// counts as near_limit in the metrics (0.8, envoy ratelimit's
// NEAR_LIMIT_RATIO).
func WithNearLimitRatio(r float64) Option {
	return func(o *options) error {
		if !(r > 0 && r <= 1) {
			return fmt.Errorf("%w: near-limit ratio %v: want 0 < r <= 1", ErrInvalidOption, r)
		}
		o.nearLimitRatio = r
		return nil
	}
}

// WithMetrics records envoy ratelimit's per-rule statistics in m.
func WithMetrics(m *Metrics) Option {
	return func(o *options) error {
		if m == nil {
			return fmt.Errorf("%w: nil metrics", ErrInvalidOption)
		}
		o.metrics = m
		return nil
	}
}

// WithClock sets the clock the service reads for rules that store nothing
// (requests_per_unit 0); it must be the throttler's clock (time.Now by
// default).
func WithClock(now func() time.Time) Option {
	return func(o *options) error {
		if now == nil {
			return fmt.Errorf("%w: nil clock", ErrInvalidOption)
		}
		o.clock = now
		return nil
	}
}

// New returns a Server deciding with th under cfg. cfg may be nil: requests
// then fail with ErrNoConfig until SetConfig gives one.
func New(th *throttler.Throttler, cfg *config.Config, opts ...Option) (*Server, error) {
	if th == nil {
		return nil, fmt.Errorf("%w: nil throttler", ErrInvalidOption)
	}
	o := options{
		log:            slog.Default(),
		bounds:         DefaultBounds,
		nearLimitRatio: 0.8,
		maxOverrides:   10000,
		clock:          time.Now,
	}
	for _, opt := range opts {
		if opt == nil {
			return nil, fmt.Errorf("%w: nil option", ErrInvalidOption)
		}
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	s := &Server{th: th, o: o, metrics: o.metrics}
	if cfg != nil {
		if err := s.SetConfig(cfg); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// SetConfig makes cfg the configuration every later request is decided
// under. Rules keep their stored windows across the swap: a rule's state is
// keyed by its path in the configuration and its windows, never by its
// requests_per_unit, so a rule that did not change keeps every open window
// and a raised or lowered requests_per_unit applies to the open window at
// once.
func (s *Server) SetConfig(cfg *config.Config) error {
	if cfg == nil {
		return fmt.Errorf("%w: nil configuration", ErrInvalidOption)
	}
	snap := &snapshot{cfg: cfg, rules: map[*config.Rule]*compiled{}}
	for _, r := range cfg.Rules() {
		c := &compiled{unit: unitDuration(r.Unit)}
		snap.rules[r] = c
		if !r.Unlimited {
			// Shared by every response of the rule: statuses only read it.
			c.limit = &rlsv3.RateLimitResponse_RateLimit{
				Name:            r.Name,
				RequestsPerUnit: r.RequestsPerUnit,
				Unit:            unitOf(c.unit),
			}
		}
		if r.Limits == nil {
			continue
		}
		var popts []throttler.Option
		switch r.FailureMode {
		case "open":
			popts = append(popts, throttler.WithFailureMode(throttler.FailOpen))
		case "closed":
			popts = append(popts, throttler.WithFailureMode(throttler.FailClosed))
		default:
			if s.o.failure == FailClosed {
				popts = append(popts, throttler.WithFailureMode(throttler.FailClosed))
			}
		}
		p, err := throttler.NewPolicy(r.FullKey, r.Limits, popts...)
		if err != nil {
			return fmt.Errorf("%w: rule %s: %w", ErrInvalidOption, r.FullKey, err)
		}
		c.policy = p
	}
	s.state.Store(snap)
	if s.metrics != nil {
		s.metrics.configLoaded()
	}
	return nil
}

// Config returns the configuration in force, or nil.
func (s *Server) Config() *config.Config {
	if snap := s.state.Load(); snap != nil {
		return snap.cfg
	}
	return nil
}

// item is one descriptor of a request on its way to a status.
type item struct {
	match    config.Match
	rule     *config.Rule
	policy   *throttler.Policy
	id       string
	cost     int64
	shadow   bool
	quota    bool
	override *rlsv3.RateLimitResponse_RateLimit // the descriptor's own limit
	limit    *rlsv3.RateLimitResponse_RateLimit // the rule's, shared
	blocks   bool
	unit     time.Duration // the unit of a blocking rule

	result  throttler.Result
	err     error
	decided bool
}

// ShouldRateLimit implements Envoy's RateLimitService: it decides every
// descriptor of the request and answers OVER_LIMIT when any enforced one is
// over its limit. Errors carry a gRPC status and wrap ErrInvalidRequest,
// ErrUnknownDomain, ErrNoConfig or ErrStoreUnavailable.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	resp, err := s.decide(ctx, req)
	if err != nil {
		if s.metrics != nil {
			s.metrics.requestError(err)
		}
		return nil, toStatus(err)
	}
	return resp, nil
}

// statusError is an error that is also a gRPC status.
type statusError struct {
	err  error
	code codes.Code
}

func (e *statusError) Error() string { return e.err.Error() }
func (e *statusError) Unwrap() error { return e.err }

// GRPCStatus lets status.FromError and the gRPC server read the code.
func (e *statusError) GRPCStatus() *status.Status { return status.New(e.code, e.err.Error()) }

// toStatus wraps err with the gRPC code its sentinel stands for.
func toStatus(err error) error {
	code := codes.Internal
	switch {
	case errors.Is(err, ErrInvalidRequest):
		code = codes.InvalidArgument
	case errors.Is(err, ErrUnknownDomain):
		code = codes.NotFound
	case errors.Is(err, ErrNoConfig):
		code = codes.FailedPrecondition
	case errors.Is(err, ErrStoreUnavailable):
		code = codes.Unavailable
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	}
	return &statusError{err: err, code: code}
}

// invalid returns an ErrInvalidRequest error.
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidRequest, fmt.Sprintf(format, args...))
}

func (s *Server) decide(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	snap := s.state.Load()
	if snap == nil {
		return nil, ErrNoConfig
	}
	if req == nil {
		return nil, invalid("nil request")
	}
	if req.Domain == "" {
		return nil, invalid("empty domain")
	}
	if len(req.Descriptors) == 0 {
		return nil, invalid("no descriptors")
	}
	b := s.o.bounds
	if len(req.Descriptors) > b.Descriptors {
		return nil, invalid("%d descriptors, at most %d", len(req.Descriptors), b.Descriptors)
	}
	if len(req.Domain) > b.ValueBytes {
		return nil, invalid("domain of %d bytes, at most %d", len(req.Domain), b.ValueBytes)
	}
	known := snap.cfg.HasDomain(req.Domain)
	if !known && !s.o.envoyCompat {
		return nil, fmt.Errorf("%w %q", ErrUnknownDomain, req.Domain)
	}
	items := make([]item, len(req.Descriptors))
	entries := make([]config.Entry, 0, 4)
	replaced := map[string]bool(nil)
	for i, d := range req.Descriptors {
		if d == nil || len(d.Entries) == 0 {
			return nil, invalid("descriptor %d has no entries", i)
		}
		if len(d.Entries) > b.Entries {
			return nil, invalid("descriptor %d has %d entries, at most %d", i, len(d.Entries), b.Entries)
		}
		entries = entries[:0]
		for j, e := range d.Entries {
			if e == nil || e.Key == "" {
				return nil, invalid("descriptor %d entry %d has an empty key", i, j)
			}
			if len(e.Key) > b.ValueBytes || len(e.Value) > b.ValueBytes {
				return nil, invalid("descriptor %d entry %d: key or value longer than %d bytes", i, j, b.ValueBytes)
			}
			entries = append(entries, config.Entry{Key: e.Key, Value: e.Value})
		}
		it := &items[i]
		cost := int64(1)
		if d.HitsAddend != nil {
			if d.HitsAddend.Value > maxQuota {
				return nil, invalid("descriptor %d hits_addend %d, at most %d", i, d.HitsAddend.Value, int64(maxQuota))
			}
			cost = int64(d.HitsAddend.Value)
		} else if req.HitsAddend > 1 {
			cost = int64(req.HitsAddend)
		}
		it.cost = cost
		if !known {
			continue
		}
		if d.Limit != nil {
			if err := s.overrideItem(it, req.Domain, d); err != nil {
				return nil, err
			}
			continue
		}
		it.match = snap.cfg.Lookup(req.Domain, entries)
		r := it.match.Rule
		if r == nil {
			continue
		}
		if len(it.match.CacheKey) > 1024 {
			return nil, invalid("descriptor %d names a counter of %d bytes, at most 1024", i, len(it.match.CacheKey))
		}
		for _, name := range r.Replaces {
			if replaced == nil {
				replaced = map[string]bool{}
			}
			replaced[name] = true
		}
		if r.Unlimited {
			it.rule = r
			continue
		}
		it.rule = r
		it.shadow = r.ShadowMode
		it.quota = r.QuotaMode
		it.id = it.match.CacheKey
		c := snap.rules[r]
		if c == nil {
			return nil, fmt.Errorf("throttlekit/rls: rule %s is not in the configuration it was looked up in", r.FullKey)
		}
		it.limit = c.limit
		if r.Blocks {
			it.blocks = true
			it.unit = c.unit
			continue
		}
		it.policy = c.policy
	}
	// A rule another matched rule replaces is not applied at all.
	if replaced != nil {
		for i := range items {
			if r := items[i].rule; r != nil && r.Name != "" && replaced[r.Name] {
				items[i] = item{cost: items[i].cost}
			}
		}
	}
	if err := s.run(ctx, items); err != nil {
		return nil, err
	}
	return s.respond(items)
}

// overrideItem fills an item for a descriptor that carries its own limit
// (Envoy's per-route override): a policy of one aligned window named as
// envoy ratelimit names the descriptor's statistics.
func (s *Server) overrideItem(it *item, domain string, d *commonv3.RateLimitDescriptor) error {
	unit := rlsv3.RateLimitResponse_RateLimit_Unit(d.Limit.Unit)
	window := unitWindow(unit)
	if window == 0 {
		return invalid("descriptor limit override has unit %v", d.Limit.Unit)
	}
	name := domain
	key := domain
	for _, e := range d.Entries {
		name += "." + e.Key
		if e.Value != "" {
			name += "_" + e.Value
		}
		key += "_" + e.Key + "_" + e.Value
	}
	if len(key) > 1024 {
		return invalid("descriptor names a counter of %d bytes, at most 1024", len(key))
	}
	it.id = key
	it.override = &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: d.Limit.RequestsPerUnit, Unit: unit}
	it.match = config.Match{CacheKey: key, MetricKey: name}
	if d.Limit.RequestsPerUnit == 0 {
		it.blocks = true
		it.unit = window
		return nil
	}
	cacheKey := name + "\x00" + strconv.FormatUint(uint64(d.Limit.RequestsPerUnit), 10) + "\x00" + unit.String()
	if p, ok := s.overrides.Load(cacheKey); ok {
		it.policy = p.(*throttler.Policy)
		return nil
	}
	p, err := throttler.NewPolicy(name, []throttler.Limit{
		throttler.Per(int64(d.Limit.RequestsPerUnit), window).Using(throttler.AlignedWindow),
	})
	if err != nil {
		return invalid("descriptor limit override: %v", err)
	}
	if s.overrideCount.Load() < s.o.maxOverrides {
		if _, loaded := s.overrides.LoadOrStore(cacheKey, p); !loaded {
			s.overrideCount.Add(1)
		}
	}
	it.policy = p
	return nil
}

// unitWindow is the window of an envoy ratelimit unit, 0 for UNKNOWN.
func unitWindow(u rlsv3.RateLimitResponse_RateLimit_Unit) time.Duration {
	switch u {
	case rlsv3.RateLimitResponse_RateLimit_SECOND:
		return time.Second
	case rlsv3.RateLimitResponse_RateLimit_MINUTE:
		return time.Minute
	case rlsv3.RateLimitResponse_RateLimit_HOUR:
		return time.Hour
	case rlsv3.RateLimitResponse_RateLimit_DAY:
		return 24 * time.Hour
	case rlsv3.RateLimitResponse_RateLimit_WEEK:
		return 7 * 24 * time.Hour
	case rlsv3.RateLimitResponse_RateLimit_MONTH:
		return 30 * 24 * time.Hour
	case rlsv3.RateLimitResponse_RateLimit_YEAR:
		return 365 * 24 * time.Hour
	}
	return 0
}

// unitOf is the envoy ratelimit unit of a window, UNKNOWN when it is none.
func unitOf(window time.Duration) rlsv3.RateLimitResponse_RateLimit_Unit {
	for u := rlsv3.RateLimitResponse_RateLimit_SECOND; u <= rlsv3.RateLimitResponse_RateLimit_WEEK; u++ {
		if unitWindow(u) == window {
			return u
		}
	}
	return rlsv3.RateLimitResponse_RateLimit_UNKNOWN
}

// unitDuration is the window of a unit named as in the configuration.
func unitDuration(name string) time.Duration {
	v, ok := rlsv3.RateLimitResponse_RateLimit_Unit_value[upper(name)]
	if !ok {
		return 0
	}
	return unitWindow(rlsv3.RateLimitResponse_RateLimit_Unit(v))
}

// upper is strings.ToUpper for the ASCII unit names.
func upper(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'a' <= c && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}

// run decides every item that has a policy. Items of different counters
// are decided concurrently, so that a store that batches (Redis) sends them
// in one round trip; items of one counter (the same descriptor twice in a
// request) are decided one after the other, in request order, as envoy
// ratelimit's pipeline counts them. Without WithEnvoyCompat a request is
// all or nothing: when an enforced item is denied, the units the other
// enforced items were granted are refunded. Shadow-mode items never deny
// the request.
func (s *Server) run(ctx context.Context, items []item) error {
	// lead[i] is the first item of i's counter; leads lists each counter's
	// first item.
	var leadBuf, leadsBuf [8]int
	lead, leads := leadBuf[:0], leadsBuf[:0]
	n := 0
	for i := range items {
		lead = append(lead, i)
		if items[i].policy == nil {
			continue
		}
		n++
		for j := range i {
			if items[j].policy == items[i].policy && items[j].id == items[i].id {
				lead[i] = lead[j]
				break
			}
		}
		if lead[i] == i {
			leads = append(leads, i)
		}
	}
	chain := func(l int) {
		for i := l; i < len(items); i++ {
			if items[i].policy != nil && lead[i] == l {
				s.decideItem(ctx, &items[i])
			}
		}
	}
	switch len(leads) {
	case 0:
		return nil
	case 1:
		chain(leads[0])
	default:
		var wg sync.WaitGroup
		for _, l := range leads[1:] {
			wg.Add(1)
			go func() {
				defer wg.Done()
				chain(l)
			}()
		}
		chain(leads[0])
		wg.Wait()
	}
	for i := range items {
		it := &items[i]
		if it.err != nil {
			return it.err
		}
		// FailError hands a store failure to the caller, unless the rule
		// names its own failure mode.
		if it.decided && it.result.Degraded && s.o.failure == FailError && (it.rule == nil || it.rule.FailureMode == "") {
			return fmt.Errorf("%w: %w", ErrStoreUnavailable, it.result.Err)
		}
	}
	if s.o.envoyCompat || n == 1 {
		return nil
	}
	denied := false
	for i := range items {
		it := &items[i]
		if it.decided && !it.shadow && !it.result.Allowed && it.cost > 0 {
			denied = true
			break
		}
	}
	if !denied {
		return nil
	}
	// All or nothing: give back what the allowed enforced items took.
	for i := range items {
		it := &items[i]
		if !it.decided || it.shadow || !it.result.Allowed || it.result.Granted == 0 || it.result.Degraded {
			continue
		}
		r, err := s.th.Refund(ctx, it.policy, it.id, it.result.Granted)
		if err != nil {
			s.o.log.Warn("throttlekit/rls: refund failed", "policy", it.policy.Name(), "identifier", it.id, "err", err)
			continue
		}
		r.Allowed = true
		it.result = r
	}
	return nil
}

// decideItem decides one item: a cost of 0 only reads (envoy's hits_addend
// 0 checks without counting).
func (s *Server) decideItem(ctx context.Context, it *item) {
	var r throttler.Result
	var err error
	if it.cost == 0 {
		r, err = s.th.Peek(ctx, it.policy, it.id)
	} else {
		r, err = s.th.AllowN(ctx, it.policy, it.id, it.cost)
		if s.o.envoyCompat && err == nil && !r.Allowed && !r.Degraded && r.Remaining > 0 {
			// envoy ratelimit counts a denied hit: what the window had left
			// is spent, so the next hit finds it empty there too.
			if spent, err2 := s.th.AllowUpTo(ctx, it.policy, it.id, it.cost); err2 == nil && spent.Granted > 0 {
				r.Remaining = spent.Remaining
				r.Used = spent.Used
			}
		}
	}
	if errors.Is(err, throttler.ErrCostExceedsLimit) {
		err = nil // a denial that waiting cannot change: OVER_LIMIT
	}
	if err != nil {
		if ctx.Err() != nil {
			it.err = ctx.Err()
		} else {
			it.err = invalid("%v", err)
		}
		return
	}
	it.result = r
	it.decided = true
}

// respond turns decided items into Envoy's response.
func (s *Server) respond(items []item) (*rlsv3.RateLimitResponse, error) {
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(items)),
	}
	binding := -1
	var bindingRemaining uint32 = math.MaxUint32
	var bindingReset time.Duration
	for i := range items {
		it := &items[i]
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		resp.Statuses[i] = st
		var reset time.Duration
		switch {
		case it.rule == nil && it.override == nil:
			// No rule applies: OK, no limit.
			continue
		case it.rule != nil && it.rule.Unlimited:
			st.LimitRemaining = math.MaxUint32
			if s.metrics != nil {
				s.metrics.unlimited(it)
			}
			continue
		case it.blocks:
			now := s.o.clock()
			reset = untilAligned(now, it.unit)
			st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			st.CurrentLimit = it.currentLimit()
			st.DurationUntilReset = durationpb.New(reset)
			if s.metrics != nil {
				s.metrics.record(it, 0, 0, false, s.o.nearLimitRatio)
			}
		case it.decided:
			r := &it.result
			reset = r.ResetAt.Sub(r.At)
			if reset < 0 {
				reset = 0
			}
			if !r.Allowed {
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			}
			st.CurrentLimit = it.currentLimit()
			if st.CurrentLimit != nil && r.Limit != int64(st.CurrentLimit.RequestsPerUnit) {
				// A rule of several windows reports the binding one.
				st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{
					Name:            it.currentName(),
					RequestsPerUnit: clampUint32(r.Limit),
					Unit:            unitOf(r.Window),
				}
			}
			st.LimitRemaining = clampUint32(r.Remaining)
			st.DurationUntilReset = durationpb.New(reset)
			if s.metrics != nil {
				s.metrics.record(it, r.Limit, r.Used, r.Allowed, s.o.nearLimitRatio)
			}
		default:
			continue
		}
		if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT && (it.shadow || it.quota) {
			st.Code = rlsv3.RateLimitResponse_OK
		}
		if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			if binding < 0 || resp.Statuses[binding].Code != rlsv3.RateLimitResponse_OVER_LIMIT || reset > bindingReset {
				binding, bindingRemaining, bindingReset = i, 0, reset
			}
		} else if st.CurrentLimit != nil && (binding < 0 || resp.Statuses[binding].Code != rlsv3.RateLimitResponse_OVER_LIMIT) &&
			(st.LimitRemaining < bindingRemaining || binding < 0) {
			binding, bindingRemaining, bindingReset = i, st.LimitRemaining, reset
		}
	}
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT && s.o.globalShadow {
		resp.OverallCode = rlsv3.RateLimitResponse_OK
		if s.metrics != nil {
			s.metrics.globalShadow()
		}
	}
	if s.o.headers != nil && binding >= 0 {
		st := resp.Statuses[binding]
		resetSeconds := int64((bindingReset + time.Second - 1) / time.Second)
		resp.ResponseHeadersToAdd = []*corev3.HeaderValue{
			{Key: s.o.headers.Limit, Value: strconv.FormatUint(uint64(st.CurrentLimit.GetRequestsPerUnit()), 10)},
			{Key: s.o.headers.Remaining, Value: strconv.FormatUint(uint64(st.LimitRemaining), 10)},
			{Key: s.o.headers.Reset, Value: strconv.FormatInt(resetSeconds, 10)},
		}
	}
	return resp, nil
}

// currentLimit is the limit a status reports for the item.
func (it *item) currentLimit() *rlsv3.RateLimitResponse_RateLimit {
	if it.override != nil {
		return it.override
	}
	return it.limit
}

// currentName names the binding limit of a rule of several windows.
func (it *item) currentName() string {
	if it.rule != nil && it.rule.Name != "" {
		return it.rule.Name
	}
	return it.result.Binding
}

// untilAligned is how long until the clock-aligned window of length unit
// that holds now ends.
func untilAligned(now time.Time, unit time.Duration) time.Duration {
	if unit <= 0 {
		return 0
	}
	ms := now.UnixMilli()
	w := unit.Milliseconds()
	return time.Duration(w-ms%w) * time.Millisecond
}

// clampUint32 fits n into a uint32 field.
func clampUint32(n int64) uint32 {
	if n < 0 {
		return 0
	}
	if n > math.MaxUint32 {
		return math.MaxUint32
	}
	return uint32(n)
}
