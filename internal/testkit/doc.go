// Package testkit holds the helpers every package's tests share: a fixed
// start time, policies and throttlers that fail the test instead of
// returning errors, and the backend's view of a policy for tests that call
// a backend directly.
package testkit
