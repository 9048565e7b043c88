// Package observe holds what the throttler's observers share: the names of
// a decision's outcome and of a backend error's kind, so that the
// Prometheus collector (observe/prometheus), the OpenTelemetry observer
// (observe/otel), the slog observer (observe/slog) and the debug page
// (observe/debug) count the same things under the same names.
//
// The subpackages are separate so that a program pays only for the
// telemetry it uses: importing throttler pulls in neither client_golang nor
// OpenTelemetry.
package observe
