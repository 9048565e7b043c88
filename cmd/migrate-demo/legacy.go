package main

import (
	"fmt"
	"hash/fnv"
	"net/http"
	"strconv"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/throttlekit/throttlekit/internal/handwritten"
	"github.com/throttlekit/throttlekit/middleware"
	"github.com/throttlekit/throttlekit/throttler"
)

// legacyStore is the X-Demo-Store value of responses the hand-written
// limiter decided.
const legacyStore = "legacy"

// legacyLimiter is the hand-written limiter the demo's API ran before
// throttlekit, as many APIs still do (GitHub's did): internal/handwritten,
// one fixed window per identifier in memcached, in the classic layout that
// backend/legacy reads. The counter key holds the number of requests in
// the window, denied ones included, raised with INCR; the key plus
// legacybackend.ResetSuffix holds the window's end in Unix seconds. A
// window opens at the first request that finds none open and lasts its
// length, rounded up to a whole second.
//
// It counts one limit of the API's policy (its shortest fixed window) and
// nothing else. It is as simple as such code usually is: each identifier's
// requests must not race, which holds here because every demo client sends
// its requests one after another.
type legacyLimiter struct {
	counter handwritten.Limiter
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

// legacyLimit returns the limit the hand-written limiter counts: policy's
// fixed-window limit with the shortest window (the one that binds first),
// and whether there is one.
func legacyLimit(policy *throttler.Policy) (throttler.Limit, bool) {
	var counted throttler.Limit
	found := false
	for _, l := range policy.Limits() {
		if l.Algorithm == throttler.FixedWindow && (!found || l.Window < counted.Window) {
			counted, found = l, true
		}
	}
	return counted, found
}

// newLegacyLimiter returns the limiter over mc that counts the limit
// legacyLimit picks from policy, or nil when the policy has none. Its keys
// start with prefix.
func newLegacyLimiter(mc *memcache.Client, policy *throttler.Policy, prefix string) *legacyLimiter {
	counted, ok := legacyLimit(policy)
	if !ok {
		return nil
	}
	member := resourceName
	if len(policy.Limits()) > 1 {
		member += ":" + counted.Name
	}
	l := &legacyLimiter{limit: counted.Max, window: counted.Window, prefix: prefix, member: member}
	l.counter = handwritten.Limiter{Client: mc, Limit: counted.Max, Window: counted.Window,
		Key: func(identifier string) string { return l.key("", identifier) }}
	return l
}

// key returns the counter key of identifier: the legacy code's own naming,
// which backend/legacy is given as its KeyFunc.
func (l *legacyLimiter) key(_, identifier string) string {
	return l.prefix + ":rl:" + identifier
}

// allow counts one request of identifier at now: a new window when the
// stored one has ended or is missing, INCR otherwise.
func (l *legacyLimiter) allow(now time.Time, identifier string) (handwritten.Decision, error) {
	return l.counter.Allow(now, identifier)
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
		used := min(d.Count, l.limit)
		remaining := l.limit - used
		untilReset := max(d.Reset-now.Unix(), 0)
		h.Set(middleware.HeaderUsed, strconv.FormatInt(used, 10))
		h.Set(middleware.HeaderReset, strconv.FormatInt(d.Reset, 10))
		if d.Allowed {
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
