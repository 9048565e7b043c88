// Package rls (import path github.com/throttlekit/throttlekit/middleware/rls)
// is a rate limit service on Envoy's own API, so that an edge proxy, a
// gateway or a service in any language enforces the same limits, on the
// same counters, as the Go programs that import throttlekit.
//
// A Server answers envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit
// over gRPC (register it with rlsv3.RegisterRateLimitServiceServer) and
// envoy ratelimit's /json endpoint over HTTP (JSONHandler), under envoy
// ratelimit's own configuration files, loaded unchanged by package config.
// It decides with a throttler.Throttler, so it runs on every throttlekit
// store and on a rollout between two of them; package store opens one from
// a one-line spec, and command throttlekit-rls (cmd/throttlekit-rls) is the
// whole service.
//
//	cfg, err := config.LoadDir("/srv/runtime_data/current/config")
//	th, err := throttler.New(redisBackend)
//	srv, err := rls.New(th, cfg)
//	gs := grpc.NewServer()
//	rlsv3.RegisterRateLimitServiceServer(gs, srv)
//	http.Handle("/json", srv.JSONHandler())
//
// # Descriptors and counters
//
// Each descriptor of a request is matched to a rule of its domain as envoy
// ratelimit matches it. A rule is a throttlekit policy named by the rule's
// path in the configuration ("domain.key_value.key2"); the descriptor's
// counter is its identifier, envoy ratelimit's own cache key without the
// window ("domain_key_value_key2_value2"). A rule's windows are aligned on
// the clock, as envoy ratelimit's are, unless its configuration names
// another algorithm. Because the policy is keyed by the rule's path and its
// windows, never by requests_per_unit, reloading a configuration (Watch,
// SetConfig) keeps every open window of the rules it keeps, and a raised
// limit applies to the open window with its count.
//
// # Where the service differs from envoy ratelimit
//
// By default a request is decided all or nothing: when one enforced
// descriptor is over its limit, the units the others took are given back,
// and a denied hit consumes nothing, so a client that keeps calling while
// denied does not push its own reset further away or eat the next
// window's quota. WithEnvoyCompat decides as envoy ratelimit does instead.
// A store failure follows the failure mode (open by default; FailError
// answers Unavailable as envoy ratelimit does). docs/ENVOY.md has the whole
// table.
//
// # Bounds
//
// A request is checked before anything is decided: a domain and at least
// one descriptor, non-empty keys, at most Bounds.Descriptors descriptors of
// at most Bounds.Entries entries, keys and values of at most
// Bounds.ValueBytes bytes, a hits_addend of at most 2^40. A request that
// fails a check gets codes.InvalidArgument (HTTP 400) and an error wrapping
// ErrInvalidRequest; an unknown domain gets codes.NotFound.
//
// # Metrics
//
// Metrics records envoy ratelimit's statistics under its Prometheus names
// (total_hits, over_limit, near_limit, within_limit, shadow_mode per rule),
// beside the throttler's own (observe/prometheus).
package rls
