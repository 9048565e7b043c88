// Package redislayout2 writes Redis state the way package redisbackend did
// before layout 3: one string per limit, "used:end" ("used:end:prev" for a
// sliding window), under <prefix>{<escaped identifier>}:<policy key>:<limit
// key>. Its decide script is that release's decide.lua and common.lua,
// kept here unchanged, so that tests can build a store as a deployment of
// that release left it, with windows open, and upgrade it to layout 3 while
// clients keep calling. It is for tests only.
package redislayout2
