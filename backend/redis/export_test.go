package redis

// ParseReply exposes parseReply to the external tests, which feed it the
// replies a proxy or an incompatible server might send.
var ParseReply = parseReply
