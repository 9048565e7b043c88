package redisbackend

// ParseReply exposes parseReply to the external tests, which feed it the
// replies a proxy or an incompatible server might send.
var ParseReply = parseReply

// Detached reports whether the backend enforces the caller's context itself
// for c, running each command on a goroutine of its own.
func Detached(c Client) bool { return newConn(c).detached }
