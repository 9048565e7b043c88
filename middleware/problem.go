package middleware

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/throttlekit/throttlekit/throttler"
)

// Problem types of the denials the Limiter answers. The first two are the
// ones draft-ietf-httpapi-ratelimit-headers asks IANA to register; the
// third is this package's own and points at its documentation.
const (
	// TypeQuotaExceeded marks an ordinary denial: a limit's quota is spent
	// for now; Retry-After says when to come back.
	TypeQuotaExceeded = "https://iana.org/assignments/http-problem-types#quota-exceeded"
	// TypeTemporaryReducedCapacity marks a denial by a policy that fails
	// closed while the limiter's store is unreachable.
	TypeTemporaryReducedCapacity = "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity"
	// TypeCostExceedsLimit marks a request whose cost is larger than a
	// limit's whole quota: it can never be allowed, so it carries no
	// Retry-After.
	TypeCostExceedsLimit = "https://pkg.go.dev/github.com/throttlekit/throttlekit/middleware#hdr-Never_allowed"
)

// Problem is an RFC 9457 problem details object, the body of every response
// the Limiter writes itself. It never holds an identifier: those can be
// addresses or secrets.
type Problem struct {
	// Type is a URI naming the kind of problem.
	Type string `json:"type"`
	// Title is a short, fixed summary of the type.
	Title string `json:"title"`
	// Status is the HTTP status code of the response.
	Status int `json:"status"`
	// Detail explains this occurrence to a human.
	Detail string `json:"detail,omitempty"`
	// ViolatedPolicies names the RateLimit-Policy members that denied the
	// request (the draft's "violated-policies" extension member).
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
}

// WriteProblem writes p as an application/problem+json response with status
// p.Status. Headers already set on w, such as Retry-After, are kept.
func WriteProblem(w http.ResponseWriter, p Problem) {
	body, err := json.Marshal(p)
	if err != nil {
		// A Problem holds only strings and ints: this cannot happen, but
		// a response must still be sent.
		body = []byte(`{"type":"about:blank","status":500}`)
		p.Status = http.StatusInternalServerError
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(p.Status)
	_, _ = w.Write(body)
}

// ErrorHandler answers a request the throttler could not decide because of
// an error: invalid input (an identifier longer than
// driver.MaxIdentifierLen, a negative cost), a misconfigured throttler,
// or the request's own context ending. A backend failure is not such an
// error: the policy's failure mode decides those. Returning true serves the
// request unthrottled, without rate-limit headers; the handler must then
// not have written to w.
type ErrorHandler func(w http.ResponseWriter, r *http.Request, err error) (serve bool)

// DefaultErrorHandler answers with a problem+json response and never serves
// the request, so that no crafted input slips past the limiter: 400 for an
// invalid identifier or cost (the client sent it), 503 when the request's
// context ended, and 500 for anything else (a configuration mistake),
// logged to the Limiter's throttler's logger (throttler.WithLogger;
// slog.Default() when the request did not come through a Limiter). The
// error's text is never sent to the client.
func DefaultErrorHandler(w http.ResponseWriter, r *http.Request, err error) bool {
	switch {
	case errors.Is(err, throttler.ErrInvalidIdentifier) || errors.Is(err, throttler.ErrInvalidCost):
		WriteProblem(w, Problem{Type: "about:blank", Title: http.StatusText(http.StatusBadRequest),
			Status: http.StatusBadRequest,
			Detail: "The request cannot be rate limited: its identifier or cost is invalid."})
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		WriteProblem(w, Problem{Type: "about:blank", Title: http.StatusText(http.StatusServiceUnavailable),
			Status: http.StatusServiceUnavailable, Detail: "The request ended before it could be rate limited."})
	default:
		if logger := loggerFrom(r.Context()); logger != nil {
			logger.LogAttrs(r.Context(), slog.LevelError, "throttlekit: middleware: rate limiter error",
				slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Any("error", err))
		}
		WriteProblem(w, Problem{Type: "about:blank", Title: http.StatusText(http.StatusInternalServerError),
			Status: http.StatusInternalServerError, Detail: "The rate limiter could not decide this request."})
	}
	return false
}

// PassThrough is an ErrorHandler that serves every request the throttler
// could not decide, unthrottled. Use it only where an attacker gains
// nothing by sending input the throttler rejects.
func PassThrough(http.ResponseWriter, *http.Request, error) bool { return true }

// DenyHandler writes the response to a denied request. The rate-limit
// headers are already set on w; p is the problem the Limiter would send,
// its Status the configured status for this kind of denial.
type DenyHandler func(w http.ResponseWriter, r *http.Request, res throttler.Result, p Problem)

// writeDenial is the default DenyHandler.
func writeDenial(w http.ResponseWriter, _ *http.Request, _ throttler.Result, p Problem) {
	WriteProblem(w, p)
}

// loggerKey is the context key under which a Limiter hands its error
// handler the throttler's logger.
type loggerKey struct{}

// fail hands err to the Limiter's error handler, with the throttler's
// logger in the request's context for DefaultErrorHandler.
func (l *Limiter) fail(w http.ResponseWriter, r *http.Request, err error) bool {
	r = r.WithContext(context.WithValue(r.Context(), loggerKey{}, l.throttler.Logger()))
	return l.onError(w, r, err)
}

// loggerFrom returns the logger a Limiter put in ctx (nil when its
// throttler logs nowhere), or slog.Default() when none did.
func loggerFrom(ctx context.Context) *slog.Logger {
	if logger, ok := ctx.Value(loggerKey{}).(*slog.Logger); ok {
		return logger
	}
	return slog.Default()
}
