// Package handwritten holds the hand-written limiters throttlekit's
// legacy backend stands in for: the code many APIs ran before a rate
// limiting library (GitHub's did), kept here so that tests can run it
// beside throttlekit as the old processes of a rolling deploy.
//
// Limiter is the memcached one, the same logic as cmd/migrate-demo's
// legacyLimiter. One fixed window per identifier, in the classic layout:
// the counter key holds the number of requests in the window, denied ones
// included, raised with INCR; the counter key plus ":reset_at" holds the
// window's end in Unix seconds. A window opens at the first request that
// finds none open and lasts its length, rounded up to a whole second, or
// down with RoundDown (now.Unix() + window, as most such code writes it).
// Like most such code it is not atomic: the read, the INCR and the two
// writes that open a window are separate round trips, so two requests of
// one identifier racing at a window's end can both open it.
//
// RedisLimiter is the Redis one: INCR of one key per identifier, EXPIRE
// of the window when that INCR created the key (the count is 1), and a
// reset reported as now plus the key's TTL in whole seconds, read anew on
// every request. INCR, EXPIRE and TTL are separate round trips.
package handwritten

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	goredis "github.com/redis/go-redis/v9"
)

// ResetSuffix ends the name of a counter's reset key (the same as
// legacybackend.ResetSuffix).
const ResetSuffix = ":reset_at"

// Limiter is the hand-written limiter: Limit requests per Window per
// identifier, counted under Key(identifier) in Client.
type Limiter struct {
	Client *memcache.Client
	Limit  int64
	Window time.Duration
	// Key names the counter of an identifier.
	Key func(identifier string) string
	// RoundDown writes a window's end rounded down to the second,
	// now.Add(Window).Unix() (now.Unix() + 60 for a minute), instead of
	// rounded up.
	RoundDown bool
}

// Decision is what the limiter decided for one request.
type Decision struct {
	Allowed bool
	// Count is the counter after the request, denied requests included.
	Count int64
	// Reset is the window's end, Unix seconds.
	Reset int64
}

// Allow counts one request of identifier at now: a new window when the
// stored one has ended or is missing, INCR otherwise.
func (l *Limiter) Allow(now time.Time, identifier string) (Decision, error) {
	key := l.Key(identifier)
	resetKey := key + ResetSuffix
	items, err := l.Client.GetMulti([]string{key, resetKey})
	if err != nil {
		return Decision{}, err
	}
	d := Decision{}
	if it, ok := items[resetKey]; ok {
		if d.Reset, err = strconv.ParseInt(string(it.Value), 10, 64); err != nil {
			return Decision{}, fmt.Errorf("handwritten: %s: %w", resetKey, err)
		}
	}
	_, counted := items[key]
	if counted && d.Reset*1000 > now.UnixMilli() {
		n, err := l.Client.Increment(key, 1)
		if err == nil {
			d.Count = int64(n)
			d.Allowed = d.Count <= l.Limit
			return d, nil
		}
		if !errors.Is(err, memcache.ErrCacheMiss) {
			return Decision{}, err
		}
		// Evicted between the two calls: open a new window.
	}
	// A new window. The counter is written before its reset time, so that
	// a reader never pairs a fresh reset time with an old count.
	end := now.Add(l.Window)
	d.Reset = end.Unix()
	if end.Nanosecond() != 0 && !l.RoundDown {
		d.Reset++
	}
	// The items outlive the window a little: the reset time, not
	// memcached's expiry (whole seconds, lazily applied), says when the
	// window ends.
	ttl := int32(l.Window/time.Second) + 3
	if err := l.Client.Set(&memcache.Item{Key: key, Value: []byte("1"), Expiration: ttl}); err != nil {
		return Decision{}, err
	}
	if err := l.Client.Set(&memcache.Item{Key: resetKey, Value: []byte(strconv.FormatInt(d.Reset, 10)), Expiration: ttl}); err != nil {
		return Decision{}, err
	}
	d.Count, d.Allowed = 1, l.Limit >= 1
	return d, nil
}

// RedisLimiter is the hand-written Redis limiter: Limit requests per
// Window per identifier, counted under Key(identifier) in Client with INCR
// and EXPIRE.
type RedisLimiter struct {
	Client goredis.Cmdable
	Limit  int64
	// Window is the TTL given to a new counter, in whole seconds.
	Window time.Duration
	// Key names the counter of an identifier.
	Key func(identifier string) string
}

// Allow counts one request of identifier at now: INCR, then EXPIRE when
// the INCR created the counter, then TTL. The reset it reports is now
// (whole seconds) plus that TTL (whole seconds, as Redis rounds it), so it
// wobbles by a second from one request to the next as the TTL is read at
// different moments; a counter found without a TTL (gone, or an EXPIRE
// lost) is reported as a window from now. Denied requests are counted.
func (l *RedisLimiter) Allow(ctx context.Context, now time.Time, identifier string) (Decision, error) {
	key := l.Key(identifier)
	n, err := l.Client.Incr(ctx, key).Result()
	if err != nil {
		return Decision{}, err
	}
	if n == 1 {
		if err := l.Client.Expire(ctx, key, l.Window).Err(); err != nil {
			return Decision{}, err
		}
	}
	ttl, err := l.Client.TTL(ctx, key).Result()
	if err != nil {
		return Decision{}, err
	}
	secs := int64(ttl / time.Second)
	if ttl < 0 {
		// go-redis reports -1 (no TTL) and -2 (gone) as durations of -1
		// and -2 ns.
		secs = int64(l.Window / time.Second)
	}
	return Decision{Allowed: n <= l.Limit, Count: n, Reset: now.Unix() + secs}, nil
}
