// Package unleashflag reads a rollout's split from an Unleash feature
// toggle, through the official Go client, so that the share of identifiers
// a rollout.Backend sends to its new backend is changed in the Unleash UI
// without a deploy.
//
// The toggle's flexibleRollout percentage is the split; disabling the
// toggle (or deleting it) is the kill switch that sends everything back to
// the old backend. A toggle the server does not send (a typo in its name)
// is the kill switch too, and is reported by Ping (ErrToggleMissing),
// logged once and counted in Status. The client polls the server in the background; each
// fetched toggle is turned into a rollout.Split once and published
// atomically, so the request path never calls into the client:
//
//	src, err := unleashflag.New("throttle-redis",
//		unleashflag.WithServer("http://unleash:4242/api", "api-gateway"),
//		unleashflag.WithWaitForFirstFetch(5*time.Second))
//	if err != nil { ... }
//	defer src.Close()
//	backend, err := rollout.New(memcachedBackend, redisBackend, src)
//
// A toggle carries more than a percentage can say (constraints, segments,
// random stickiness); such a toggle is refused with ErrUnsupportedToggle
// and the last good split stays in force. Source's documentation says
// exactly how a toggle reads as a split, how the group ID is pinned, and
// what happens while the server cannot be reached.
package unleashflag
