package middleware_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/middleware"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// checkHeaders compares every rate-limit header of a reply with the
// decision behind it and returns the parsed RateLimit member.
func checkHeaders(t *testing.T, rp reply, d throttler.Result, now time.Time, resource string) rateLimitItem {
	t.Helper()
	h := rp.header
	assert.Equal(t, d.Limit, headerInt(t, h, middleware.HeaderLimit), "limit")
	assert.Equal(t, d.Used, headerInt(t, h, middleware.HeaderUsed), "used")
	assert.Equal(t, resource, h.Get(middleware.HeaderResource), "resource")
	remaining := headerInt(t, h, middleware.HeaderRemaining)
	reset := headerInt(t, h, middleware.HeaderReset)
	assert.Equal(t, middleware.CeilUnix(d.ResetAt), reset, "reset is ResetAt rounded up")
	assert.GreaterOrEqual(t, reset*1000, d.ResetAt.UnixMilli(), "reset never before ResetAt")
	item := parseRateLimit(h.Get(middleware.HeaderRateLimit))
	require.True(t, item.wellFormed, "RateLimit %q", h.Get(middleware.HeaderRateLimit))
	assert.Equal(t, remaining, item.remaining, "RateLimit r equals X-RateLimit-Remaining")
	assert.Empty(t, h.Values(middleware.HeaderDegraded))
	if d.Allowed {
		assert.Equal(t, http.StatusOK, rp.status)
		assert.Equal(t, d.Remaining, remaining)
		assert.Equal(t, middleware.CeilSeconds(d.ResetAt.Sub(now)), item.reset, "t on allow: until ResetAt, up")
		assert.Empty(t, h.Values(middleware.HeaderRetryAfter), "no Retry-After on allow")
		return item
	}
	assert.Equal(t, http.StatusTooManyRequests, rp.status)
	assert.Zero(t, remaining, "a denial never claims remaining quota")
	assert.Zero(t, item.remaining)
	retry := headerInt(t, h, middleware.HeaderRetryAfter)
	assert.Equal(t, middleware.CeilSeconds(d.RetryAfter), retry, "Retry-After is RetryAfter, up")
	assert.GreaterOrEqual(t, retry, item.reset, "Retry-After >= RateLimit t")
	assert.Positive(t, retry)
	return item
}

// TestHeadersMatchDecisions walks two anchored windows over real HTTP and
// checks every header of every response against its decision, and that
// X-RateLimit-Reset stays put within a window.
func TestHeadersMatchDecisions(t *testing.T) {
	rg := newRig(t, nil)
	p := policy(t, "api", "3/min")
	lim, err := middleware.New(rg.th, []middleware.Rule{{Policy: p, Identify: middleware.ClientIP(middleware.ClientIPOptions{})}})
	require.NoError(t, err)
	srv := serve(t, lim, statusHandler)

	steps := []struct {
		advance time.Duration
		allowed bool
		t       int64
	}{
		{0, true, 60},
		{10*time.Second + 500*time.Millisecond, true, 50}, // 49.5 s left
		{19 * time.Second, true, 31},                      // 30.5 s left
		{time.Millisecond, false, 31},
		{30 * time.Second, false, 1},
		{498 * time.Millisecond, false, 1}, // 1 ms before the window ends
		{time.Millisecond, true, 60},       // a new window opens at t0+60s
		{59 * time.Second, true, 1},
		{999 * time.Millisecond, true, 1},
		{0, false, 1}, // 1 ms left, rounded up
	}
	resets := map[int64]int{}
	var lastReset int64
	for i, s := range steps {
		now := rg.clock.Advance(s.advance)
		rp := get(t, srv, "/")
		d := rg.decisions.last(t)
		require.Equal(t, s.allowed, d.Allowed, "step %d", i)
		item := checkHeaders(t, rp, d, now, "api")
		assert.Equal(t, "api", item.name, "step %d", i)
		assert.Equal(t, s.t, item.reset, "step %d", i)
		if d.Allowed {
			assert.Equal(t, "127.0.0.1", rp.body, "step %d", i)
		}
		lastReset = headerInt(t, rp.header, middleware.HeaderReset)
		resets[lastReset]++
		assert.Equal(t, `"api";q=3;w=60`, rp.header.Get(middleware.HeaderRateLimitPolicy), "step %d", i)
	}
	// Two windows, two resets: t0+60s and t0+120s, each rounded up from
	// .250 to the next whole second.
	assert.Equal(t, map[int64]int{1_700_000_061: 6, 1_700_000_121: 4}, resets)
	assert.EqualValues(t, 1_700_000_121, lastReset)
}

// TestRetryAfterNeverBeforeReset runs the same bounded request sequence
// through every algorithm and a multi-limit policy and checks the
// invariants a client relies on at every response.
func TestRetryAfterNeverBeforeReset(t *testing.T) {
	for _, limits := range []string{"2/min", "2/min aligned", "2/s gcra", "4/s gcra burst=2", "1/s, 3/min", "3/min, 1/s gcra"} {
		t.Run(limits, func(t *testing.T) {
			rg := newRig(t, nil)
			p := policy(t, "api", limits)
			lim, err := middleware.New(rg.th, []middleware.Rule{{Policy: p, Identify: middleware.ClientIP(middleware.ClientIPOptions{})}})
			require.NoError(t, err)
			srv := serve(t, lim, statusHandler)
			denials := 0
			for i := range 24 {
				now := rg.clock.Advance(time.Duration(i%5) * 150 * time.Millisecond)
				rp := get(t, srv, "/")
				d := rg.decisions.last(t)
				resource := "api"
				item := checkHeaders(t, rp, d, now, resource)
				wantName := "api"
				if len(p.Limits()) > 1 {
					wantName = "api:" + d.Binding
				}
				assert.Equal(t, wantName, item.name)
				if !d.Allowed {
					denials++
				}
			}
			assert.Positive(t, denials, "the sequence must reach a denial")
		})
	}
}

// TestRefundNotModified charges at the start, keeps the charge while the
// handler runs, and gives it back once a 304 has been answered.
func TestRefundNotModified(t *testing.T) {
	rg := newRig(t, nil)
	p := policy(t, "api", "3/min")
	ip := middleware.ClientIP(middleware.ClientIPOptions{})
	lim, err := middleware.New(rg.th, []middleware.Rule{{Policy: p, Identify: ip}})
	require.NoError(t, err)
	// The handler reports what the store held while it ran.
	duringHandler := make(chan int64, 8)
	srv := serve(t, lim, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		peek, err := rg.th.Peek(r.Context(), p, "127.0.0.1")
		if err != nil {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		duringHandler <- peek.Remaining
		if r.URL.Query().Get("hints") != "" {
			w.Header().Set("Link", "</style.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
		}
		statusHandler.ServeHTTP(w, r)
	}))

	rp := get(t, srv, "/")
	assert.EqualValues(t, 2, headerInt(t, rp.header, middleware.HeaderRemaining))
	<-duringHandler

	rp = get(t, srv, "/?status=304")
	assert.Equal(t, http.StatusNotModified, rp.status)
	assert.EqualValues(t, 1, headerInt(t, rp.header, middleware.HeaderRemaining), "the 304's own headers show the charge")
	assert.EqualValues(t, 1, <-duringHandler, "the unit stays spent while the handler runs")

	rp = get(t, srv, "/")
	assert.EqualValues(t, 1, headerInt(t, rp.header, middleware.HeaderRemaining), "the next request sees the unit back")

	// An Early Hints response before the 304 does not hide it.
	rp = get(t, srv, "/?status=304&hints=1")
	assert.Equal(t, http.StatusNotModified, rp.status)
	after, err := rg.th.Peek(context.Background(), p, "127.0.0.1")
	require.NoError(t, err)
	assert.EqualValues(t, 1, after.Remaining)

	// A 404 is not refunded by default.
	get(t, srv, "/?status=404")
	after, err = rg.th.Peek(context.Background(), p, "127.0.0.1")
	require.NoError(t, err)
	assert.EqualValues(t, 0, after.Remaining)
}

// TestRefundStatusesConfigurable: the refund set replaces the default.
func TestRefundStatusesConfigurable(t *testing.T) {
	for _, tc := range []struct {
		name     string
		opts     []middleware.Option
		status   int
		refunded bool
	}{
		{"default 304", nil, 304, true},
		{"default 200", nil, 200, false},
		{"404 only: 404", []middleware.Option{middleware.WithRefundStatuses(404)}, 404, true},
		{"404 only: 304", []middleware.Option{middleware.WithRefundStatuses(404)}, 304, false},
		{"none", []middleware.Option{middleware.WithRefundStatuses()}, 304, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rg := newRig(t, nil)
			p := policy(t, "api", "5/min")
			lim, err := middleware.New(rg.th, []middleware.Rule{{Policy: p, Identify: middleware.ClientIP(middleware.ClientIPOptions{})}}, tc.opts...)
			require.NoError(t, err)
			srv := serve(t, lim, statusHandler)
			rp := get(t, srv, "/?status="+strconv.Itoa(tc.status))
			require.Equal(t, tc.status, rp.status)
			r, err := rg.th.Peek(context.Background(), p, "127.0.0.1")
			require.NoError(t, err)
			want := int64(4)
			if tc.refunded {
				want = 5
			}
			assert.Equal(t, want, r.Remaining)
		})
	}
}

// TestResponseWriterKeepsCapabilities streams through the wrapped writer
// with http.Flusher, http.ResponseController and io.Copy, and hijacks it.
func TestResponseWriterKeepsCapabilities(t *testing.T) {
	rg := newRig(t, nil)
	p := policy(t, "api", "10/min")
	lim, err := middleware.New(rg.th, []middleware.Rule{{Policy: p, Identify: middleware.ClientIP(middleware.ClientIPOptions{})}})
	require.NoError(t, err)
	problems := make(chan string, 8)
	srv := serve(t, lim, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/stream":
			f, ok := w.(http.Flusher)
			if !ok {
				problems <- "not a Flusher"
				return
			}
			rc := http.NewResponseController(w)
			if err := rc.SetWriteDeadline(time.Now().Add(time.Minute)); err != nil {
				problems <- "SetWriteDeadline: " + err.Error()
			}
			if err := rc.EnableFullDuplex(); err != nil {
				problems <- "EnableFullDuplex: " + err.Error()
			}
			_, _ = w.Write([]byte("one,"))
			f.Flush()
			_, _ = w.Write([]byte("two,"))
			if err := rc.Flush(); err != nil {
				problems <- "Flush: " + err.Error()
			}
			if _, ok := w.(io.ReaderFrom); !ok {
				problems <- "not an io.ReaderFrom"
			}
			if _, err := io.Copy(w, strings.NewReader("three")); err != nil {
				problems <- "io.Copy: " + err.Error()
			}
		case "/hijack":
			conn, buf, err := http.NewResponseController(w).Hijack()
			if err != nil {
				problems <- "Hijack: " + err.Error()
				return
			}
			_, _ = buf.WriteString("HTTP/1.1 304 Not Modified\r\nConnection: close\r\n\r\n")
			_ = buf.Flush()
			_ = conn.Close()
		}
	}))

	rp := get(t, srv, "/stream")
	assert.Equal(t, http.StatusOK, rp.status)
	assert.Equal(t, "one,two,three", rp.body)
	assert.EqualValues(t, 9, headerInt(t, rp.header, middleware.HeaderRemaining))

	rp = get(t, srv, "/hijack")
	assert.Equal(t, http.StatusNotModified, rp.status)
	close(problems)
	for p := range problems {
		t.Error(p)
	}
	r, err := rg.th.Peek(context.Background(), p, "127.0.0.1")
	require.NoError(t, err)
	assert.EqualValues(t, 8, r.Remaining, "a hijacked 304 is not refunded: its status is unknown")
}

// TestSpoofedForwardedForOverHTTP: a loopback client is its own identifier
// whatever X-Forwarded-For says, until loopback is a trusted proxy.
func TestSpoofedForwardedForOverHTTP(t *testing.T) {
	p := policy(t, "api", "1/min")
	untrusted := middleware.ClientIP(middleware.ClientIPOptions{})
	trustedNets, err := middleware.TrustProxies("127.0.0.1/32", "::1")
	require.NoError(t, err)
	trusted := middleware.ClientIP(middleware.ClientIPOptions{TrustedProxies: trustedNets})

	rg := newRig(t, nil)
	lim, err := middleware.New(rg.th, []middleware.Rule{{Policy: p, Identify: untrusted}})
	require.NoError(t, err)
	srv := serve(t, lim, statusHandler)
	rp := get(t, srv, "/", "X-Forwarded-For", "198.51.100.1")
	assert.Equal(t, "127.0.0.1", rp.body, "spoofed header ignored")
	rp = get(t, srv, "/", "X-Forwarded-For", "198.51.100.2")
	assert.Equal(t, http.StatusTooManyRequests, rp.status, "a new spoofed address does not buy a new quota")

	rg = newRig(t, nil)
	lim, err = middleware.New(rg.th, []middleware.Rule{{Policy: p, Identify: trusted}})
	require.NoError(t, err)
	srv = serve(t, lim, statusHandler)
	rp = get(t, srv, "/", "X-Forwarded-For", "198.51.100.1")
	assert.Equal(t, "198.51.100.1", rp.body)
	rp = get(t, srv, "/", "X-Forwarded-For", "198.51.100.2")
	assert.Equal(t, "198.51.100.2", rp.body)
	rp = get(t, srv, "/", "X-Forwarded-For", "203.0.113.9, 198.51.100.1")
	assert.Equal(t, http.StatusTooManyRequests, rp.status, "the rightmost untrusted hop is the client")
	rp = get(t, srv, "/", "X-Forwarded-For", "not an address")
	assert.Equal(t, "127.0.0.1", rp.body, "malformed header: the peer")
}

type authKey struct{}

// authenticate stands in for an authentication middleware: a bearer token
// names the user.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if user, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			r = r.WithContext(context.WithValue(r.Context(), authKey{}, user))
		}
		next.ServeHTTP(w, r)
	})
}

func userFromContext(ctx context.Context) (string, bool) {
	u, ok := ctx.Value(authKey{}).(string)
	return u, ok && u != ""
}

// TestIPAndUserSubjects decides a signed-in request for its IP and its user
// at once, gives the IP's unit back when the user's policy denies, and
// decides an anonymous request by IP alone.
func TestIPAndUserSubjects(t *testing.T) {
	rg := newRig(t, nil)
	anon := policy(t, "anon", "10/min")
	users := policy(t, "users", "2/min")
	lim, err := middleware.New(rg.th, []middleware.Rule{
		{Policy: anon, Identify: middleware.ClientIP(middleware.ClientIPOptions{}), Resource: "ip"},
		{Policy: users, Identify: middleware.User(userFromContext), Resource: "user"},
	})
	require.NoError(t, err)
	srv := serveHandler(t, authenticate(lim.Handler(statusHandler)))
	alice := []string{"Authorization", "Bearer alice"}
	bothPolicies := `"ip";q=10;w=60, "user";q=2;w=60`

	rp := get(t, srv, "/", alice...)
	require.Equal(t, http.StatusOK, rp.status)
	assert.Equal(t, "user", rp.header.Get(middleware.HeaderResource), "the user has the least left")
	assert.Equal(t, bothPolicies, rp.header.Get(middleware.HeaderRateLimitPolicy))
	assert.Equal(t, `"user";r=1;t=60`, rp.header.Get(middleware.HeaderRateLimit))
	assert.Equal(t, "alice", rp.body, "the binding subject's identifier")

	get(t, srv, "/", alice...)
	rp = get(t, srv, "/", alice...)
	require.Equal(t, http.StatusTooManyRequests, rp.status)
	assert.Equal(t, "user", rp.header.Get(middleware.HeaderResource))
	assert.Equal(t, bothPolicies, rp.header.Get(middleware.HeaderRateLimitPolicy), "same policy field whichever subject binds")
	assert.Equal(t, `"user";r=0;t=60`, rp.header.Get(middleware.HeaderRateLimit))
	var prob middleware.Problem
	require.NoError(t, json.Unmarshal([]byte(rp.body), &prob))
	assert.Equal(t, []string{"user"}, prob.ViolatedPolicies)
	assert.NotContains(t, rp.body, "alice")

	ipState, err := rg.th.Peek(context.Background(), anon, "127.0.0.1")
	require.NoError(t, err)
	assert.EqualValues(t, 2, ipState.Used, "the denied request's IP unit was given back")

	rp = get(t, srv, "/")
	require.Equal(t, http.StatusOK, rp.status, "anonymous: the IP subject alone")
	assert.Equal(t, "ip", rp.header.Get(middleware.HeaderResource))
	assert.Equal(t, `"ip";q=10;w=60`, rp.header.Get(middleware.HeaderRateLimitPolicy))
	assert.EqualValues(t, 7, headerInt(t, rp.header, middleware.HeaderRemaining))

	// A 304 for a signed-in request refunds both subjects.
	rg.clock.Advance(time.Minute)
	rp = get(t, srv, "/?status=304", alice...)
	require.Equal(t, http.StatusNotModified, rp.status)
	for _, s := range []struct {
		p  *throttler.Policy
		id string
	}{{anon, "127.0.0.1"}, {users, "alice"}} {
		r, err := rg.th.Peek(context.Background(), s.p, s.id)
		require.NoError(t, err)
		assert.Zero(t, r.Used, s.p.Name())
	}
}

// TestUnlessSplitsAnonymousFromUsers: with Unless, a signed-in user never
// spends the anonymous IP quota.
func TestUnlessSplitsAnonymousFromUsers(t *testing.T) {
	rg := newRig(t, nil)
	anon := policy(t, "anon", "1/min")
	users := policy(t, "users", "5/min")
	user := middleware.User(userFromContext)
	lim, err := middleware.New(rg.th, []middleware.Rule{
		{Policy: anon, Identify: middleware.Unless(middleware.ClientIP(middleware.ClientIPOptions{}), user)},
		{Policy: users, Identify: user},
	})
	require.NoError(t, err)
	srv := serveHandler(t, authenticate(lim.Handler(statusHandler)))
	for range 3 {
		rp := get(t, srv, "/", "Authorization", "Bearer bob")
		require.Equal(t, http.StatusOK, rp.status)
		assert.Equal(t, `"users";q=5;w=60`, rp.header.Get(middleware.HeaderRateLimitPolicy))
	}
	assert.Equal(t, http.StatusOK, get(t, srv, "/").status)
	assert.Equal(t, http.StatusTooManyRequests, get(t, srv, "/").status)
}

// TestDegradedBackend: a failing store is visible in a header, fails open
// by default and answers 503 when the policy fails closed.
func TestDegradedBackend(t *testing.T) {
	rg := newRig(t, failingBackend{})
	open := policy(t, "open", "3/min")
	closed := policy(t, "closed", "3/min", throttler.WithFailureMode(throttler.FailClosed))
	ip := middleware.ClientIP(middleware.ClientIPOptions{})

	lim, err := middleware.New(rg.th, []middleware.Rule{{Policy: open, Identify: ip}})
	require.NoError(t, err)
	rp := get(t, serve(t, lim, statusHandler), "/")
	assert.Equal(t, http.StatusOK, rp.status)
	assert.Equal(t, "1", rp.header.Get(middleware.HeaderDegraded))
	assert.Equal(t, "3", rp.header.Get(middleware.HeaderLimit))
	assert.Equal(t, `"open";q=3;w=60`, rp.header.Get(middleware.HeaderRateLimitPolicy))
	for _, name := range []string{middleware.HeaderRemaining, middleware.HeaderUsed, middleware.HeaderReset,
		middleware.HeaderRateLimit, middleware.HeaderRetryAfter} {
		assert.Empty(t, rp.header.Values(name), "%s is not known when the store failed", name)
	}
	d := rg.decisions.last(t)
	assert.True(t, d.Degraded)
	assert.ErrorIs(t, d.Err, errStoreDown)

	lim, err = middleware.New(rg.th, []middleware.Rule{{Policy: closed, Identify: ip}})
	require.NoError(t, err)
	rp = get(t, serve(t, lim, statusHandler), "/")
	assert.Equal(t, http.StatusServiceUnavailable, rp.status)
	assert.Equal(t, "1", rp.header.Get(middleware.HeaderDegraded))
	assert.Equal(t, "1", rp.header.Get(middleware.HeaderRetryAfter))
	assert.Empty(t, rp.header.Values(middleware.HeaderRateLimit))
	prob := decodeProblem(t, rp)
	assert.Equal(t, middleware.TypeTemporaryReducedCapacity, prob.Type)
	assert.Equal(t, http.StatusServiceUnavailable, prob.Status)
	assert.Empty(t, prob.ViolatedPolicies)
	assert.NotContains(t, rp.body, errStoreDown.Error(), "backend errors stay on the server")
}

func decodeProblem(t *testing.T, rp reply) middleware.Problem {
	t.Helper()
	assert.Equal(t, "application/problem+json", rp.header.Get("Content-Type"))
	var raw map[string]any
	require.NoError(t, json.Unmarshal([]byte(rp.body), &raw), rp.body)
	for _, member := range []string{"type", "title", "status", "detail"} {
		assert.Contains(t, raw, member)
	}
	var p middleware.Problem
	require.NoError(t, json.Unmarshal([]byte(rp.body), &p))
	assert.Equal(t, rp.status, p.Status, "body status matches the response")
	return p
}

// TestNeverAllowed: a cost above the quota is denied with its own problem
// type, no Retry-After and no reset parameter, and spends nothing.
func TestNeverAllowed(t *testing.T) {
	for _, tc := range []struct {
		name   string
		opts   []middleware.Option
		status int
	}{
		{"default status", nil, http.StatusTooManyRequests},
		{"413", []middleware.Option{middleware.WithNeverAllowedStatus(http.StatusRequestEntityTooLarge)}, http.StatusRequestEntityTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rg := newRig(t, nil)
			p := policy(t, "api", "3/min")
			cost := middleware.WithCost(func(r *http.Request) int64 {
				n, err := strconv.ParseInt(r.Header.Get("X-Cost"), 10, 64)
				if err != nil {
					return 1
				}
				return n
			})
			lim, err := middleware.New(rg.th, []middleware.Rule{{Policy: p, Identify: middleware.ClientIP(middleware.ClientIPOptions{})}},
				append([]middleware.Option{cost}, tc.opts...)...)
			require.NoError(t, err)
			srv := serve(t, lim, statusHandler)

			rp := get(t, srv, "/", "X-Cost", "4")
			assert.Equal(t, tc.status, rp.status)
			assert.Empty(t, rp.header.Values(middleware.HeaderRetryAfter), "never a finite Retry-After")
			assert.Equal(t, `"api";r=0`, rp.header.Get(middleware.HeaderRateLimit), "no reset parameter")
			assert.Equal(t, "0", rp.header.Get(middleware.HeaderRemaining))
			prob := decodeProblem(t, rp)
			assert.Equal(t, middleware.TypeCostExceedsLimit, prob.Type)
			assert.Equal(t, []string{"api"}, prob.ViolatedPolicies)
			assert.Contains(t, prob.Detail, "costs 4 units")
			assert.True(t, rg.decisions.last(t).NeverAllowed)

			rp = get(t, srv, "/", "X-Cost", "3")
			assert.Equal(t, http.StatusOK, rp.status, "the refused request spent nothing")
			assert.Equal(t, "0", rp.header.Get(middleware.HeaderRemaining))
		})
	}
}

// TestDenialProblem: the body of an ordinary denial, at the default and a
// configured status, holds no identifier.
func TestDenialProblem(t *testing.T) {
	const token = "s3cr3t-token-value"
	for _, status := range []int{0, http.StatusForbidden} {
		t.Run(strconv.Itoa(status), func(t *testing.T) {
			rg := newRig(t, nil)
			p := policy(t, "core", "1/min, 100/h")
			var opts []middleware.Option
			want := http.StatusTooManyRequests
			if status != 0 {
				opts, want = append(opts, middleware.WithDenyStatus(status)), status
			}
			lim, err := middleware.New(rg.th, []middleware.Rule{{Policy: p, Identify: middleware.Header("X-Api-Key")}}, opts...)
			require.NoError(t, err)
			srv := serve(t, lim, statusHandler)
			require.Equal(t, http.StatusOK, get(t, srv, "/", "X-Api-Key", token).status)
			rg.clock.Advance(20 * time.Second)
			rp := get(t, srv, "/", "X-Api-Key", token)
			require.Equal(t, want, rp.status)
			prob := decodeProblem(t, rp)
			assert.Equal(t, middleware.TypeQuotaExceeded, prob.Type)
			assert.Equal(t, "Quota Exceeded", prob.Title)
			assert.Equal(t, []string{"core:1/min"}, prob.ViolatedPolicies)
			assert.Equal(t, `Quota "core:1/min" (1/min) is spent; try again in 40 s.`, prob.Detail)
			assert.Equal(t, "40", rp.header.Get(middleware.HeaderRetryAfter))
			assert.NotContains(t, rp.body, token)
			for name, values := range rp.header {
				assert.NotContains(t, strings.Join(values, " "), token, name)
			}
		})
	}
}

// TestHashedHeaderIdentifier keeps tokens out of the store.
func TestHashedHeaderIdentifier(t *testing.T) {
	rg := newRig(t, nil)
	p := policy(t, "api", "5/min")
	lim, err := middleware.New(rg.th, []middleware.Rule{{Policy: p, Identify: middleware.Hashed(middleware.Header("X-Api-Key"))}})
	require.NoError(t, err)
	rp := get(t, serve(t, lim, statusHandler), "/", "X-Api-Key", "tok")
	require.Equal(t, http.StatusOK, rp.status)
	assert.Len(t, rp.body, 64)
	assert.NotContains(t, rp.body, "tok")
	assert.Equal(t, rg.decisions.last(t).Identifier, rp.body)
}

// TestErrorHandling routes throttler errors to the error handler.
func TestErrorHandling(t *testing.T) {
	longKey := strings.Repeat("k", driver.MaxIdentifierLen+1)
	p := policy(t, "api", "5/min")
	subjects := []middleware.Rule{{Policy: p, Identify: middleware.Header("X-Api-Key")}}

	t.Run("default: invalid identifier is 400", func(t *testing.T) {
		lim, err := middleware.New(newRig(t, nil).th, subjects)
		require.NoError(t, err)
		rp := get(t, serve(t, lim, statusHandler), "/", "X-Api-Key", longKey)
		assert.Equal(t, http.StatusBadRequest, rp.status)
		assert.Equal(t, "about:blank", decodeProblem(t, rp).Type)
		assert.Empty(t, rp.header.Values(middleware.HeaderLimit))
		assert.NotContains(t, rp.body, longKey)
	})
	t.Run("default: negative cost is 400", func(t *testing.T) {
		lim, err := middleware.New(newRig(t, nil).th, subjects,
			middleware.WithCost(func(*http.Request) int64 { return -1 }))
		require.NoError(t, err)
		rp := get(t, serve(t, lim, statusHandler), "/", "X-Api-Key", "k")
		assert.Equal(t, http.StatusBadRequest, rp.status)
	})
	t.Run("pass through", func(t *testing.T) {
		lim, err := middleware.New(newRig(t, nil).th, subjects, middleware.WithErrorHandler(middleware.PassThrough))
		require.NoError(t, err)
		rp := get(t, serve(t, lim, statusHandler), "/", "X-Api-Key", longKey)
		assert.Equal(t, http.StatusOK, rp.status)
		assert.Empty(t, rp.header.Values(middleware.HeaderLimit), "no decision, no headers")
	})
	t.Run("custom", func(t *testing.T) {
		errs := make(chan error, 1)
		lim, err := middleware.New(newRig(t, nil).th, subjects, middleware.WithErrorHandler(
			func(w http.ResponseWriter, r *http.Request, err error) bool {
				errs <- err
				w.WriteHeader(http.StatusTeapot)
				return false
			}))
		require.NoError(t, err)
		rp := get(t, serve(t, lim, statusHandler), "/", "X-Api-Key", longKey)
		assert.Equal(t, http.StatusTeapot, rp.status)
		assert.ErrorIs(t, <-errs, throttler.ErrInvalidIdentifier)
	})
}

// TestNoSubjectApplies: a request no subject names passes untouched.
func TestNoSubjectApplies(t *testing.T) {
	rg := newRig(t, nil)
	lim, err := middleware.New(rg.th, []middleware.Rule{{Policy: policy(t, "api", "1/min"), Identify: middleware.Header("X-Api-Key")}})
	require.NoError(t, err)
	srv := serve(t, lim, statusHandler)
	for range 3 {
		rp := get(t, srv, "/")
		assert.Equal(t, http.StatusOK, rp.status)
		assert.Empty(t, rp.body, "no Result in the context")
		for _, name := range []string{middleware.HeaderLimit, middleware.HeaderRateLimit, middleware.HeaderRateLimitPolicy} {
			assert.Empty(t, rp.header.Values(name))
		}
	}
}

// TestHeaderFamiliesOff switches every family off over HTTP.
func TestHeaderFamiliesOff(t *testing.T) {
	rg := newRig(t, nil)
	lim, err := middleware.New(rg.th, []middleware.Rule{{Policy: policy(t, "api", "1/min"), Identify: middleware.ClientIP(middleware.ClientIPOptions{})}},
		middleware.WithHeaderOptions(middleware.HeaderOptions{OmitGitHub: true, OmitRateLimitPolicy: true,
			OmitRateLimit: true, OmitRetryAfter: true, OmitDegraded: true, Resource: "ignored"}))
	require.NoError(t, err)
	srv := serve(t, lim, statusHandler)
	get(t, srv, "/")
	rp := get(t, srv, "/")
	require.Equal(t, http.StatusTooManyRequests, rp.status)
	for name := range rp.header {
		assert.NotContains(t, strings.ToLower(name), "ratelimit", name)
		assert.NotEqual(t, middleware.HeaderRetryAfter, name)
	}
}

// TestCustomDenyHandler replaces the body and keeps the headers.
func TestCustomDenyHandler(t *testing.T) {
	rg := newRig(t, nil)
	lim, err := middleware.New(rg.th, []middleware.Rule{{Policy: policy(t, "api", "1/min"), Identify: middleware.ClientIP(middleware.ClientIPOptions{})}},
		middleware.WithDenyHandler(func(w http.ResponseWriter, r *http.Request, res throttler.Result, p middleware.Problem) {
			w.Header().Set("Content-Type", "text/plain")
			w.WriteHeader(p.Status)
			_, _ = w.Write([]byte("slow down, retry in " + w.Header().Get("Retry-After")))
		}))
	require.NoError(t, err)
	srv := serve(t, lim, statusHandler)
	get(t, srv, "/")
	rp := get(t, srv, "/")
	assert.Equal(t, http.StatusTooManyRequests, rp.status)
	assert.Equal(t, "slow down, retry in 60", rp.body)
	assert.Equal(t, "0", rp.header.Get(middleware.HeaderRemaining))
}

// TestNewRejectsBadConfig: every configuration mistake is an driver.ErrInvalidOption.
func TestNewRejectsBadConfig(t *testing.T) {
	th := newRig(t, nil).th
	p := policy(t, "api", "1/min")
	q := policy(t, "other", "1/min")
	ip := middleware.ClientIP(middleware.ClientIPOptions{})
	ok := []middleware.Rule{{Policy: p, Identify: ip}}
	for _, tc := range []struct {
		name     string
		th       *throttler.Throttler
		subjects []middleware.Rule
		opts     []middleware.Option
	}{
		{"nil throttler", nil, ok, nil},
		{"no subjects", th, nil, nil},
		{"nil policy", th, []middleware.Rule{{Identify: ip}}, nil},
		{"zero policy", th, []middleware.Rule{{Policy: &throttler.Policy{}, Identify: ip}}, nil},
		{"nil identify", th, []middleware.Rule{{Policy: p}}, nil},
		{"shared policy", th, []middleware.Rule{{Policy: p, Identify: ip}, {Policy: p, Identify: ip, Resource: "b"}}, nil},
		{"shared resource", th, []middleware.Rule{{Policy: p, Identify: ip}, {Policy: q, Identify: ip, Resource: "api"}}, nil},
		{"status 0", th, ok, []middleware.Option{middleware.WithDenyStatus(0)}},
		{"status 1000", th, ok, []middleware.Option{middleware.WithDegradedStatus(1000)}},
		{"status 103", th, ok, []middleware.Option{middleware.WithNeverAllowedStatus(103)}},
		{"nil cost", th, ok, []middleware.Option{middleware.WithCost(nil)}},
		{"nil error handler", th, ok, []middleware.Option{middleware.WithErrorHandler(nil)}},
		{"nil deny handler", th, ok, []middleware.Option{middleware.WithDenyHandler(nil)}},
		{"nil option", th, ok, []middleware.Option{nil}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lim, err := middleware.New(tc.th, tc.subjects, tc.opts...)
			assert.Nil(t, lim)
			assert.True(t, errors.Is(err, driver.ErrInvalidOption), "%v", err)
		})
	}
}
