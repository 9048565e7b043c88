package legacybackend

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// ResetSuffix ends the name of a memcached counter's reset key: the
// counter "rl:42" has its window end under "rl:42:reset_at".
const ResetSuffix = ":reset_at"

// MaxKeyLen is the longest key memcached accepts, in bytes. A counter key
// must leave room for ResetSuffix within it.
const MaxKeyLen = 250

// maxDefaultKeyLen is the longest counter key DefaultKey returns, so that
// the reset key fits in MaxKeyLen.
const maxDefaultKeyLen = MaxKeyLen - len(ResetSuffix)

// KeyFunc returns the key under which the hand-written limiter counts
// policy's requests for identifier: the key its code raises with INCR.
// It receives the policy's name and the identifier exactly as the
// throttler does, unescaped. An empty key means that the legacy limiter
// keeps no counter for this pair: the backend then reports nothing,
// without a round trip.
type KeyFunc func(policy, identifier string) string

// DefaultKey is the KeyFunc used unless WithKeyFunc says otherwise:
// "<policy>:<identifier>", each part escaped with driver.EscapeKey, so
// the key holds no space, control byte or colon of its own and distinct
// pairs never share one. A key longer than 241 bytes (MaxKeyLen less
// ResetSuffix) is replaced by "#" and the hex SHA-256 of the escaped form;
// '#' never appears in an escaped part, so a hashed key never equals a
// plain one.
func DefaultKey(policy, identifier string) string {
	k := driver.EscapeKey(policy) + ":" + driver.EscapeKey(identifier)
	if len(k) <= maxDefaultKeyLen {
		return k
	}
	sum := sha256.Sum256([]byte(k))
	return "#" + hex.EncodeToString(sum[:])
}

// Matcher reports whether limit l of policy p is the one the legacy
// counter stands for. The backends ask it about the policy's FixedWindow
// limits in order and give the legacy window to the first one it accepts;
// limits of other algorithms are never asked, since their states mean
// something else than a count and a window end.
type Matcher func(p *driver.Policy, l *driver.Limit) bool

// MatchWindow returns the Matcher that accepts every FixedWindow limit of
// the given window, whatever its policy; a window of 0 accepts every
// FixedWindow limit. It is the default: NewMemcached's with its window,
// NewRedis's with WithWindow's (0 unless set).
func MatchWindow(window time.Duration) Matcher {
	return func(_ *driver.Policy, l *driver.Limit) bool {
		return l.Algorithm == driver.FixedWindow && (window == 0 || l.Window == window)
	}
}

// Option configures a Memcached, a Redis or an EnvoyRedis. An option that does not apply
// to the backend it is given to makes its constructor fail with
// driver.ErrInvalidOption.
type Option interface {
	apply(*options) error
}

// optionFunc adapts a function to Option.
type optionFunc func(*options) error

func (f optionFunc) apply(o *options) error { return f(o) }

// setOption returns the Option named name that runs f.
func setOption(name string, f func(*options)) Option {
	return optionFunc(func(o *options) error { f(o); o.mark(name); return nil })
}

// options holds what the options set; set records which ones were given,
// so that a constructor can refuse those that do not apply to it.
type options struct {
	key         KeyFunc
	match       Matcher
	resetMillis bool
	rounding    ResetRounding
	window      time.Duration
	noTTL       time.Duration
	deciding    bool
	logger      *slog.Logger
	set         map[string]bool
}

func (o *options) mark(name string) {
	if o.set == nil {
		o.set = make(map[string]bool)
	}
	o.set[name] = true
}

// WithKeyFunc sets the function that names the legacy counter of a
// (policy, identifier) pair: DefaultKey unless set. Give it the naming
// the hand-written limiter uses, or nothing will ever be found.
func WithKeyFunc(f KeyFunc) Option {
	return setOption("WithKeyFunc", func(o *options) { o.key = f })
}

// WithMatcher sets which FixedWindow limit of a policy receives the legacy
// window: the first one m accepts. The default is MatchWindow of the
// legacy window. Pair the counter with a limit of the legacy window's
// length: the window is reported as the legacy store holds it, however
// long that limit's own window is.
func WithMatcher(m Matcher) Option {
	return setOption("WithMatcher", func(o *options) { o.match = m })
}

// WithResetMillis reads the memcached reset key as Unix milliseconds
// instead of Unix seconds: the same as WithResetRounding(Millis).
// NewMemcached only.
func WithResetMillis() Option {
	return setOption("WithResetMillis", func(o *options) { o.resetMillis = true })
}

// ResetRounding says how the hand-written memcached limiter computes the
// end of a window it opens, which a Deciding Memcached must compute alike
// so that a window either of them opens ends at the same moment.
type ResetRounding int

const (
	// RoundUp is the end in Unix seconds, the request's now plus the
	// window rounded up to a whole second: what code that writes
	// now.Add(window) rounded up to the next second does. The default.
	RoundUp ResetRounding = iota + 1
	// RoundDown is the end in Unix seconds rounded down: what code that
	// writes now.Unix() + window (time.Now().Unix() + 60, the most common
	// form) or now.Add(window).Unix() does.
	RoundDown
	// Millis is the end in Unix milliseconds (now plus the window, to the
	// millisecond): what code that writes now.UnixMilli() + window does.
	// The reset key is then read as milliseconds too, as WithResetMillis
	// reads it.
	Millis
)

// String returns the rounding's name: "RoundUp", "RoundDown" or "Millis".
func (r ResetRounding) String() string {
	switch r {
	case RoundUp:
		return "RoundUp"
	case RoundDown:
		return "RoundDown"
	case Millis:
		return "Millis"
	}
	return "ResetRounding(" + strconv.Itoa(int(r)) + ")"
}

// WithResetRounding says how the hand-written memcached limiter computes
// the end of a window it opens (RoundUp unless set; Millis is the same as
// WithResetMillis): a Deciding Memcached opens windows with the same end.
// Give the rounding of the old code's own line, now.Unix() + window being
// RoundDown. A Deciding Memcached checks it against the legacy keys it
// reads: a window the old code opened whose end shows another rounding is
// counted in Stats.RoundingMismatched and logged once (see the package
// documentation, "Rounding"). NewMemcached only; any other value than the
// three constants, or RoundDown with a window shorter than a second, is an
// error wrapping driver.ErrInvalidOption.
func WithResetRounding(r ResetRounding) Option {
	return optionFunc(func(o *options) error {
		if r != RoundUp && r != RoundDown && r != Millis {
			return driver.Errorf("%w: legacy: WithResetRounding(%v): want RoundUp, RoundDown or Millis", driver.ErrInvalidOption, r)
		}
		o.rounding = r
		o.mark("WithResetRounding")
		return nil
	})
}

// WithWindow sets the window the legacy Redis code gives its counters
// with EXPIRE, so that the default matcher picks the FixedWindow limit of
// that window (MatchWindow(d)). Without it the first FixedWindow limit of
// each policy is picked, which is right for policies with one. A Deciding
// Redis needs it: it is the TTL a window the new code opens is given. It
// must be MinWindow to MaxWindow, in whole milliseconds. NewRedis only:
// memcached takes its window as an argument.
func WithWindow(d time.Duration) Option {
	return setOption("WithWindow", func(o *options) { o.window = d })
}

// WithNoTTLWindow reads a Redis counter that has no TTL (legacy code whose
// EXPIRE never ran, say after a crash between INCR and EXPIRE) as a window
// ending d after the request's now, instead of as absent. The legacy code
// would count such a key forever; this bounds what the new store takes
// from it to one window. A Deciding Redis gives such a key a TTL when it
// counts in it: d, or the window of WithWindow without this option. d must
// be MinWindow to MaxWindow, in whole milliseconds. NewRedis only.
func WithNoTTLWindow(d time.Duration) Option {
	return setOption("WithNoTTLWindow", func(o *options) { o.noTTL = d })
}

// Deciding makes a Memcached, a Redis or an EnvoyRedis decide in the
// legacy format as well as read it, so that new code can count in the
// same place and the same way as the hand-written limiter (or envoy
// ratelimit) while old processes still run beside it (a rolling deploy):
// Decide raises the legacy counter, denied requests included, and opens a
// window as the old code does; Seed writes the legacy format. NewRedis
// needs WithWindow with it. See the package documentation, "Deciding",
// "Deciding on Redis" and "envoy ratelimit".
func Deciding() Option {
	return setOption("Deciding", func(o *options) { o.deciding = true })
}

// WithLogger sets where the backend logs its warnings (a policy none of
// whose limits the legacy window matches, once per policy; a legacy
// rounding other than the one configured, once); nil logs nothing. It wins over SetLogger: with it, throttler.WithLogger leaves
// this backend's logger alone. Without it, the backend logs to
// slog.Default() until SetLogger is called.
func WithLogger(l *slog.Logger) Option {
	return setOption("WithLogger", func(o *options) { o.logger = l })
}

// buildOptions applies opts over the defaults and refuses those named in
// notFor, which do not apply to the calling constructor.
func buildOptions(backend string, opts []Option, notFor ...string) (options, error) {
	o := options{key: DefaultKey}
	for _, opt := range opts {
		if opt == nil {
			return options{}, driver.Errorf("%w: legacy: nil option", driver.ErrInvalidOption)
		}
		if err := opt.apply(&o); err != nil {
			return options{}, err
		}
	}
	for _, name := range notFor {
		// WithResetRounding is the general form of WithResetMillis: a
		// backend that refuses one refuses both.
		for _, n := range append([]string{name}, impliedRefusals[name]...) {
			if o.set[n] {
				return options{}, driver.Errorf("%w: legacy: %s does not apply to %s", driver.ErrInvalidOption, n, backend)
			}
		}
	}
	if o.set["WithResetRounding"] {
		switch {
		case o.rounding == Millis:
			o.resetMillis = true
		case o.resetMillis:
			return options{}, driver.Errorf("%w: legacy: WithResetMillis and WithResetRounding(%v) disagree", driver.ErrInvalidOption, o.rounding)
		}
	}
	if o.rounding == 0 {
		o.rounding = RoundUp
		if o.resetMillis {
			o.rounding = Millis
		}
	}
	switch {
	case o.key == nil:
		return options{}, driver.Errorf("%w: legacy: nil key function", driver.ErrInvalidOption)
	case o.set["WithMatcher"] && o.match == nil:
		return options{}, driver.Errorf("%w: legacy: nil matcher", driver.ErrInvalidOption)
	}
	if o.set["WithWindow"] {
		if err := checkWindow("WithWindow", o.window); err != nil {
			return options{}, err
		}
	}
	if o.set["WithNoTTLWindow"] {
		if err := checkWindow("WithNoTTLWindow", o.noTTL); err != nil {
			return options{}, err
		}
	}
	return o, nil
}

// impliedRefusals names, for an option a constructor refuses, the options
// that it refuses with it.
var impliedRefusals = map[string][]string{"WithResetMillis": {"WithResetRounding"}}

// checkWindow refuses a window no limit could have.
func checkWindow(what string, d time.Duration) error {
	if d < driver.MinWindow || d > driver.MaxWindow || d%time.Millisecond != 0 {
		return driver.Errorf("%w: legacy: %s %v: must be %v to %v in whole milliseconds", driver.ErrInvalidOption, what, d, driver.MinWindow, driver.MaxWindow)
	}
	return nil
}

// Stats are a backend's counters since it was built.
type Stats struct {
	// Reads counts round trips to the legacy store.
	Reads uint64
	// Found counts reads that returned a legacy window in force. When it
	// stops growing for a horizon, no new decision needs the legacy store
	// any more.
	Found uint64
	// Malformed counts reads that failed with driver.ErrBadReply.
	Malformed uint64
	// Unmatched counts calls for a policy none of whose FixedWindow limits
	// the matcher accepts: nothing is read for them, so no legacy window
	// is carried. The first one per policy is logged as a warning. A
	// count that grows for a policy the legacy limiter counted means the
	// legacy window given to the backend is not the legacy limiter's.
	Unmatched uint64
	// Decided counts decisions a Deciding backend made in the legacy
	// store; Opened those of them that opened a window there.
	Decided, Opened uint64
	// Seeded counts Seed calls that wrote a window into the legacy store,
	// or raised its count.
	Seeded uint64
	// Contended counts attempts a Deciding Memcached started again because
	// another writer changed the legacy keys between its read and its
	// write (a CAS conflict, an add that found the key).
	Contended uint64
	// RoundingChecked counts the windows a Deciding Memcached read whose
	// end told how their opener rounded it (see the package
	// documentation, "Rounding"); RoundingMismatched those of them that
	// showed another rounding than the one configured
	// (WithResetRounding). The first mismatch is logged as a warning. A
	// count that grows means that windows the old code opens and windows
	// the new code opens end at different moments: fix the setting.
	RoundingChecked, RoundingMismatched uint64
}

// counters holds the Stats of one backend.
type counters struct {
	reads, found, malformed, unmatched  atomic.Uint64
	decided, opened, seeded, contended  atomic.Uint64
	roundingChecked, roundingMismatched atomic.Uint64
}

func (c *counters) snapshot() Stats {
	return Stats{
		Reads: c.reads.Load(), Found: c.found.Load(), Malformed: c.malformed.Load(), Unmatched: c.unmatched.Load(),
		Decided: c.decided.Load(), Opened: c.opened.Load(), Seeded: c.seeded.Load(), Contended: c.contended.Load(),
		RoundingChecked: c.roundingChecked.Load(), RoundingMismatched: c.roundingMismatched.Load(),
	}
}

// reader is what the two backends share: which limit the legacy counter
// stands for, its key, and the shape of an answer.
type reader struct {
	name   string        // "memcached" or "redis", for errors
	window time.Duration // the legacy window, 0 when unknown (NewRedis without WithWindow)
	key    KeyFunc
	match  Matcher
	stats  counters
	// log is where warnings go; loggerSet says WithLogger chose it, so
	// that SetLogger leaves it alone.
	log       atomic.Pointer[slog.Logger]
	loggerSet bool
	// warned holds the names of the policies already reported unmatched,
	// warnedN how many (at most maxWarnedPolicies).
	warned  sync.Map
	warnedN atomic.Int64
}

// initLog sets the logger the options chose, slog.Default() without one.
func (r *reader) initLog(o options) {
	if o.set["WithLogger"] {
		r.loggerSet = true
		r.log.Store(driver.LoggerOrDiscard(o.logger))
		return
	}
	r.log.Store(slog.Default())
}

// setLogger is SetLogger for both backends.
func (r *reader) setLogger(l *slog.Logger) {
	if !r.loggerSet {
		r.log.Store(driver.LoggerOrDiscard(l))
	}
}

// maxWarnedPolicies bounds how many policy names a backend remembers as
// reported: a program that builds policies without end logs at most this
// many warnings, and counts every call in Stats.Unmatched all the same.
const maxWarnedPolicies = 1024

// target returns the index of the limit of p that receives the legacy
// window and the counter key, or -1 when nothing needs to be read. A
// policy with no limit the matcher accepts is counted in Stats.Unmatched
// and logged once.
func (r *reader) target(p *driver.Policy, identifier string) (int, string) {
	for i := range p.Limits {
		l := &p.Limits[i]
		if l.Algorithm == driver.FixedWindow && r.match(p, l) {
			key := r.key(p.Name, identifier)
			if key == "" {
				return -1, ""
			}
			return i, key
		}
	}
	r.unmatched(p)
	return -1, ""
}

// unmatched counts a call for a policy the legacy counter stands for no
// limit of, and warns the first time per policy name: a legacy window
// given wrong (an hour for a per-minute limiter) would otherwise carry
// nothing, silently.
func (r *reader) unmatched(p *driver.Policy) {
	r.stats.unmatched.Add(1)
	if _, seen := r.warned.Load(p.Name); seen || r.warnedN.Load() >= maxWarnedPolicies {
		return
	}
	if _, seen := r.warned.LoadOrStore(p.Name, struct{}{}); seen {
		return
	}
	r.warnedN.Add(1)
	windows := make([]string, 0, len(p.Limits))
	for i := range p.Limits {
		if l := &p.Limits[i]; l.Algorithm == driver.FixedWindow {
			windows = append(windows, l.Window.String())
		}
	}
	legacy := "any"
	if r.window > 0 {
		legacy = r.window.String()
	}
	r.log.Load().Warn("throttlekit: legacy: no limit of the policy matches the legacy window: its legacy windows are not carried; is the window given to the legacy backend the hand-written limiter's?",
		slog.String("backend", r.name), slog.String("policy", p.Name),
		slog.String("legacy_window", legacy), slog.Any("fixed_windows", windows))
}

// check refuses a call that cannot be answered before any round trip.
func (r *reader) check(ctx context.Context, req driver.Request) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !req.Policy.Valid() {
		return driver.Errorf("%w: legacy: request without a policy built by NewPolicy", driver.ErrInvalidPolicy)
	}
	return nil
}

// refuse is Decide's answer to a request that would spend units.
func (r *reader) refuse(req driver.Request) error {
	return driver.Errorf("%w: legacy: read-only legacy store (%s): cannot decide a cost of %d; route no identifier to it, only peek",
		errors.ErrUnsupported, r.name, req.Cost)
}

// outcome returns the answer to a peek: the zero State for every limit
// but limit i, which holds s.
func (r *reader) outcome(req driver.Request, i int, s driver.State) driver.Outcome {
	states := req.States()[:len(req.Policy.Limits)]
	clear(states)
	if i >= 0 && s != (driver.State{}) {
		states[i] = s
		r.stats.found.Add(1)
	}
	return driver.Outcome{Allowed: driver.Decide(req.Policy, req.Now, 0, states), States: states}
}

// window returns the state of a legacy window holding count units and
// ending at endMs (Unix milliseconds), as it counts at nowMs: the zero
// State when the count is 0 or less or the window has ended. A count
// above driver.MaxQuota, which denies as any count at or above Max does,
// is reported as MaxQuota so that every store can hold it exactly.
func window(count, endMs, nowMs int64) driver.State {
	if count <= 0 || endMs <= nowMs {
		return driver.State{}
	}
	return driver.State{Used: min(count, driver.MaxQuota), End: endMs}
}

// parseCount reads a legacy counter: a decimal integer, possibly padded
// with spaces (memcached pads a value that decr shortened). A count beyond
// the int64 range is clamped to it, which window then caps or drops.
func parseCount(raw string) (int64, bool) {
	n, err := strconv.ParseInt(strings.TrimSpace(raw), 10, 64)
	if err != nil {
		var ne *strconv.NumError
		return n, errors.As(err, &ne) && ne.Err == strconv.ErrRange
	}
	return n, true
}

// badReply counts and returns an error wrapping driver.ErrBadReply.
func (r *reader) badReply(format string, args ...any) error {
	r.stats.malformed.Add(1)
	return driver.Errorf("%w: legacy: %s: %s", driver.ErrBadReply, r.name, fmt.Sprintf(format, args...))
}

// await runs f and returns no later than ctx is done. Neither client can
// be interrupted mid-command (gomemcache takes no context; go-redis
// watches deadlines, not cancellation, while a command is on the wire), so
// when ctx can end f runs on a goroutine of its own, which finishes by the
// client's own timeouts once await has returned ctx's error.
func await[T any](ctx context.Context, f func() (T, error)) (T, error) {
	if ctx.Done() == nil {
		return f()
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
	select {
	case res := <-done:
		if res.err != nil {
			if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(res.err, ctxErr) {
				return res.v, driver.Errorf("throttlekit: legacy: %w: %w", ctxErr, res.err)
			}
		}
		return res.v, res.err
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
}
