package main

import (
	"errors"
	"fmt"
	"hash/fnv"
	"net/http"
	"strconv"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	legacybackend "github.com/throttlekit/throttlekit/backend/legacy"
	"github.com/throttlekit/throttlekit/middleware"
	"github.com/throttlekit/throttlekit/throttler"
)

// legacyStore is the X-Demo-Store value of responses the hand-written
// limiter decided.
const legacyStore = "legacy"

// legacyLimiter is the hand-written limiter the demo's API ran before
// throttlekit, as many APIs still do (GitHub's did): one fixed window per
// identifier in memcached, in the classic layout that backend/legacy reads.
// The counter key holds the number of requests in the window, denied ones
// included, raised with INCR; the key plus legacybackend.ResetSuffix holds
// the window's end in Unix seconds. A window opens at the first request
// that finds none open and lasts its length, rounded up to a whole second.
//
// It counts one limit of the API's policy (its shortest fixed window) and
// nothing else. It is as simple as such code usually is: each identifier's
// requests must not race, which holds here because every demo client sends
// its requests one after another.
type legacyLimiter struct {
	mc *memcache.Client
	// limit is the quota, window the window's length.
	limit  int64
	window time.Duration
	// prefix sets this run's keys apart from any other's.
	prefix string
	// member names the limit in the RateLimit field, as the middleware
	// names the same limit of the API's policy, so that clients see one
	// limit before and after the deploy.
	member string
}

// newLegacyLimiter returns the limiter over mc that counts the fixed-window
// limit of policy with the shortest window (the one that binds first), or
// nil when the policy has none. Its keys start with prefix.
func newLegacyLimiter(mc *memcache.Client, policy *throttler.Policy, prefix string) *legacyLimiter {
	limits := policy.Limits()
	var counted *throttler.Limit
	for i, l := range limits {
		if l.Algorithm == throttler.FixedWindow && (counted == nil || l.Window < counted.Window) {
			counted = &limits[i]
		}
	}
	if counted == nil {
		return nil
	}
	member := resourceName
	if len(limits) > 1 {
		member += ":" + counted.Name
	}
	return &legacyLimiter{mc: mc, limit: counted.Max, window: counted.Window, prefix: prefix, member: member}
}

// key returns the counter key of identifier: the legacy code's own naming,
// which backend/legacy is given as its KeyFunc.
func (l *legacyLimiter) key(_, identifier string) string {
	return l.prefix + ":rl:" + identifier
}

// legacyDecision is what the hand-written limiter decided for one request.
type legacyDecision struct {
	allowed bool
	// count is the counter after the request, denied requests included.
	count int64
	// reset is the window's end, Unix seconds.
	reset int64
}

// allow counts one request of identifier at now: a new window when the
// stored one has ended or is missing, INCR otherwise.
func (l *legacyLimiter) allow(now time.Time, identifier string) (legacyDecision, error) {
	key := l.key("", identifier)
	resetKey := key + legacybackend.ResetSuffix
	items, err := l.mc.GetMulti([]string{key, resetKey})
	if err != nil {
		return legacyDecision{}, err
	}
	d := legacyDecision{}
	if it, ok := items[resetKey]; ok {
		if d.reset, err = strconv.ParseInt(string(it.Value), 10, 64); err != nil {
			return legacyDecision{}, fmt.Errorf("legacy %s: %w", resetKey, err)
		}
	}
	_, counted := items[key]
	if counted && d.reset*1000 > now.UnixMilli() {
		n, err := l.mc.Increment(key, 1)
		if err == nil {
			d.count = int64(n)
			d.allowed = d.count <= l.limit
			return d, nil
		}
		if !errors.Is(err, memcache.ErrCacheMiss) {
			return legacyDecision{}, err
		}
		// Evicted between the two calls: open a new window.
	}
	// A new window. The counter is written before its reset time, so that
	// a reader never pairs a fresh reset time with an old count.
	end := now.Add(l.window)
	d.reset = end.Unix()
	if end.Nanosecond() != 0 {
		d.reset++
	}
	// The items outlive the window a little: the reset time, not memcached's
	// expiry (whole seconds, lazily applied), says when the window ends.
	ttl := int32(l.window/time.Second) + 3
	if err := l.mc.Set(&memcache.Item{Key: key, Value: []byte("1"), Expiration: ttl}); err != nil {
		return legacyDecision{}, err
	}
	if err := l.mc.Set(&memcache.Item{Key: resetKey, Value: []byte(strconv.FormatInt(d.reset, 10)), Expiration: ttl}); err != nil {
		return legacyDecision{}, err
	}
	d.count, d.allowed = 1, l.limit >= 1
	return d, nil
}

// handler returns the legacy deployment's API: the limiter in front of
// app, writing the headers the API's clients rely on (GitHub's
// X-RateLimit-* and the RateLimit field) the way throttlekit's middleware
// writes them for the same limit. A failing memcached lets the request
// through, marked degraded, as such limiters usually fail open.
func (l *legacyLimiter) handler(identify middleware.IdentifierFunc, app http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set(headerSide, "old")
		h.Set(headerStore, legacyStore)
		h.Set(middleware.HeaderLimit, strconv.FormatInt(l.limit, 10))
		h.Set(middleware.HeaderResource, resourceName)
		now := time.Now()
		d, err := l.allow(now, identify(r))
		if err != nil {
			h.Set(middleware.HeaderDegraded, "1")
			app.ServeHTTP(w, r)
			return
		}
		used := min(d.count, l.limit)
		remaining := l.limit - used
		untilReset := max(d.reset-now.Unix(), 0)
		h.Set(middleware.HeaderUsed, strconv.FormatInt(used, 10))
		h.Set(middleware.HeaderReset, strconv.FormatInt(d.reset, 10))
		if d.allowed {
			h.Set(middleware.HeaderRemaining, strconv.FormatInt(remaining, 10))
			h.Set(middleware.HeaderRateLimit, fmt.Sprintf("%s;r=%d;t=%d", sfString(l.member), remaining, untilReset))
			app.ServeHTTP(w, r)
			return
		}
		retry := max(untilReset, 1)
		h.Set(middleware.HeaderRemaining, "0")
		h.Set(middleware.HeaderRateLimit, fmt.Sprintf("%s;r=0;t=%d", sfString(l.member), retry))
		h.Set(middleware.HeaderRetryAfter, strconv.FormatInt(retry, 10))
		h.Set(headerResultRemaining, "0")
		h.Set(headerResultUsed, strconv.FormatInt(used, 10))
		h.Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(`{"message":"API rate limit exceeded"}` + "\n"))
	})
}

// onLegacy reports whether the client holding token is served by the
// hand-written limiter during the warm-up: a share of the tokens, picked
// by a hash of the token that owes nothing to the rollout's own hash, so
// that legacy clients land on either side of every step.
func onLegacy(token string, share float64) bool {
	h := fnv.New32a()
	_, _ = h.Write([]byte(token))
	return float64(h.Sum32()%10_000) < share*10_000
}

// sfString writes s as a Structured Field string, as the middleware writes
// list member names: '"' and '\' escaped, any byte outside printable ASCII
// as %XX.
func sfString(s string) string {
	b := []byte{'"'}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c > 0x7e:
			b = append(b, fmt.Sprintf("%%%02X", c)...)
		default:
			b = append(b, c)
		}
	}
	return string(append(b, '"'))
}
