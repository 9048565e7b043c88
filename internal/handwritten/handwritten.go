// Package handwritten is the hand-written memcached limiter throttlekit's
// legacy backend stands in for: the code many APIs ran before a rate
// limiting library (GitHub's did), kept here so that tests can run it
// beside throttlekit as the old processes of a rolling deploy. It is the
// same logic as cmd/migrate-demo's legacyLimiter.
//
// One fixed window per identifier, in the classic layout: the counter key
// holds the number of requests in the window, denied ones included, raised
// with INCR; the counter key plus ":reset_at" holds the window's end in Unix
// seconds. A window opens at the first request that finds none open and
// lasts its length, rounded up to a whole second. Like most such code it
// is not atomic: the read, the INCR and the two writes that open a window
// are separate round trips, so two requests of one identifier racing at a
// window's end can both open it.
package handwritten

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
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
	if end.Nanosecond() != 0 {
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
