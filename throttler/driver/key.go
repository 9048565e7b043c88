package driver

// EscapeKey encodes s so that it holds only ASCII letters, digits, '-', '.'
// and '_': every other byte becomes '%' and two upper-case hex digits. The
// encoding is injective, so distinct inputs never share an escaped form, and
// its output holds no space, control byte, brace or colon, so a backend may
// join escaped parts with ':' and wrap one in a Redis hash tag. It never
// produces '#', '/' or any byte outside that set, which leaves them to a
// backend's own markers (memcached marks a hashed part with '#').
//
// The output is at most 3 × len(s) bytes: a MaxIdentifierLen identifier
// of unsafe bytes escapes to 3,072. A store with a key or index-entry limit
// below what it must hold (memcached's 250 bytes, a PostgreSQL B-tree entry
// of about 2.7 kB) replaces a part longer than a bound of its choosing by a
// marker and a cryptographic hash of the raw part (SHA-256), or stores the
// raw bytes in a binary column instead of escaping them; it never
// truncates. Short parts stay readable either way.
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
	return string(AppendEscapedKey(make([]byte, 0, len(s)+2*n), s))
}

// AppendEscapedKey appends EscapeKey(s) to dst and returns the extended
// slice; backends that build keys in a reused buffer use it to avoid an
// allocation per key.
func AppendEscapedKey(dst []byte, s string) []byte {
	const hex = "0123456789ABCDEF"
	for i := 0; i < len(s); i++ {
		c := s[i]
		if keySafe(c) {
			dst = append(dst, c)
			continue
		}
		dst = append(dst, '%', hex[c>>4], hex[c&15])
	}
	return dst
}

func keySafe(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_'
}
