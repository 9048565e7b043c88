package throttler

import "fmt"

// MaxIdentifierLen is the longest identifier, in bytes.
const MaxIdentifierLen = 1024

// ValidateIdentifier reports whether id is 1 to MaxIdentifierLen bytes. Any
// bytes are allowed. The error wraps ErrInvalidIdentifier.
func ValidateIdentifier(id string) error {
	if len(id) == 0 || len(id) > MaxIdentifierLen {
		return fmt.Errorf("%w: length %d, want 1 to %d bytes", ErrInvalidIdentifier, len(id), MaxIdentifierLen)
	}
	return nil
}

// EscapeKey encodes s so that it holds only ASCII letters, digits, '-', '.'
// and '_': every other byte becomes '%' and two upper-case hex digits. The
// encoding is injective, so distinct inputs never share an escaped form, and
// its output contains no space, control byte, brace or colon, so backends
// may join escaped parts with ':' and wrap them in a Redis hash tag.
func EscapeKey(s string) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if !keySafe(s[i]) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	const hex = "0123456789ABCDEF"
	out := make([]byte, 0, len(s)+2*n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if keySafe(c) {
			out = append(out, c)
			continue
		}
		out = append(out, '%', hex[c>>4], hex[c&15])
	}
	return string(out)
}

func keySafe(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_'
}
