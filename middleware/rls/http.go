package rls

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

// JSONHandler serves envoy ratelimit's /json endpoint: a POST whose body is
// a RateLimitRequest in the proto3 JSON mapping, answered with the
// RateLimitResponse in the same mapping, HTTP 200 when the overall code is
// OK and 429 when it is OVER_LIMIT. A body that is not such a request, or a
// request the service refuses, gets 400 with the reason as plain text; a
// store failure under FailError gets 503; a body over Bounds.RequestBytes
// gets 413. The headers the response asks Envoy to add are also set on the
// HTTP response.
func (s *Server) JSONHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "throttlekit/rls: /json takes POST", http.StatusMethodNotAllowed)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(s.o.bounds.RequestBytes)))
		if err != nil {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				http.Error(w, fmt.Sprintf("throttlekit/rls: request body over %d bytes", s.o.bounds.RequestBytes), http.StatusRequestEntityTooLarge)
				return
			}
			http.Error(w, "throttlekit/rls: reading the request: "+err.Error(), http.StatusBadRequest)
			return
		}
		var req rlsv3.RateLimitRequest
		if err := protojson.Unmarshal(body, &req); err != nil {
			if s.metrics != nil {
				s.metrics.requestError(ErrInvalidRequest)
			}
			http.Error(w, fmt.Sprintf("%v: malformed JSON: %v", ErrInvalidRequest, err), http.StatusBadRequest)
			return
		}
		resp, err := s.decide(r.Context(), &req)
		if err != nil {
			if s.metrics != nil {
				s.metrics.requestError(err)
			}
			code := http.StatusInternalServerError
			switch {
			case errors.Is(err, ErrInvalidRequest), errors.Is(err, ErrUnknownDomain):
				code = http.StatusBadRequest
			case errors.Is(err, ErrStoreUnavailable), errors.Is(err, ErrNoConfig):
				code = http.StatusServiceUnavailable
			case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
				code = http.StatusServiceUnavailable
			}
			http.Error(w, err.Error(), code)
			return
		}
		out, err := protojson.Marshal(resp)
		if err != nil {
			http.Error(w, "throttlekit/rls: encoding the response: "+err.Error(), http.StatusInternalServerError)
			return
		}
		for _, h := range resp.ResponseHeadersToAdd {
			w.Header().Set(h.Key, h.Value)
		}
		w.Header().Set("Content-Type", "application/json")
		if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
			w.WriteHeader(http.StatusTooManyRequests)
		}
		_, _ = w.Write(out)
	})
}

// Health reports whether the service can decide: a configuration is loaded,
// the service is not draining, and the store answers a ping (a store whose
// circuit breaker is open fails at once).
type Health struct {
	s        *Server
	timeout  time.Duration
	draining atomic.Bool
}

// NewHealth returns the health of s; each check pings the store within
// timeout (one second when 0).
func (s *Server) NewHealth(timeout time.Duration) *Health {
	if timeout <= 0 {
		timeout = time.Second
	}
	return &Health{s: s, timeout: timeout}
}

// Drain marks the service as going away: every later check fails, so that
// load balancers stop sending requests before the servers stop.
func (h *Health) Drain() { h.draining.Store(true) }

// Check returns nil when the service is healthy, or why it is not.
func (h *Health) Check(ctx context.Context) error {
	if h.draining.Load() {
		return errors.New("throttlekit/rls: draining")
	}
	if h.s.state.Load() == nil {
		return ErrNoConfig
	}
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	if err := h.s.th.Ping(ctx); err != nil && !errors.Is(err, errors.ErrUnsupported) {
		return fmt.Errorf("throttlekit/rls: store: %w", err)
	}
	return nil
}

// ServeHTTP serves envoy ratelimit's /healthcheck: 200 "OK" when healthy,
// 500 with the reason otherwise.
func (h *Health) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := h.Check(r.Context()); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	_, _ = io.WriteString(w, "OK")
}
