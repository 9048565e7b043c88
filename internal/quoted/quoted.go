// Package quoted splits text at separators that stand outside
// double-quoted strings, for the two notations that quote: the policy
// notation (throttler.ParsePolicy: name="per user, per second") and the
// HTTP Forwarded header (the middleware's client IP).
package quoted

// Split splits s at every byte sep accepts that stands outside a
// double-quoted string, in which a backslash escapes the byte after it.
// It reports false when a quote is left open; the last part then runs to
// the end of s.
func Split(s string, sep func(byte) bool) ([]string, bool) {
	var parts []string
	start, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case !quoted && sep(c):
			parts = append(parts, s[start:i])
			start = i + 1
		}
	}
	return append(parts, s[start:]), !quoted
}

// Byte returns a separator function that accepts b alone.
func Byte(b byte) func(byte) bool { return func(c byte) bool { return c == b } }
