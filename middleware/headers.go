package middleware

import (
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
)

// Names of the response header fields WriteHeaders sets.
const (
	// HeaderLimit is GitHub's X-RateLimit-Limit: the binding limit's quota
	// (Max, or Burst for GCRA).
	HeaderLimit = "X-RateLimit-Limit"
	// HeaderRemaining is GitHub's X-RateLimit-Remaining: units left in the
	// binding limit after this request; 0 on every denial.
	HeaderRemaining = "X-RateLimit-Remaining"
	// HeaderUsed is GitHub's X-RateLimit-Used: units of the binding limit
	// spent, this request included when it was allowed.
	HeaderUsed = "X-RateLimit-Used"
	// HeaderReset is GitHub's X-RateLimit-Reset: the binding limit's ResetAt
	// in Unix seconds, rounded up.
	HeaderReset = "X-RateLimit-Reset"
	// HeaderResource is GitHub's X-RateLimit-Resource: the policy's name,
	// or HeaderOptions.Resource.
	HeaderResource = "X-RateLimit-Resource"
	// HeaderRateLimitPolicy is the IETF RateLimit-Policy field: one list
	// member per limit of the policy.
	HeaderRateLimitPolicy = "RateLimit-Policy"
	// HeaderRateLimit is the IETF RateLimit field: one list member, the
	// binding limit.
	HeaderRateLimit = "RateLimit"
	// HeaderRetryAfter is Retry-After in whole seconds, rounded up, sent on
	// a denial that can succeed later.
	HeaderRetryAfter = "Retry-After"
	// HeaderDegraded is set to "1" when the backend failed and the policy's
	// failure mode decided the request instead.
	HeaderDegraded = "X-RateLimit-Degraded"
)

// maxSFInteger is the largest Integer a structured field may carry (RFC
// 9651: at most 15 decimal digits).
const maxSFInteger = 999_999_999_999_999

// HeaderOptions selects which header families WriteHeaders sets. The zero
// value sets every family and names the resource after the policy.
type HeaderOptions struct {
	// Resource replaces the policy's name in X-RateLimit-Resource and in the
	// names of the RateLimit-Policy and RateLimit list members.
	Resource string
	// OmitGitHub leaves out X-RateLimit-Limit, -Remaining, -Used, -Reset and
	// -Resource.
	OmitGitHub bool
	// OmitRateLimitPolicy leaves out the IETF RateLimit-Policy field.
	OmitRateLimitPolicy bool
	// OmitRateLimit leaves out the IETF RateLimit field.
	OmitRateLimit bool
	// OmitRetryAfter leaves out Retry-After.
	OmitRetryAfter bool
	// OmitDegraded leaves out X-RateLimit-Degraded.
	OmitDegraded bool
}

// WriteHeaders sets the rate-limit response headers that describe r on h,
// replacing any values h holds for them. r.At, the moment of the decision,
// is taken as the moment of the response; only the IETF RateLimit field's
// reset parameter depends on it. p
// must be the policy r was decided under; it supplies the list members of
// RateLimit-Policy and the GCRA rate. With a nil p, RateLimit-Policy is
// left out.
//
// What each header carries:
//
//   - X-RateLimit-Limit and -Resource: the binding limit's quota and the
//     resource name.
//   - X-RateLimit-Remaining and -Used: the binding limit's remaining and
//     spent units. On any denial, even one of a cost larger than what
//     remains, Remaining is 0 and Used is the limit, so that a denial never
//     claims quota and the two still add up to the limit.
//   - X-RateLimit-Reset: r.ResetAt in Unix seconds, rounded up. It depends
//     on the stored window end only, so every response of one fixed window
//     carries the same value.
//   - RateLimit-Policy: one member per limit of p, in p's order, as
//     "<name>";q=<quota>;w=<window seconds, rounded up>. A GCRA limit
//     whose burst differs from Max is written as its burst over the time
//     that burst takes to refill, which states both its capacity and its
//     sustained rate.
//   - RateLimit: the binding limit alone, "<name>";r=<remaining>;t=<s>
//     where t is, rounded up, the time until the request could be allowed
//     when denied and the time until r.ResetAt when allowed. A request
//     that can never be allowed gets no t.
//   - Retry-After: r.RetryAfter in seconds, rounded up, on a denial; never
//     on an allowed or never-allowed request, so that it always equals the
//     RateLimit t of the same response.
//   - X-RateLimit-Degraded: "1" when r (or any subject of an AllowAll
//     result) is degraded.
//
// A degraded result's counts were invented by its failure mode, not read
// from the store: for it, the headers that describe stored state
// (X-RateLimit-Remaining, -Used, -Reset and RateLimit) are left out, and
// those that describe the policy are kept.
//
// A list member is named after the resource when the policy has one limit,
// and "<resource>:<limit name>" otherwise. Names are Structured Field
// strings: printable ASCII, with '"' and '\' escaped and any other byte
// written as %XX.
func WriteHeaders(h http.Header, r throttler.Result, p *throttler.Policy, opts HeaderOptions) {
	now := r.At
	if r.NumLimits() == 0 {
		return
	}
	resource := opts.Resource
	if resource == "" {
		resource = r.Policy
	}
	denied := !r.Allowed
	stateKnown := !r.Degraded

	if !opts.OmitGitHub {
		h.Set(HeaderLimit, strconv.FormatInt(r.Limit, 10))
		h.Set(HeaderResource, headerSafe(resource))
		if stateKnown {
			remaining, used := max(r.Remaining, 0), max(r.Used, 0)
			if denied {
				// A denial never claims quota, and the two counts still
				// add up to the limit, as GitHub's clients expect.
				remaining, used = 0, r.Limit
			}
			h.Set(HeaderRemaining, strconv.FormatInt(remaining, 10))
			h.Set(HeaderUsed, strconv.FormatInt(used, 10))
			h.Set(HeaderReset, strconv.FormatInt(ceilUnix(r.ResetAt), 10))
		} else {
			h.Del(HeaderRemaining)
			h.Del(HeaderUsed)
			h.Del(HeaderReset)
		}
	}
	if !opts.OmitRateLimitPolicy && p != nil {
		h.Set(HeaderRateLimitPolicy, rateLimitPolicyValue(p, opts.Resource))
	}
	if !opts.OmitRateLimit {
		if stateKnown {
			h.Set(HeaderRateLimit, rateLimitValue(r, now, opts.Resource))
		} else {
			h.Del(HeaderRateLimit)
		}
	}
	if !opts.OmitRetryAfter {
		if secs, ok := retryAfterSeconds(r); ok {
			h.Set(HeaderRetryAfter, strconv.FormatInt(secs, 10))
		} else {
			h.Del(HeaderRetryAfter)
		}
	}
	if !opts.OmitDegraded {
		if anyDegraded(r) {
			h.Set(HeaderDegraded, "1")
		} else {
			h.Del(HeaderDegraded)
		}
	}
}

// retryAfterSeconds returns the Retry-After value of r: r.RetryAfter in
// whole seconds, rounded up, and true for a denial that can succeed later;
// 0 and false for an allowed request or one that can never be allowed.
func retryAfterSeconds(r throttler.Result) (int64, bool) {
	if r.Allowed || r.NeverAllowed || r.RetryAfter == throttler.Never {
		return 0, false
	}
	return max(ceilSeconds(r.RetryAfter), 1), true
}

// rateLimitValue returns the IETF RateLimit field value for r: one list
// member for the binding limit, "<name>";r=<remaining>;t=<seconds>, as
// WriteHeaders describes. resource replaces the policy's name when not
// empty. It returns "" for a Result without limits.
func rateLimitValue(r throttler.Result, now time.Time, resource string) string {
	if r.NumLimits() == 0 {
		return ""
	}
	if resource == "" {
		resource = r.Policy
	}
	remaining := max(r.Remaining, 0)
	if !r.Allowed {
		remaining = 0
	}
	var b strings.Builder
	appendSFString(&b, memberName(resource, r.NumLimits(), r.Binding))
	b.WriteString(";r=")
	b.WriteString(strconv.FormatInt(min(remaining, maxSFInteger), 10))
	var reset int64
	switch {
	case r.NeverAllowed || r.RetryAfter == throttler.Never:
		return b.String()
	case r.Allowed:
		reset = ceilSeconds(r.ResetAt.Sub(now))
	default:
		// The same figure as Retry-After: a client that honours either
		// waits as long.
		reset, _ = retryAfterSeconds(r)
	}
	b.WriteString(";t=")
	b.WriteString(strconv.FormatInt(min(max(reset, 0), maxSFInteger), 10))
	return b.String()
}

// policyValues caches rateLimitPolicyValue per (policy, resource): a
// policy never changes once built, and its field value is the same on every
// response, so building it once spares each response a copy of the
// policy's limits and the string. It holds at most maxPolicyValues
// entries; past that, values are built per response (a program that makes
// policies per request must not grow the cache without bound).
var policyValues struct {
	m sync.Map // policyValueKey -> string
	n atomic.Int64
}

// maxPolicyValues bounds policyValues.
const maxPolicyValues = 4096

type policyValueKey struct {
	p        *throttler.Policy
	resource string
}

// rateLimitPolicyValue returns the IETF RateLimit-Policy field value for p:
// one list member per limit, "<name>";q=<quota>;w=<window seconds>, as
// WriteHeaders describes. resource replaces the policy's name when not
// empty. It returns "" for a nil or zero policy.
func rateLimitPolicyValue(p *throttler.Policy, resource string) string {
	key := policyValueKey{p, resource}
	if v, ok := policyValues.m.Load(key); ok {
		return v.(string)
	}
	v := buildRateLimitPolicyValue(p, resource)
	if v != "" && policyValues.n.Load() < maxPolicyValues {
		if _, loaded := policyValues.m.LoadOrStore(key, v); !loaded {
			policyValues.n.Add(1)
		}
	}
	return v
}

// buildRateLimitPolicyValue is rateLimitPolicyValue without the cache.
func buildRateLimitPolicyValue(p *throttler.Policy, resource string) string {
	limits := p.Limits()
	if len(limits) == 0 {
		return ""
	}
	if resource == "" {
		resource = p.Name()
	}
	var b strings.Builder
	for i, l := range limits {
		if i > 0 {
			b.WriteString(", ")
		}
		quota, window := l.Max, l.Window
		if l.Algorithm == throttler.GCRA && l.Burst != 0 && l.Burst != l.Max {
			// Burst units over the time they take to refill: the
			// capacity and, as their ratio, the sustained rate. The
			// emission interval is the throttler's: ceil(Window/Max) µs.
			emission := (int64(l.Window/time.Microsecond) + l.Max - 1) / l.Max
			quota = l.Burst
			window = time.Duration(quota*emission) * time.Microsecond
		}
		appendSFString(&b, memberName(resource, len(limits), l.Name))
		b.WriteString(";q=")
		b.WriteString(strconv.FormatInt(min(quota, maxSFInteger), 10))
		b.WriteString(";w=")
		// The draft's window is whole seconds and at least one: rounding a
		// window up states a rate no higher than the real one.
		b.WriteString(strconv.FormatInt(min(max(ceilSeconds(window), 1), maxSFInteger), 10))
	}
	return b.String()
}

// violatedPolicies returns the RateLimit-Policy member names of the limits
// that denied r, in the policy's order: the draft's "violated-policies"
// problem member. It returns nil for an allowed result and for one denied
// by a failure mode, which checked no limit. resource replaces the policy's
// name when not empty.
func violatedPolicies(r throttler.Result, resource string) []string {
	if r.Allowed || r.Degraded && !r.NeverAllowed {
		return nil
	}
	if resource == "" {
		resource = r.Policy
	}
	var names []string
	for i, n := 0, r.NumLimits(); i < n; i++ {
		if l := r.LimitAt(i); !l.Allowed {
			names = append(names, memberName(resource, n, l.Name))
		}
	}
	return names
}

// ceilSeconds returns d in whole seconds, rounded up; 0 for d <= 0.
func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	secs := int64(d / time.Second)
	if d%time.Second != 0 {
		secs++
	}
	return secs
}

// ceilUnix returns t as Unix seconds, rounded up, so that a client that
// waits until then never comes back before t.
func ceilUnix(t time.Time) int64 {
	secs := t.Unix()
	if t.Nanosecond() != 0 {
		secs++
	}
	return secs
}

// memberName names the RateLimit-Policy and RateLimit list member of one
// limit.
func memberName(resource string, limits int, limit string) string {
	if limits == 1 {
		return resource
	}
	return resource + ":" + limit
}

func anyDegraded(r throttler.Result) bool {
	if r.Degraded {
		return true
	}
	for _, s := range r.Subjects {
		if s.Degraded {
			return true
		}
	}
	return false
}

// appendSFString writes s as a Structured Field String (RFC 9651): quoted,
// with '"' and '\' escaped. Bytes a String cannot hold (controls, DEL and
// non-ASCII) become %XX, so that no name can break the field's syntax.
func appendSFString(b *strings.Builder, s string) {
	const hex = "0123456789ABCDEF"
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e:
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
}

// headerSafe returns s with every byte that may not appear in a header
// value (controls other than tab, DEL and non-ASCII) written as %XX.
func headerSafe(s string) string {
	clean := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 0x20 && c != '\t') || c > 0x7e {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < 0x20 && c != '\t') || c > 0x7e {
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}
