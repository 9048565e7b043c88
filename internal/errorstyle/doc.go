// Package errorstyle holds no code: its test walks errors that cross
// several packages of the module (a store's failure inside a rollout inside
// the throttler, a bad option inside a decorator, a configuration string)
// and fails when a message says "throttlekit:" more than once, or does not
// start with it. driver.Errorf is what keeps it so.
package errorstyle
