// Package service runs throttlekit-rls: its settings (flags, envoy
// ratelimit's environment variables, a YAML file) and its servers.
package service
