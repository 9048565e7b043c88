package memcachedbackend

import (
	"math"
	"time"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// memcached reads an expiration of at most relativeExpiryMax seconds as
// relative to now and anything larger as an absolute Unix time.
const relativeExpiryMax = 30 * 24 * 60 * 60

// absoluteExpirySlack is added to absolute expirations: they are computed
// from this host's wall clock and compared with the server's, which may
// differ. A day of extra life for an item that lives over 30 days is
// negligible garbage; losing live state to clock skew is not.
const absoluteExpirySlack = 24 * 60 * 60

// grace keeps every item this many seconds after its state stops
// mattering, so that two throttlers whose clocks differ by up to 30 s share
// every window and GCRA state exactly (docs/SPEC.md, Time 2). It counts
// seconds, as memcached's expirations do.
const grace = driver.DefaultExpiryGrace / time.Second

// clockMargin is added to every expiration on top of the grace. memcached counts relative expiry on a clock of its own that ticks
// once a second from a timer: an item set just before a tick is stamped up
// to a second early, and a timer that fires late on a loaded host stamps it
// later still. Without this margin an item could vanish before its window
// ends, and the next request would open a new window: a wobbling reset time
// with no error to show for it. The margin only delays garbage collection;
// closed windows are recognised by their stored end, never by expiry.
const clockMargin = 3

// expiration returns the memcached expiration for state that stops
// mattering after live (measured in request time, from the request's now):
// rounded up to whole seconds, plus the grace, clockMargin and extra
// seconds. It is garbage collection only and never decides anything.
//
// Up to 30 days it is relative. Beyond, memcached wants an absolute Unix
// time, which this function takes from wall(): the host's clock, never the
// request's, because the server expires items in real time. An absolute
// time that does not fit memcached's 32-bit field yields 0 (never expires;
// the item then goes only when evicted).
func expiration(live time.Duration, extra int64, wall func() time.Time) int32 {
	secs := int64(grace) + clockMargin + extra
	if live > 0 {
		secs += int64((live + time.Second - 1) / time.Second)
	}
	if secs <= relativeExpiryMax {
		return int32(secs)
	}
	abs := wall().Unix() + secs + absoluteExpirySlack
	if abs > math.MaxInt32 || abs <= relativeExpiryMax {
		return 0
	}
	return int32(abs)
}
