package driver

import "encoding/base32"

// EscapeKey encodes s so that it holds only ASCII letters, digits, '-', '.'
// and '_': every other byte becomes '%' and two upper-case hex digits.
//
// What it guarantees: the encoding is injective, so distinct inputs never
// share an escaped form, and a string of safe bytes escapes to itself, so
// short readable parts stay readable. Its output holds no space, control
// byte, brace, colon, '/' or '#', so a backend may join escaped parts with
// ':' (as Limit.Key does), wrap one in a Redis hash tag, and keep '#' and
// '/' for markers of its own (memcached marks a hashed part with '#').
//
// What it does not guarantee, and the stores for which it is not enough:
//   - its output holds '%', and '.' and '-' as they were, runs of '.'
//     included: "..", "a..b" and ".x" escape to themselves. NATS KV
//     rejects '%' and ':' in a key and reads '.' as a separator of tokens
//     that must not be empty; a file name must not be "." or "..";
//   - it keeps upper and lower case apart: a store that compares keys
//     without case (a column under a case-insensitive collation, a file on
//     a case-insensitive file system) would merge "A" and "a";
//   - it bounds nothing but the ratio: the output is at most 3 × len(s)
//     bytes, 3,072 for a MaxIdentifierLen identifier of unsafe bytes.
//
// For the first two, encode each part with AlnumKey instead (Policy.Name,
// Limit.Key, the identifier), and join the parts with any byte AlnumKey
// never writes. For a key or index-entry limit below what a part needs
// (memcached's 250 bytes, a PostgreSQL B-tree entry of about 2.7 kB),
// replace a part longer than a bound of your choosing by a marker and a
// cryptographic hash of the raw part (SHA-256), or store the raw bytes in a
// binary column instead of escaping them; never truncate, since two
// identifiers would then share a counter.
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

// alnum is base32 with the "extended hex" alphabet of RFC 4648, lower case.
var alnum = base32.NewEncoding("0123456789abcdefghijklmnopqrstuv").WithPadding(base32.NoPadding)

// AlnumKey encodes s with lower-case ASCII letters and digits only: the
// base32 "extended hex" alphabet of RFC 4648 (0-9 and a-v) in lower case,
// without padding. It is EscapeKey for stores whose keys accept less than
// EscapeKey writes (see there): NATS KV, file names, keys compared without
// case.
//
// The encoding is injective and its output never holds a byte outside
// [0-9a-v], so parts joined with any other byte ('.', '_', '/', ':', 'z')
// are joined injectively; a part never starts or ends with '.', and two
// outputs never differ by case alone. The empty string encodes to the empty
// string; every part the throttler sends (a policy's name, a Limit.Key, an
// identifier) has at least one byte, so its encoding has at least two.
// The output is ceil(8 × len(s) / 5) bytes: 1,639 for a MaxIdentifierLen
// identifier; "user:42" becomes "elpmashq6gp0". A store with a shorter
// bound hashes long parts, as EscapeKey says.
func AlnumKey(s string) string {
	return alnum.EncodeToString([]byte(s))
}
