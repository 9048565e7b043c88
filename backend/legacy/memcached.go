package legacybackend

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// Memcached reads the counters of a hand-written memcached limiter in the
// classic layout: a counter key holding a decimal count, raised with INCR,
// and the counter key plus ResetSuffix holding the end of its window in
// Unix seconds (or milliseconds, WithResetMillis or
// WithResetRounding(Millis)). It implements
// driver.Backend, driver.Peeker, driver.Pinger and driver.LoggerSetter.
// Built with Deciding, it also decides and takes states (driver.Seeder) in
// that layout; otherwise it never writes. It is safe for concurrent use.
type Memcached struct {
	reader
	client      *memcache.Client
	resetMillis bool
	rounding    ResetRounding
	deciding    bool
	// ends holds the last window end read or written per counter, for
	// the rounding check; roundingWarned says its warning was logged.
	ends           endMemory
	roundingWarned atomic.Bool
}

var (
	_ driver.Backend = (*Memcached)(nil)
	_ driver.Peeker  = (*Memcached)(nil)
	_ driver.Pinger  = (*Memcached)(nil)
	_ driver.Seeder  = (*Memcached)(nil)

	_ driver.LoggerSetter = (*Memcached)(nil)
)

// EndSuffix ends the name of the key where a Deciding Memcached keeps the
// exact end, in Unix milliseconds, of a window it was given (Seed) whose
// end is not a whole second, which the reset key cannot hold: the counter
// "rl:42" keeps it under "rl:42:end_ms". It is read only while the reset
// key holds that end rounded up to the second, so a window the old code
// opens since (it writes the reset key, never this one) is read from the
// reset key alone. The old code never reads it. Not used with
// WithResetMillis.
const EndSuffix = ":end_ms"

// itemGrace is how long the items of a window the backend writes outlive
// the window in memcached, as the hand-written limiter's do: the reset
// key, not memcached's expiry (whole seconds, applied lazily), says when a
// window ends.
const itemGrace = 3 * time.Second

// maxRelativeExpiry is the longest expiry memcached reads as relative to
// now; longer ones are read as a Unix time.
const maxRelativeExpiry = 30 * 24 * time.Hour

// maxAttempts bounds how often a Deciding Memcached reads again and
// retries a write that another writer raced.
const maxAttempts = 8

// NewMemcached returns a backend over the legacy counters client holds,
// whose windows last window: read-only unless Deciding is given. Options:
// WithKeyFunc, WithMatcher, WithResetMillis, WithResetRounding, Deciding,
// WithLogger. The client stays the caller's: its Timeout bounds each
// round trip (gomemcache takes no context). The error wraps
// driver.ErrInvalidOption.
func NewMemcached(client *memcache.Client, window time.Duration, opts ...Option) (*Memcached, error) {
	if client == nil {
		return nil, driver.Errorf("%w: legacy: nil memcached client", driver.ErrInvalidOption)
	}
	if err := checkWindow("window", window); err != nil {
		return nil, err
	}
	o, err := buildOptions("NewMemcached", opts, "WithWindow", "WithNoTTLWindow")
	if err != nil {
		return nil, err
	}
	if o.rounding == RoundDown && window < time.Second {
		return nil, driver.Errorf("%w: legacy: RoundDown needs a window of a second or more: a window of %v rounded down can end before it opens", driver.ErrInvalidOption, window)
	}
	if o.match == nil {
		o.match = MatchWindow(window)
	}
	m := &Memcached{
		reader:      reader{name: "memcached", window: window, key: o.key, match: o.match},
		client:      client,
		resetMillis: o.resetMillis,
		rounding:    o.rounding,
		deciding:    o.deciding,
	}
	m.initLog(o)
	return m, nil
}

// ready reports a Memcached that NewMemcached did not build.
func (m *Memcached) ready() error {
	if m == nil || m.client == nil || m.key == nil || m.match == nil {
		return driver.Errorf("%w: legacy: Memcached not built by NewMemcached", driver.ErrNotInitialized)
	}
	return nil
}

// Stats returns the backend's counters (zero for one NewMemcached did not
// build).
func (m *Memcached) Stats() Stats {
	if m.ready() != nil {
		return Stats{}
	}
	return m.stats.snapshot()
}

// SetLogger implements driver.LoggerSetter: warnings go to l (nil: none),
// unless WithLogger chose a logger.
func (m *Memcached) SetLogger(l *slog.Logger) {
	if m.ready() == nil {
		m.setLogger(l)
	}
}

// Decide implements driver.Backend. Cost 0 is Peek. Without Deciding any
// other cost returns an error wrapping errors.ErrUnsupported, never a
// verdict. With Deciding it decides as the hand-written limiter does (see
// the package documentation, "Deciding"): the counter is raised by the
// cost with INCR, denied or not, and the request is allowed when the count
// after it is at most the limit's Max; when no window is open, a new one
// is opened with the count set to the cost and the reset key to now plus
// the window, rounded as WithResetRounding says (up to the second unless
// set). A policy the legacy counter cannot hold alone (none of its limits
// matches, or it has other limits) gives an error wrapping
// errors.ErrUnsupported.
func (m *Memcached) Decide(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	if err := m.ready(); err != nil {
		return driver.Outcome{}, err
	}
	if req.Cost == 0 {
		return m.Peek(ctx, req)
	}
	if !m.deciding {
		return driver.Outcome{}, m.refuse(req)
	}
	start := time.Now()
	i, key, err := m.writable(ctx, req, nil)
	if err != nil {
		return driver.Outcome{}, err
	}
	return m.decide(ctx, req, i, key, start)
}

// writable runs the checks Decide and Seed share before any round trip
// (the request, the given states when seeding, the cost) and returns the
// limit the counter holds and the counter's key (decidable).
func (m *Memcached) writable(ctx context.Context, req driver.Request, given []driver.State) (int, string, error) {
	if err := m.check(ctx, req); err != nil {
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
	return m.decidable(req)
}

// decidable returns the limit and the counter key a Deciding Memcached
// decides req's policy with, or why it cannot.
func (m *Memcached) decidable(req driver.Request) (int, string, error) {
	p := req.Policy
	i, key := m.target(p, req.Identifier)
	if i < 0 {
		return -1, "", driver.Errorf("%w: legacy: memcached: policy %q, identifier %q: no legacy counter to decide with (no FixedWindow limit of the legacy window %v, or an empty key)",
			errors.ErrUnsupported, p.Name, req.Identifier, m.window)
	}
	if len(p.Limits) != 1 {
		return -1, "", driver.Errorf("%w: legacy: memcached: policy %q has %d limits, the legacy counter holds one: give a Deciding backend the legacy limiter's own policy",
			errors.ErrUnsupported, p.Name, len(p.Limits))
	}
	if err := checkMemcachedKey(key + m.longestSuffix()); err != nil {
		return -1, "", driver.Errorf("%w: legacy: key function gave %q for policy %q: %v", driver.ErrInvalidOption, key, p.Name, err)
	}
	return i, key, nil
}

// longestSuffix is the longest suffix the backend adds to a counter key:
// an opening lock's has up to 16 digits.
func (m *Memcached) longestSuffix() string {
	if m.deciding {
		return OpeningSuffix + "0000000000000000"
	}
	return ResetSuffix
}

// Peek implements driver.Peeker: one multi-get of the counter and its
// reset key (and, Deciding, its EndSuffix key). The limit the matcher
// picks holds State{Used: count, End: reset time in Unix milliseconds};
// every other limit, and that one when either key is missing, the count is
// 0 or the reset time is at or before req.Now, holds the zero State. A
// value that is not a decimal integer, or a reset time after
// driver.MaxUnixMilli, is an error wrapping driver.ErrBadReply. A policy
// none of whose FixedWindow limits the matcher accepts costs no round
// trip, is counted in Stats.Unmatched and logged once.
func (m *Memcached) Peek(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	if err := m.ready(); err != nil {
		return driver.Outcome{}, err
	}
	if err := m.check(ctx, req); err != nil {
		return driver.Outcome{}, err
	}
	start := time.Now()
	i, key := m.target(req.Policy, req.Identifier)
	if i < 0 {
		return m.outcome(req, -1, driver.State{}), nil
	}
	if err := checkMemcachedKey(key + m.longestSuffix()); err != nil {
		return driver.Outcome{}, driver.Errorf("%w: legacy: key function gave %q for policy %q: %v", driver.ErrInvalidOption, key, req.Policy.Name, err)
	}
	w, err := m.read(ctx, key)
	if err != nil {
		return driver.Outcome{}, err
	}
	m.observe(key, w, req.Now.UnixMilli(), start)
	return m.outcome(req, i, w.state(req.Now.UnixMilli())), nil
}

// stored is what the legacy store holds for one counter.
type stored struct {
	// counter is the counter's item, nil when missing; count its value.
	counter *memcache.Item
	count   int64
	// endMs is the window's end in Unix milliseconds, 0 when the reset key
	// is missing (hasReset false).
	endMs    int64
	hasReset bool
	// exact says the end came from the EndSuffix key.
	exact bool
	// newOpener is the end of the window last seen for this counter
	// (endMemory) when the read found that window's opening lock: a
	// Deciding Memcached, not the old code, opened the window after it.
	newOpener int64
}

// open reports a window that the hand-written limiter would count in at
// nowMs: a counter and a reset time after now, whatever the count.
func (s stored) open(nowMs int64) bool {
	return s.counter != nil && s.hasReset && s.endMs > nowMs
}

// state returns the window's State at nowMs (the zero State when it does
// not count).
func (s stored) state(nowMs int64) driver.State {
	if s.counter == nil || !s.hasReset {
		return driver.State{}
	}
	return window(s.count, s.endMs, nowMs)
}

// read fetches the counter key, its reset key and, Deciding, its
// EndSuffix key, in one round trip.
func (m *Memcached) read(ctx context.Context, key string) (stored, error) {
	resetKey, endKey := key+ResetSuffix, key+EndSuffix
	keys := []string{key, resetKey}
	var lockKey string
	var lockEnd int64
	if m.deciding && !m.resetMillis {
		keys = append(keys, endKey)
		if prev, ok := m.ends.get(key); ok && prev > 0 {
			// For the rounding check: did a new process open the window
			// after the one seen last?
			lockKey, lockEnd = openingKey(key, stored{endMs: prev}), prev
			keys = append(keys, lockKey)
		}
	}
	m.stats.reads.Add(1)
	items, err := await(ctx, func() (map[string]*memcache.Item, error) { return m.client.GetMulti(keys) })
	if err != nil {
		return stored{}, driver.Errorf("throttlekit: legacy: memcached: get %q: %w", key, err)
	}
	var s stored
	if lockKey != "" && items[lockKey] != nil {
		s.newOpener = lockEnd
	}
	if s.counter = items[key]; s.counter != nil {
		var ok bool
		if s.count, ok = parseCount(string(s.counter.Value)); !ok {
			return stored{}, m.badReply("counter %q holds %q, not a decimal count", key, s.counter.Value)
		}
	}
	if reset := items[resetKey]; reset != nil {
		if s.endMs, err = m.parseReset(reset.Value); err != nil {
			return stored{}, m.badReply("reset key %q: %v", resetKey, err)
		}
		s.hasReset = true
		if exact := items[endKey]; exact != nil {
			// Only an end the reset key rounds up to is this window's.
			e, err := strconv.ParseInt(strings.TrimSpace(string(exact.Value)), 10, 64)
			if err == nil && e > s.endMs-1000 && e <= s.endMs {
				s.endMs, s.exact = e, true
			}
		}
	}
	return s, nil
}

// legacyEnd returns the reset key's value for a window ending at endMs:
// Unix seconds rounded up, or milliseconds with WithResetMillis, and the
// end that value stands for.
func (m *Memcached) legacyEnd(endMs int64) (string, int64) {
	if m.resetMillis {
		return strconv.FormatInt(endMs, 10), endMs
	}
	sec := (endMs + 999) / 1000
	return strconv.FormatInt(sec, 10), sec * 1000
}

// opening returns the end of a window opened at now, in Unix
// milliseconds, exactly as the hand-written limiter computes it: now plus
// the window, rounded up to the second (RoundUp), down to it (RoundDown:
// now.Unix() + window) or up to the millisecond (Millis).
func (m *Memcached) opening(now time.Time) int64 {
	end := now.Add(m.window)
	switch {
	case m.resetMillis:
		ms := end.UnixMilli()
		if end.Nanosecond()%int(time.Millisecond) != 0 {
			ms++
		}
		return ms
	case m.rounding == RoundDown:
		return end.Unix() * 1000
	}
	sec := end.Unix()
	if end.Nanosecond() != 0 {
		sec++
	}
	return sec * 1000
}

// expiry returns the memcached expiry of the items of a window ending at
// endMs written at nowMs: until itemGrace after the window's end, as the
// hand-written limiter's, or none for a window beyond memcached's relative
// range.
func expiry(endMs, nowMs int64) int32 {
	d := time.Duration(endMs-nowMs)*time.Millisecond + itemGrace
	if d > maxRelativeExpiry {
		return 0
	}
	return int32((d + time.Second - 1) / time.Second)
}

// raced reports a write that lost to another writer, to be retried from a
// fresh read.
func raced(err error) bool {
	return errors.Is(err, memcache.ErrCASConflict) || errors.Is(err, memcache.ErrNotStored) || errors.Is(err, memcache.ErrCacheMiss)
}

// decide decides req (cost > 0) on the counter key, limit i of its policy:
// the hand-written limiter's steps, with the window-opening write made
// conditional (add or CAS on the counter) so that two new processes never
// both open a window.
func (m *Memcached) decide(ctx context.Context, req driver.Request, i int, key string, start time.Time) (driver.Outcome, error) {
	nowMs := req.Now.UnixMilli()
	var lost time.Time // when a write of this call last lost a race
	for range maxAttempts {
		s, err := m.settled(ctx, key, nowMs, lost)
		if err != nil {
			return driver.Outcome{}, err
		}
		m.observe(key, s, nowMs, start)
		var state driver.State
		if s.open(nowMs) {
			n, err := await(ctx, func() (uint64, error) { return m.client.Increment(key, uint64(req.Cost)) })
			if raced(err) {
				// Evicted or expired since the read: open a window.
				m.stats.contended.Add(1)
				continue
			}
			if err != nil {
				return driver.Outcome{}, driver.Errorf("throttlekit: legacy: memcached: incr %q: %w", key, err)
			}
			state = driver.State{Used: int64(min(n, uint64(driver.MaxQuota))), End: s.endMs}
		} else {
			endMs := m.opening(req.Now)
			ok, err := m.openWindow(ctx, key, s, req.Cost, endMs, nowMs, lost.IsZero() || time.Since(lost) <= openWait)
			if err != nil {
				return driver.Outcome{}, err
			}
			if !ok {
				m.stats.contended.Add(1)
				lost = time.Now()
				continue
			}
			m.stats.opened.Add(1)
			state = driver.State{Used: min(req.Cost, driver.MaxQuota), End: endMs}
		}
		m.stats.decided.Add(1)
		states := req.States()[:len(req.Policy.Limits)]
		clear(states)
		states[i] = state
		return driver.Outcome{Allowed: state.Used <= req.Policy.Limits[i].Max, States: states}, nil
	}
	return driver.Outcome{}, m.contention(key)
}

// openWait bounds how long a call whose write lost a race waits for the
// window another writer is opening, and openPoll how often it looks.
const (
	openWait = 200 * time.Millisecond
	openPoll = time.Millisecond
)

// settled reads the counter key. After a write of this call lost a race
// (lost is when: the opening lock was taken, or the counter changed since
// it was read), a read that finds no window open most likely caught
// another process opening one, between its lock and its reset key: the
// call then reads again until the reset key follows, rather than open a
// window over that one and lose its count. It stops waiting after
// openWait (the other writer died between its writes, or the race was
// with a late INCR of the old code into an ended window, and nobody is
// opening one), and then opens without the lock; or when ctx ends.
func (m *Memcached) settled(ctx context.Context, key string, nowMs int64, lost time.Time) (stored, error) {
	for {
		s, err := m.read(ctx, key)
		if err != nil || lost.IsZero() || s.open(nowMs) || time.Since(lost) > openWait {
			return s, err
		}
		t := time.NewTimer(openPoll)
		select {
		case <-ctx.Done():
			t.Stop()
			return stored{}, ctx.Err()
		case <-t.C:
		}
	}
}

// contention is the error of a call that lost every attempt to other
// writers.
func (m *Memcached) contention(key string) error {
	return driver.Errorf("throttlekit: legacy: memcached: %q: other writers changed the counter %d times in a row", key, maxAttempts)
}

// openWindow makes the counter key hold used for a window ending at endMs
// in place of what s read, and reports false when another writer got
// there first. With lock, it first adds the lock key of the window s read
// (OpeningSuffix), so that of the new processes that found the same window
// ended only one opens the next: the others find the lock taken and wait
// for its reset key (settled). The counter write is conditional too, an
// add when the counter was missing, a CAS against the item read
// otherwise, so that a write of the old code in between wins. The counter
// is written before the reset key, as the hand-written limiter writes
// them, so that a reader never pairs a new end with an old count.
func (m *Memcached) openWindow(ctx context.Context, key string, s stored, used, endMs, nowMs int64, lock bool) (bool, error) {
	ttl := expiry(endMs, nowMs)
	value := []byte(strconv.FormatInt(used, 10))
	_, err := await(ctx, func() (struct{}, error) {
		if lock {
			l := &memcache.Item{Key: openingKey(key, s), Value: []byte(strconv.FormatInt(endMs, 10)), Expiration: lockExpiry}
			if err := m.client.Add(l); err != nil {
				return struct{}{}, err
			}
		}
		if s.counter == nil {
			return struct{}{}, m.client.Add(&memcache.Item{Key: key, Value: value, Expiration: ttl})
		}
		it := *s.counter
		it.Value, it.Expiration = value, ttl
		return struct{}{}, m.client.CompareAndSwap(&it)
	})
	if raced(err) {
		return false, nil
	}
	if err != nil {
		return false, driver.Errorf("throttlekit: legacy: memcached: open a window in %q: %w", key, err)
	}
	m.ends.swap(key, endMs)
	return true, m.writeEnd(ctx, key, s, endMs, ttl)
}

// OpeningSuffix, followed by the end (Unix milliseconds, 0 for none) of
// the window a Deciding Memcached found ended, names the short-lived key
// whose add elects the one process that opens the next window: the
// counter "rl:42", whose window ended at 1700000000000, is reopened under
// "rl:42:opening:1700000000000". The old code never reads it.
const OpeningSuffix = ":opening:"

// lockExpiry is how long, in seconds, an opening lock outlives its add:
// long enough to cover the two writes that follow it, short enough to be
// gone before the counter's own items expire.
const lockExpiry = 2

// openingKey returns the lock key for reopening the window s holds.
func openingKey(key string, s stored) string {
	return key + OpeningSuffix + strconv.FormatInt(s.endMs, 10)
}

// writeEnd writes the reset key of a window ending at endMs, and its
// EndSuffix key when the reset key cannot hold that end exactly; the
// EndSuffix key goes first, so that the reset key never stands for a
// rounded end while the exact one is missing. An EndSuffix key read with
// a whole-second end is deleted, so that it cannot stand for this window.
func (m *Memcached) writeEnd(ctx context.Context, key string, s stored, endMs int64, ttl int32) error {
	value, rounded := m.legacyEnd(endMs)
	_, err := await(ctx, func() (struct{}, error) {
		switch {
		case rounded != endMs:
			if err := m.client.Set(&memcache.Item{Key: key + EndSuffix, Value: []byte(strconv.FormatInt(endMs, 10)), Expiration: ttl}); err != nil {
				return struct{}{}, err
			}
		case s.exact:
			if err := m.client.Delete(key + EndSuffix); err != nil && !errors.Is(err, memcache.ErrCacheMiss) {
				return struct{}{}, err
			}
		}
		return struct{}{}, m.client.Set(&memcache.Item{Key: key + ResetSuffix, Value: []byte(value), Expiration: ttl})
	})
	if err != nil {
		return driver.Errorf("throttlekit: legacy: memcached: write the end of %q: %w", key, err)
	}
	return nil
}

// Seed implements driver.Seeder for a Deciding Memcached (without
// Deciding: an error wrapping errors.ErrUnsupported). It reads the legacy
// window, merges given into it by driver.Merge's rule at req.Now and
// writes the result in the legacy format when the merge changed it: a
// larger count of the same window by CAS on the counter; another window
// as the backend opens one (add or CAS on the counter, then the reset
// key, rounded up to the second whatever WithResetRounding says, with the
// exact end under EndSuffix when it is not a whole second). It then
// decides req.Cost as Decide does. Outcome.Prior holds the window read
// first. The read, the writes and the
// decision are separate round trips, retried from a fresh read when
// another writer raced them: a Seed is not atomic against the
// hand-written limiter's own writes (see the package documentation).
func (m *Memcached) Seed(ctx context.Context, req driver.Request, given []driver.State) (driver.Outcome, error) {
	if err := m.ready(); err != nil {
		return driver.Outcome{}, err
	}
	if !m.deciding {
		return driver.Outcome{}, driver.Errorf("%w: legacy: memcached: read-only (no Deciding): cannot take states", errors.ErrUnsupported)
	}
	if given == nil {
		given = []driver.State{}
	}
	start := time.Now()
	i, key, err := m.writable(ctx, req, given)
	if err != nil {
		return driver.Outcome{}, err
	}
	p := req.Policy
	nowMs := req.Now.UnixMilli()
	var lost time.Time // when a write of this call last lost a race
	for range maxAttempts {
		s, err := m.settled(ctx, key, nowMs, lost)
		if err != nil {
			return driver.Outcome{}, err
		}
		m.observe(key, s, nowMs, start)
		held := s.state(nowMs)
		merged := []driver.State{held}
		if driver.Merge(p, req.Now, merged, given) && merged[0] != held {
			ok, err := m.write(ctx, key, s, merged[0], nowMs, lost.IsZero() || time.Since(lost) <= openWait)
			if err != nil {
				return driver.Outcome{}, err
			}
			if !ok {
				m.stats.contended.Add(1)
				lost = time.Now()
				continue
			}
			m.stats.seeded.Add(1)
		}
		prior := []driver.State{held}
		if req.Cost > 0 {
			out, err := m.decide(ctx, req, i, key, start)
			out.Prior = prior
			return out, err
		}
		states := req.States()[:1]
		states[0] = merged[0]
		return driver.Outcome{Allowed: driver.Decide(p, req.Now, 0, states), States: states, Prior: prior}, nil
	}
	return driver.Outcome{}, m.contention(key)
}

// write makes the legacy store hold want (an open window) in place of s,
// or reports false when another writer changed the counter since s was
// read.
func (m *Memcached) write(ctx context.Context, key string, s stored, want driver.State, nowMs int64, lock bool) (bool, error) {
	if s.state(nowMs) != (driver.State{}) && want.End == s.endMs {
		// The same window, counted further: raise the count only.
		it := *s.counter
		it.Value = []byte(strconv.FormatInt(want.Used, 10))
		_, err := await(ctx, func() (struct{}, error) { return struct{}{}, m.client.CompareAndSwap(&it) })
		if raced(err) {
			return false, nil
		}
		if err != nil {
			return false, driver.Errorf("throttlekit: legacy: memcached: raise %q: %w", key, err)
		}
		return true, nil
	}
	return m.openWindow(ctx, key, s, want.Used, want.End, nowMs, lock)
}

// parseReset reads a reset key's value as Unix milliseconds.
func (m *Memcached) parseReset(raw []byte) (int64, error) {
	t, err := strconv.ParseInt(strings.TrimSpace(string(raw)), 10, 64)
	unit, scale := "seconds", int64(1000)
	if m.resetMillis {
		unit, scale = "milliseconds", 1
	}
	switch {
	case err != nil:
		return 0, driver.Errorf("holds %q, not Unix %s", raw, unit)
	case t > driver.MaxUnixMilli/scale:
		return 0, driver.Errorf("holds %d, after %s in Unix %s (is the unit right? see WithResetMillis)", t, time.UnixMilli(driver.MaxUnixMilli).UTC().Format(time.DateOnly), unit)
	}
	// A time before the epoch is a closed window, as any past one.
	return max(t, 0) * scale, nil
}

// checkMemcachedKey refuses a key memcached would reject, so that a bad
// key function is reported as such rather than as a store failure.
func checkMemcachedKey(key string) error {
	if len(key) > MaxKeyLen {
		return driver.Errorf("with %q it is %d bytes, above memcached's %d", ResetSuffix, len(key), MaxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c <= ' ' || c == 0x7f {
			return driver.Errorf("byte %d is a space or control byte (%#x)", i, c)
		}
	}
	return nil
}

// Ping implements driver.Pinger: every server of the client answers.
func (m *Memcached) Ping(ctx context.Context) error {
	if err := m.ready(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if _, err := await(ctx, func() (struct{}, error) { return struct{}{}, m.client.Ping() }); err != nil {
		return driver.Errorf("throttlekit: legacy: memcached: ping: %w", err)
	}
	return nil
}

// endMemory remembers the last window end a Deciding Memcached read or
// wrote per counter key, for the rounding check: at most
// maxRememberedEnds keys, forgotten all at once when full.
type endMemory struct {
	mu   sync.Mutex
	ends map[string]int64
}

// maxRememberedEnds bounds the keys an endMemory holds.
const maxRememberedEnds = 1 << 14

// get returns key's last window end recorded.
func (e *endMemory) get(key string) (int64, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	end, ok := e.ends[key]
	return end, ok
}

// swap records end as key's last window end and returns the one recorded
// before, if any.
func (e *endMemory) swap(key string, end int64) (int64, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	prev, ok := e.ends[key]
	switch {
	case e.ends == nil:
		e.ends = make(map[string]int64)
	case !ok && len(e.ends) >= maxRememberedEnds:
		clear(e.ends)
	}
	e.ends[key] = end
	return prev, ok
}

// roundingSkew is how far apart the clocks of the old and the new
// processes may be for the rounding check to stay sound.
const roundingSkew = 100 * time.Millisecond

// observe runs the rounding check on what a Deciding Memcached read of a
// counter at nowMs, in a call that started at start (see the package
// documentation, "Rounding"). In seconds (RoundUp, RoundDown): when the
// window read is not the one last seen for the key, which ended at E, a
// whole second, its opener opened it once its own clock reached E (a
// window opens only when the previous one has ended) and before this
// read was served; when that read was served before E plus a second (less
// roundingSkew), the opener's now o lay in [E, E+1s), so now plus the
// window ends at E+W rounded down and E+W+1s rounded up: an end of E+W
// shows RoundDown, E+W+1s RoundUp, anything else nothing. Windows of a
// given exact end (EndSuffix) and windows not of whole seconds are left
// out, and so are windows a Deciding Memcached opened: the read finds the
// opening lock it took (OpeningSuffix and E). In milliseconds (Millis): an
// open window whose reset value, read
// as Unix seconds, would end within a window (and a second) of now shows
// that the old code writes seconds.
func (m *Memcached) observe(key string, s stored, nowMs int64, start time.Time) {
	if !m.deciding || s.counter == nil || !s.hasReset {
		return
	}
	// When the read was served, at the latest, on the request's clock.
	served := nowMs + time.Since(start).Milliseconds() + 1
	w := m.window.Milliseconds()
	if m.resetMillis {
		switch v := s.endMs; {
		case v*1000 > nowMs && v*1000 <= served+w+1000+roundingSkew.Milliseconds():
			m.stats.roundingChecked.Add(1)
			m.mismatch(key, "Unix seconds", 0, v)
		case v > nowMs && v <= served+w+roundingSkew.Milliseconds():
			m.stats.roundingChecked.Add(1)
		}
		return
	}
	prev, seen := m.ends.swap(key, s.endMs)
	if !seen || prev == s.endMs || s.exact || prev%1000 != 0 || w%1000 != 0 || s.newOpener == prev ||
		served+roundingSkew.Milliseconds() >= prev+1000 {
		return
	}
	var shown ResetRounding
	switch s.endMs - prev - w {
	case 0:
		shown = RoundDown
	case 1000:
		shown = RoundUp
	default:
		return
	}
	m.stats.roundingChecked.Add(1)
	if shown != m.rounding {
		m.mismatch(key, shown.String(), prev, s.endMs)
	}
}

// mismatch counts a window whose end shows another rounding than the one
// configured, and logs the first one.
func (m *Memcached) mismatch(key, shown string, prevMs, endMs int64) {
	m.stats.roundingMismatched.Add(1)
	if !m.roundingWarned.CompareAndSwap(false, true) {
		return
	}
	m.log.Load().Warn("throttlekit: legacy: a window in the legacy keys ends as another rounding than WithResetRounding's computes it: windows the old code opens and windows the new code opens end at different moments; give WithResetRounding the old code's rounding (Stats.RoundingMismatched counts the windows seen)",
		slog.String("backend", m.name), slog.String("configured", m.rounding.String()), slog.String("seen", shown),
		slog.String("key", key), slog.Int64("previous_end", prevMs), slog.Int64("end", endMs), slog.Duration("window", m.window))
}
