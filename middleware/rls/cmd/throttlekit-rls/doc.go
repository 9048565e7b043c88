// Command throttlekit-rls is a rate limit service on Envoy's own API: it
// answers envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit over
// gRPC and envoy ratelimit's /json and /healthcheck over HTTP, under envoy
// ratelimit's own configuration files, deciding with throttlekit on any of
// its stores or a rollout between two of them.
//
//	throttlekit-rls -config DIR -store redis://127.0.0.1:6379
//
// Every flag has a default from envoy ratelimit's environment variables
// where one exists (RUNTIME_ROOT, RUNTIME_SUBDIRECTORY, RUNTIME_APPDIRECTORY,
// GRPC_HOST, GRPC_PORT, HOST, PORT, DEBUG_HOST, DEBUG_PORT, REDIS_URL,
// REDIS_TYPE, REDIS_AUTH, LIMIT_RESPONSE_HEADERS_ENABLED, LIMIT_LIMIT_HEADER,
// LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER, NEAR_LIMIT_RATIO, SHADOW_MODE,
// MERGE_DOMAIN_CONFIG, GRPC_SERVER_USE_TLS,
// GRPC_SERVER_TLS_CERT, GRPC_SERVER_TLS_KEY, GRPC_CLIENT_TLS_CACERT), so
// that a deployment of envoy ratelimit starts it with its environment
// unchanged. -settings reads the same settings from a YAML file; flags
// override it. docs/ENVOY.md is the guide.
package main
