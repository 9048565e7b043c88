// Package modgraph holds no code: its test builds, in a temporary
// directory, the module of a program that uses throttlekit's core (every
// importable package of the core module: the throttler, the backends,
// rollout, the middleware, the observers that need no SDK) and checks that
// its module graph, `go list -m all`, holds no gRPC, OpenTelemetry or
// Prometheus module, and no golang.org/x/net: Go's minimal version
// selection would apply their versions to every package of that program's
// module, imported or not. The integrations that need them
// (middleware/grpc, observe/otel, observe/prometheus) are modules of their
// own; the test also builds a consumer of observe/prometheus, to show that
// the check sees a dependency when there is one.
package modgraph
