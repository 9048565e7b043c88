package middleware

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// headersT0 is a clock reading with a fractional second, so that every
// rounding rule shows.
var headersT0 = time.UnixMilli(1_700_000_000_250)

// headersFailingBackend fails every call: the only way to produce a
// degraded result on demand.
type headersFailingBackend struct{}

func (headersFailingBackend) Decide(context.Context, driver.Request) (driver.Outcome, error) {
	return driver.Outcome{}, errors.New("store unreachable")
}

func headersPolicy(t *testing.T, name, limits string, opts ...throttler.Option) *throttler.Policy {
	t.Helper()
	p, err := throttler.ParsePolicy(name, limits, opts...)
	require.NoError(t, err)
	return p
}

func headersFor(r throttler.Result, now time.Time, p *throttler.Policy, opts HeaderOptions) http.Header {
	h := http.Header{}
	r.At = now
	WriteHeaders(h, r, p, opts)
	return h
}

// TestWriteHeadersFixedWindowTimeline walks one anchored window and checks
// every header of every response against the decision behind it.
func TestWriteHeadersFixedWindowTimeline(t *testing.T) {
	p := headersPolicy(t, "api", "3/min")
	clock := throttlertest.NewManualClock(headersT0)
	th := testkit.Throttler(t, memorybackend.New(), throttler.WithClock(clock))
	ctx := context.Background()
	// The window opens at t0 and ends at t0+60s = ...060.250 s: rounded up.
	wantReset := strconv.FormatInt(1_700_000_061, 10)

	steps := []struct {
		advance                    time.Duration
		allowed                    bool
		remaining, used, rateLimit string
		retryAfter                 string
	}{
		{0, true, "2", "1", `"api";r=2;t=60`, ""},
		{10*time.Second + 500*time.Millisecond, true, "1", "2", `"api";r=1;t=50`, ""},
		{20 * time.Second, true, "0", "3", `"api";r=0;t=30`, ""},
		{1 * time.Millisecond, false, "0", "3", `"api";r=0;t=30`, "30"},
		{29*time.Second + 498*time.Millisecond, false, "0", "3", `"api";r=0;t=1`, "1"},
	}
	for i, s := range steps {
		now := clock.Advance(s.advance)
		r, err := th.Allow(ctx, p, "user:1")
		require.NoError(t, err, "step %d", i)
		require.Equal(t, s.allowed, r.Allowed, "step %d", i)
		h := headersFor(r, now, p, HeaderOptions{})
		assert.Equal(t, "3", h.Get(HeaderLimit), "step %d", i)
		assert.Equal(t, s.remaining, h.Get(HeaderRemaining), "step %d", i)
		assert.Equal(t, s.used, h.Get(HeaderUsed), "step %d", i)
		assert.Equal(t, wantReset, h.Get(HeaderReset), "step %d: reset is the stored window end", i)
		assert.Equal(t, "api", h.Get(HeaderResource), "step %d", i)
		assert.Equal(t, `"api";q=3;w=60`, h.Get(HeaderRateLimitPolicy), "step %d", i)
		assert.Equal(t, s.rateLimit, h.Get(HeaderRateLimit), "step %d", i)
		assert.Equal(t, s.retryAfter, h.Get(HeaderRetryAfter), "step %d", i)
		assert.Empty(t, h.Values(HeaderDegraded), "step %d", i)
	}

	// The next window gets a new, again stable, reset.
	clock.Set(headersT0.Add(61 * time.Second))
	now := clock.Now()
	r, err := th.Allow(ctx, p, "user:1")
	require.NoError(t, err)
	h := headersFor(r, now, p, HeaderOptions{})
	assert.Equal(t, "1700000122", h.Get(HeaderReset)) // t0+121s, rounded up
	assert.Equal(t, "2", h.Get(HeaderRemaining))
}

// TestWriteHeadersDenialNeverClaimsQuota: a cost-2 request with one unit
// left is denied, and no header says a unit remains.
func TestWriteHeadersDenialNeverClaimsQuota(t *testing.T) {
	p := headersPolicy(t, "api", "3/min")
	th := testkit.Throttler(t, memorybackend.New(), throttler.WithClock(throttlertest.NewManualClock(headersT0)))
	_, err := th.AllowN(context.Background(), p, "u", 2)
	require.NoError(t, err)
	r, err := th.AllowN(context.Background(), p, "u", 2)
	require.NoError(t, err)
	require.False(t, r.Allowed)
	require.EqualValues(t, 1, r.Remaining, "the result itself is exact")
	h := headersFor(r, headersT0, p, HeaderOptions{})
	assert.Equal(t, "0", h.Get(HeaderRemaining))
	assert.Equal(t, "3", h.Get(HeaderUsed), "Used + Remaining still equals Limit")
	assert.Equal(t, `"api";r=0;t=60`, h.Get(HeaderRateLimit))
	assert.Equal(t, "60", h.Get(HeaderRetryAfter))
}

// TestWriteHeadersMultiLimit: RateLimit-Policy lists every limit; the
// GitHub headers and RateLimit describe the binding one.
func TestWriteHeadersMultiLimit(t *testing.T) {
	limits := []throttler.Limit{throttler.PerSecond(2).Named("burst"), throttler.PerHour(100).Named("hourly")}
	p, err := throttler.NewPolicy("core", limits)
	require.NoError(t, err)
	clock := throttlertest.NewManualClock(headersT0)
	th := testkit.Throttler(t, memorybackend.New(), throttler.WithClock(clock))
	ctx := context.Background()
	wantPolicy := `"core:burst";q=2;w=1, "core:hourly";q=100;w=3600`

	r, err := th.Allow(ctx, p, "u")
	require.NoError(t, err)
	h := headersFor(r, headersT0, p, HeaderOptions{})
	assert.Equal(t, wantPolicy, h.Get(HeaderRateLimitPolicy))
	assert.Equal(t, "burst", r.Binding)
	assert.Equal(t, "2", h.Get(HeaderLimit))
	assert.Equal(t, "1", h.Get(HeaderRemaining))
	assert.Equal(t, `"core:burst";r=1;t=1`, h.Get(HeaderRateLimit))

	_, err = th.Allow(ctx, p, "u")
	require.NoError(t, err)
	r, err = th.Allow(ctx, p, "u")
	require.NoError(t, err)
	require.False(t, r.Allowed)
	h = headersFor(r, headersT0, p, HeaderOptions{})
	assert.Equal(t, wantPolicy, h.Get(HeaderRateLimitPolicy), "the policy field never changes")
	assert.Equal(t, `"core:burst";r=0;t=1`, h.Get(HeaderRateLimit))
	assert.Equal(t, "1", h.Get(HeaderRetryAfter))
	assert.Equal(t, strconv.FormatInt(ceilUnix(headersT0.Add(time.Second)), 10), h.Get(HeaderReset))

	// A resource name replaces the policy's name everywhere.
	h = headersFor(r, headersT0, p, HeaderOptions{Resource: "search"})
	assert.Equal(t, "search", h.Get(HeaderResource))
	assert.Equal(t, `"search:burst";q=2;w=1, "search:hourly";q=100;w=3600`, h.Get(HeaderRateLimitPolicy))
	assert.Equal(t, `"search:burst";r=0;t=1`, h.Get(HeaderRateLimit))
}

// TestRateLimitPolicyValueWindows covers GCRA and windows that are not
// whole seconds.
func TestRateLimitPolicyValueWindows(t *testing.T) {
	tests := []struct{ limits, want string }{
		{"10/s", `"p";q=10;w=1`},
		{"5/250ms", `"p";q=5;w=1`},
		{"7/1500ms", `"p";q=7;w=2`},
		{"100/2h", `"p";q=100;w=7200`},
		{"60/min aligned", `"p";q=60;w=60`},
		{"10/s gcra", `"p";q=10;w=1`},
		{"10/s gcra burst=50", `"p";q=50;w=5`},
		// A burst equal to Max is the configured rate, whatever rounding
		// the emission interval needs (T = 333334 µs here).
		{"3/s gcra", `"p";q=3;w=1`},
		{"3/s gcra burst=3", `"p";q=3;w=1`},
		{"3/s gcra burst=6", `"p";q=6;w=3`},
	}
	for _, tc := range tests {
		p := headersPolicy(t, "p", tc.limits)
		assert.Equal(t, tc.want, rateLimitPolicyValue(p, ""), tc.limits)
	}
	assert.Empty(t, rateLimitPolicyValue(nil, "x"))
}

// TestWriteHeadersGCRA: on a GCRA denial, Retry-After and t are the time
// until the request fits, and X-RateLimit-Reset is when the bucket is full.
func TestWriteHeadersGCRA(t *testing.T) {
	p := headersPolicy(t, "g", "2/s gcra")
	th := testkit.Throttler(t, memorybackend.New(), throttler.WithClock(throttlertest.NewManualClock(headersT0)))
	ctx := context.Background()
	for range 2 {
		_, err := th.Allow(ctx, p, "u")
		require.NoError(t, err)
	}
	r, err := th.Allow(ctx, p, "u")
	require.NoError(t, err)
	require.False(t, r.Allowed)
	h := headersFor(r, headersT0, p, HeaderOptions{})
	assert.Equal(t, "1", h.Get(HeaderRetryAfter)) // 500 ms, rounded up
	assert.Equal(t, `"g";r=0;t=1`, h.Get(HeaderRateLimit))
	assert.Equal(t, "1700000002", h.Get(HeaderReset)) // full at t0+1s = ...001.250
	assert.Equal(t, "2", h.Get(HeaderLimit))
}

// TestWriteHeadersNeverAllowed: a request that can never succeed gets no
// Retry-After and no reset parameter, whatever h held before.
func TestWriteHeadersNeverAllowed(t *testing.T) {
	p := headersPolicy(t, "api", "3/min")
	th := testkit.Throttler(t, memorybackend.New(), throttler.WithClock(throttlertest.NewManualClock(headersT0)))
	r, err := th.AllowN(context.Background(), p, "u", 4)
	require.ErrorIs(t, err, throttler.ErrCostExceedsLimit)
	require.True(t, r.NeverAllowed)
	h := http.Header{HeaderRetryAfter: {"5"}}
	r.At = headersT0
	WriteHeaders(h, r, p, HeaderOptions{})
	assert.Empty(t, h.Values(HeaderRetryAfter))
	assert.Equal(t, `"api";r=0`, h.Get(HeaderRateLimit))
	assert.Equal(t, "0", h.Get(HeaderRemaining))
	_, ok := retryAfterSeconds(r)
	assert.False(t, ok)
}

// TestWriteHeadersDegraded: invented counts are not published; the
// degraded flag is.
func TestWriteHeadersDegraded(t *testing.T) {
	ctx := context.Background()
	th := testkit.Throttler(t, headersFailingBackend{}, throttler.WithClock(throttlertest.NewManualClock(headersT0)),
		throttler.WithLogger(nil))

	open := headersPolicy(t, "open", "3/min")
	r, err := th.Allow(ctx, open, "u")
	require.NoError(t, err)
	require.True(t, r.Allowed && r.Degraded)
	h := http.Header{HeaderReset: {"stale"}}
	r.At = headersT0
	WriteHeaders(h, r, open, HeaderOptions{})
	assert.Equal(t, "1", h.Get(HeaderDegraded))
	assert.Equal(t, "3", h.Get(HeaderLimit))
	assert.Equal(t, `"open";q=3;w=60`, h.Get(HeaderRateLimitPolicy))
	for _, name := range []string{HeaderRemaining, HeaderUsed, HeaderReset,
		HeaderRateLimit, HeaderRetryAfter} {
		assert.Empty(t, h.Values(name), name)
	}

	closed := headersPolicy(t, "closed", "3/min", throttler.WithFailureMode(throttler.FailClosed))
	r, err = th.Allow(ctx, closed, "u")
	require.NoError(t, err)
	require.True(t, !r.Allowed && r.Degraded)
	h = headersFor(r, headersT0, closed, HeaderOptions{})
	assert.Equal(t, "1", h.Get(HeaderDegraded))
	assert.Equal(t, "1", h.Get(HeaderRetryAfter)) // DefaultDegradedRetryAfter
	assert.Empty(t, h.Values(HeaderRateLimit))
	assert.Empty(t, h.Values(HeaderRemaining))

	h = headersFor(r, headersT0, closed, HeaderOptions{OmitDegraded: true})
	assert.Empty(t, h.Values(HeaderDegraded))
}

// TestWriteHeadersOmit switches each family off in turn.
func TestWriteHeadersOmit(t *testing.T) {
	p := headersPolicy(t, "api", "1/min")
	th := testkit.Throttler(t, memorybackend.New(), throttler.WithClock(throttlertest.NewManualClock(headersT0)))
	_, err := th.Allow(context.Background(), p, "u")
	require.NoError(t, err)
	denied, err := th.Allow(context.Background(), p, "u")
	require.NoError(t, err)
	require.False(t, denied.Allowed)

	github := []string{HeaderLimit, HeaderRemaining, HeaderUsed,
		HeaderReset, HeaderResource}
	tests := []struct {
		name    string
		opts    HeaderOptions
		missing []string
	}{
		{"github", HeaderOptions{OmitGitHub: true}, github},
		{"policy", HeaderOptions{OmitRateLimitPolicy: true}, []string{HeaderRateLimitPolicy}},
		{"ratelimit", HeaderOptions{OmitRateLimit: true}, []string{HeaderRateLimit}},
		{"retry-after", HeaderOptions{OmitRetryAfter: true}, []string{HeaderRetryAfter}},
	}
	all := append(github, HeaderRateLimitPolicy, HeaderRateLimit, HeaderRetryAfter)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := headersFor(denied, headersT0, p, tc.opts)
			for _, name := range all {
				omitted := false
				for _, m := range tc.missing {
					omitted = omitted || m == name
				}
				assert.Equal(t, !omitted, h.Get(name) != "", name)
			}
		})
	}
	assert.Empty(t, headersFor(throttler.Result{}, headersT0, p, HeaderOptions{}),
		"a zero Result writes nothing")
}

// TestHeaderNamesAreEscaped: no policy or resource name can break a field.
func TestHeaderNamesAreEscaped(t *testing.T) {
	p := headersPolicy(t, "a\"b\\c", "1/s")
	assert.Equal(t, `"a\"b\\c";q=1;w=1`, rateLimitPolicyValue(p, ""))
	assert.Equal(t, `"caf%C3%A9%0D%0AX: 1";q=1;w=1`, rateLimitPolicyValue(p, "café\r\nX: 1"))

	th := testkit.Throttler(t, memorybackend.New(), throttler.WithClock(throttlertest.NewManualClock(headersT0)))
	r, err := th.Allow(context.Background(), p, "u")
	require.NoError(t, err)
	h := headersFor(r, headersT0, p, HeaderOptions{Resource: "x\r\ny"})
	assert.Equal(t, "x%0D%0Ay", h.Get(HeaderResource))
}

func TestCeilSecondsAndCeilUnix(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want int64
	}{
		{-time.Second, 0}, {0, 0}, {time.Nanosecond, 1}, {time.Second, 1},
		{time.Second + time.Millisecond, 2}, {59*time.Second + 999*time.Millisecond, 60},
		{throttler.Never, int64(throttler.Never/time.Second) + 1},
	} {
		assert.Equal(t, tc.want, ceilSeconds(tc.d), tc.d.String())
	}
	assert.EqualValues(t, 1_700_000_000, ceilUnix(time.Unix(1_700_000_000, 0)))
	assert.EqualValues(t, 1_700_000_001, ceilUnix(time.Unix(1_700_000_000, 1)))
	assert.EqualValues(t, 1_700_000_001, ceilUnix(time.UnixMilli(1_700_000_000_999)))
}

// TestRateLimitPolicyValueIsBuiltOnce: a policy's RateLimit-Policy value is
// built on its first response and read back afterwards, without copying
// the policy's limits; a value per resource name.
func TestRateLimitPolicyValueIsBuiltOnce(t *testing.T) {
	want := `"core:burst";q=2;w=1, "core:hourly";q=100;w=3600`
	p, err := throttler.NewPolicy("core", []throttler.Limit{throttler.PerSecond(2).Named("burst"), throttler.PerHour(100).Named("hourly")})
	require.NoError(t, err)
	require.Equal(t, want, rateLimitPolicyValue(p, ""))
	assert.Equal(t, `"api:burst";q=2;w=1, "api:hourly";q=100;w=3600`, rateLimitPolicyValue(p, "api"))
	allocs := testing.AllocsPerRun(100, func() {
		if v := rateLimitPolicyValue(p, ""); v != want {
			t.Fatalf("got %q", v)
		}
	})
	assert.Zero(t, allocs, "a cached value is read back without allocating")
}

// TestViolatedPoliciesReadsEachLimit: the names of every limit that denied
// a multi-limit request, in the policy's order, read with LimitAt.
func TestViolatedPoliciesReadsEachLimit(t *testing.T) {
	p, err := throttler.NewPolicy("core", []throttler.Limit{throttler.PerSecond(1).Named("a"),
		throttler.PerHour(5).Named("b"), throttler.PerMinute(1).Named("c")})
	require.NoError(t, err)
	th := testkit.Throttler(t, memorybackend.New(), throttler.WithClock(throttlertest.NewManualClock(headersT0)))
	ctx := context.Background()
	_, err = th.Allow(ctx, p, "u")
	require.NoError(t, err)
	r, err := th.Allow(ctx, p, "u")
	require.NoError(t, err)
	require.False(t, r.Allowed)
	assert.Equal(t, []string{"core:a", "core:c"}, violatedPolicies(r, ""))
	assert.Equal(t, []string{"api:a", "api:c"}, violatedPolicies(r, "api"))
	allowed, err := th.Allow(ctx, p, "v")
	require.NoError(t, err)
	assert.Nil(t, violatedPolicies(allowed, ""))
}
