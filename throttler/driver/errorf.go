package driver

import (
	"fmt"
	"strings"
)

// ErrorPrefix starts every error message of the module, once.
const ErrorPrefix = "throttlekit: "

// Errorf is fmt.Errorf for the module's own messages, so that a message
// says ErrorPrefix once however many layers wrap it. An error argument
// whose text starts with ErrorPrefix (a sentinel, or an error another
// package of the module returned) is written without it, except when format
// begins with that argument ("%w: ..."): then it is the message's own
// prefix. A message that took the prefix off an argument and does not start
// with it gets it in front, so that "policy %q: %w" still reads as the
// module's. Wrapping is unchanged: errors.Is and errors.As see every %w
// argument, as they do through fmt.Errorf.
//
// Without it, a rollout over a memcached backend behind the throttler said
// "throttlekit: backend failure: throttlekit: rollout: new backend:
// throttlekit: memcached: get: ...": three prefixes for one failure.
//
// A whole message starts with the prefix and the package's name
// ("throttlekit: redis: ...") or with a sentinel ("%w: redis: ...").
func Errorf(format string, args ...any) error {
	copied := false
	for i, a := range args {
		if i == 0 && strings.HasPrefix(format, "%w") {
			continue
		}
		if err, ok := a.(error); ok && err != nil && strings.HasPrefix(err.Error(), ErrorPrefix) {
			if !copied {
				args, copied = append([]any(nil), args...), true
			}
			args[i] = &unprefixed{err}
		}
	}
	err := fmt.Errorf(format, args...)
	if copied && !strings.HasPrefix(err.Error(), ErrorPrefix) {
		return &prefixed{msg: ErrorPrefix + err.Error(), err: err}
	}
	return err
}

// unprefixed is an error said without its leading ErrorPrefix.
type unprefixed struct{ err error }

func (u *unprefixed) Error() string { return strings.TrimPrefix(u.err.Error(), ErrorPrefix) }
func (u *unprefixed) Unwrap() error { return u.err }

// prefixed is an Errorf message that gained ErrorPrefix in front, over the
// fmt.Errorf error that errors.Is and errors.As walk.
type prefixed struct {
	msg string
	err error
}

func (p *prefixed) Error() string { return p.msg }
func (p *prefixed) Unwrap() error { return p.err }
