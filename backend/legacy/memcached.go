package legacybackend

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// Memcached reads the counters of a hand-written memcached limiter in the
// classic layout: a counter key holding a decimal count, raised with INCR,
// and the counter key plus ResetSuffix holding the end of its window in
// Unix seconds (or milliseconds, WithResetMillis). It implements
// driver.Backend, driver.Peeker and driver.Pinger, and never writes. It is
// safe for concurrent use.
type Memcached struct {
	reader
	client      *memcache.Client
	resetMillis bool
}

var (
	_ driver.Backend = (*Memcached)(nil)
	_ driver.Peeker  = (*Memcached)(nil)
	_ driver.Pinger  = (*Memcached)(nil)
)

// NewMemcached returns a read-only backend over the legacy counters client
// holds, whose windows last window. Options: WithKeyFunc, WithMatcher,
// WithResetMillis. The client stays the caller's: its Timeout bounds each
// read (gomemcache takes no context). The error wraps
// driver.ErrInvalidOption.
func NewMemcached(client *memcache.Client, window time.Duration, opts ...Option) (*Memcached, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: legacy: nil memcached client", driver.ErrInvalidOption)
	}
	if err := checkWindow("window", window); err != nil {
		return nil, err
	}
	o, err := buildOptions("NewMemcached", opts, "WithWindow", "WithNoTTLWindow")
	if err != nil {
		return nil, err
	}
	if o.match == nil {
		o.match = MatchWindow(window)
	}
	return &Memcached{
		reader:      reader{name: "memcached", key: o.key, match: o.match},
		client:      client,
		resetMillis: o.resetMillis,
	}, nil
}

// ready reports a Memcached that NewMemcached did not build.
func (m *Memcached) ready() error {
	if m == nil || m.client == nil || m.key == nil || m.match == nil {
		return fmt.Errorf("%w: legacy: Memcached not built by NewMemcached", driver.ErrNotInitialized)
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

// Decide implements driver.Backend for peeks only: cost 0 is Peek; any
// other cost returns an error wrapping errors.ErrUnsupported, never a
// verdict, since the legacy store is read-only.
func (m *Memcached) Decide(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	if err := m.ready(); err != nil {
		return driver.Outcome{}, err
	}
	if req.Cost != 0 {
		return driver.Outcome{}, m.refuse(req)
	}
	return m.Peek(ctx, req)
}

// Peek implements driver.Peeker: one multi-get of the counter and its
// reset key. The limit the matcher picks holds State{Used: count, End:
// reset time in Unix milliseconds}; every other limit, and that one when
// either key is missing, the count is 0 or the reset time is at or before
// req.Now, holds the zero State. A value that is not a decimal integer,
// or a reset time after driver.MaxUnixMilli, is an error wrapping
// driver.ErrBadReply.
func (m *Memcached) Peek(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	if err := m.ready(); err != nil {
		return driver.Outcome{}, err
	}
	if err := m.check(ctx, req); err != nil {
		return driver.Outcome{}, err
	}
	i, key := m.target(req.Policy, req.Identifier)
	if i < 0 {
		return m.outcome(req, -1, driver.State{}), nil
	}
	resetKey := key + ResetSuffix
	if err := checkMemcachedKey(resetKey); err != nil {
		return driver.Outcome{}, fmt.Errorf("%w: legacy: key function gave %q for policy %q: %v", driver.ErrInvalidOption, key, req.Policy.Name, err)
	}
	m.stats.reads.Add(1)
	items, err := await(ctx, func() (map[string]*memcache.Item, error) {
		return m.client.GetMulti([]string{key, resetKey})
	})
	if err != nil {
		return driver.Outcome{}, fmt.Errorf("throttlekit: legacy: memcached: get %q: %w", key, err)
	}
	counter, reset := items[key], items[resetKey]
	var count, endMs int64
	if counter != nil {
		var ok bool
		if count, ok = parseCount(string(counter.Value)); !ok {
			return driver.Outcome{}, m.badReply("counter %q holds %q, not a decimal count", key, counter.Value)
		}
	}
	if reset != nil {
		if endMs, err = m.parseReset(reset.Value); err != nil {
			return driver.Outcome{}, m.badReply("reset key %q: %v", resetKey, err)
		}
	}
	if counter == nil || reset == nil {
		return m.outcome(req, i, driver.State{}), nil
	}
	return m.outcome(req, i, window(count, endMs, req.Now.UnixMilli())), nil
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
		return 0, fmt.Errorf("holds %q, not Unix %s", raw, unit)
	case t > driver.MaxUnixMilli/scale:
		return 0, fmt.Errorf("holds %d, after %s in Unix %s (is the unit right? see WithResetMillis)", t, time.UnixMilli(driver.MaxUnixMilli).UTC().Format(time.DateOnly), unit)
	}
	// A time before the epoch is a closed window, as any past one.
	return max(t, 0) * scale, nil
}

// checkMemcachedKey refuses a key memcached would reject, so that a bad
// key function is reported as such rather than as a store failure.
func checkMemcachedKey(key string) error {
	if len(key) > MaxKeyLen {
		return fmt.Errorf("with %q it is %d bytes, above memcached's %d", ResetSuffix, len(key), MaxKeyLen)
	}
	for i := 0; i < len(key); i++ {
		if c := key[i]; c <= ' ' || c == 0x7f {
			return fmt.Errorf("byte %d is a space or control byte (%#x)", i, c)
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
		return fmt.Errorf("throttlekit: legacy: memcached: ping: %w", err)
	}
	return nil
}
