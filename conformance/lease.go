package conformance

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// SPEC "Concurrency limits": a lease per request in flight, at most Max
// per identifier and limit, released by Release or by its expiry, renewed
// by Renew. Every subtest but LeaseInvalidInput skips when the backend
// does not implement driver.Leaser, a declared limitation (memcached), or
// when it is a decorator that answers errors.ErrUnsupported because the
// backend it wraps does not.

// leaseTTL is the lease lifetime of the lease timelines.
const leaseTTL = 10 * time.Second

// requireLeaser skips the subtest when the backend has no concurrency
// leases, as SPEC makes them optional.
func (e *env) requireLeaser() {
	e.t.Helper()
	if _, ok := e.main.backend.(driver.Leaser); !ok {
		e.t.Skip("backend does not implement driver.Leaser, a declared limitation")
	}
}

func mustConcurrency(t *testing.T, name string, max int64, ttl time.Duration) *throttler.ConcurrencyLimit {
	t.Helper()
	l, err := throttler.NewConcurrencyLimit(name, max, ttl)
	if err != nil {
		t.Fatalf("NewConcurrencyLimit(%q, %d, %v): %v", name, max, ttl, err)
	}
	return l
}

// acquire takes a lease and checks it against SPEC's rules for every
// lease, then against the expected verdict, InFlight and RetryAfter. A
// backend that answers errors.ErrUnsupported skips the subtest.
func (in *instance) acquire(t *testing.T, label string, l *throttler.ConcurrencyLimit, id string,
	acquired bool, inFlight int64, retryAfter time.Duration) *throttler.Lease {
	t.Helper()
	lease, err := in.thr.Acquire(in.env.ctx, l, id)
	if errors.Is(err, errors.ErrUnsupported) {
		t.Skipf("backend declares concurrency leases unsupported: %v", err)
	}
	if err != nil {
		t.Fatalf("%s: Acquire(%q, %s): unexpected error: %v", label, l.Name(), printable(id), err)
	}
	checkLease(t, label, l, id, in.clock.Now(), lease)
	var diffs []string
	if lease.Acquired != acquired {
		diffs = append(diffs, fmt.Sprintf("Acquired = %v, want %v", lease.Acquired, acquired))
	}
	if lease.InFlight != inFlight {
		diffs = append(diffs, fmt.Sprintf("InFlight = %d, want %d", lease.InFlight, inFlight))
	}
	if lease.RetryAfter != retryAfter {
		diffs = append(diffs, fmt.Sprintf("RetryAfter = %v, want %v", lease.RetryAfter, retryAfter))
	}
	if len(diffs) > 0 {
		t.Errorf("%s: %s", label, strings.Join(diffs, "; "))
	}
	return lease
}

// checkLease checks what SPEC says of every lease: it names its limit and
// identifier, carries a fresh ID and its clock reading, is not degraded,
// and its figures match its verdict.
func checkLease(t *testing.T, label string, l *throttler.ConcurrencyLimit, id string, now time.Time, lease *throttler.Lease) {
	t.Helper()
	var diffs []string
	if lease == nil {
		t.Fatalf("%s: Acquire returned a nil lease and no error", label)
	}
	if lease.Degraded {
		t.Fatalf("%s: degraded lease: %v", label, lease.Err)
	}
	if lease.Name != l.Name() || lease.Identifier != id {
		diffs = append(diffs, fmt.Sprintf("names (%q, %s), want (%q, %s)", lease.Name, printable(lease.Identifier), l.Name(), printable(id)))
	}
	if len(lease.ID) != 32 || strings.Trim(lease.ID, "0123456789abcdef") != "" {
		diffs = append(diffs, fmt.Sprintf("ID %q, want 32 hex digits", lease.ID))
	}
	if lease.Limit != l.Max() {
		diffs = append(diffs, fmt.Sprintf("Limit = %d, want Max %d", lease.Limit, l.Max()))
	}
	if !lease.At.Equal(now) {
		diffs = append(diffs, fmt.Sprintf("At = %v, want the clock's %v", lease.At, now))
	}
	if lease.Acquired {
		if want := time.UnixMilli(now.UnixMilli()).Add(l.LeaseTTL()); !lease.ExpiresAt.Equal(want) {
			diffs = append(diffs, fmt.Sprintf("ExpiresAt = T0%+v, want T0%+v (now + TTL)", lease.ExpiresAt.Sub(T0), want.Sub(T0)))
		}
		if lease.RetryAfter != 0 || lease.InFlight < 1 || lease.InFlight > l.Max() {
			diffs = append(diffs, fmt.Sprintf("acquired with RetryAfter %v, InFlight %d of %d", lease.RetryAfter, lease.InFlight, l.Max()))
		}
	} else {
		if !lease.ExpiresAt.IsZero() {
			diffs = append(diffs, fmt.Sprintf("refused with ExpiresAt %v, want zero", lease.ExpiresAt))
		}
		if lease.RetryAfter <= 0 || lease.RetryAfter > l.LeaseTTL() || lease.InFlight < l.Max() {
			diffs = append(diffs, fmt.Sprintf("refused with RetryAfter %v (want 0 < it <= TTL), InFlight %d of %d", lease.RetryAfter, lease.InFlight, l.Max()))
		}
	}
	if len(diffs) > 0 {
		t.Errorf("%s: %s", label, strings.Join(diffs, "; "))
	}
}

// release releases a lease, failing the subtest on error.
func release(t *testing.T, e *env, label string, lease *throttler.Lease) {
	t.Helper()
	if err := lease.Release(e.ctx); err != nil {
		t.Fatalf("%s: Release: %v", label, err)
	}
}

// renew renews a lease and checks whether it is held after.
func renew(t *testing.T, e *env, label string, lease *throttler.Lease, held bool) {
	t.Helper()
	got, err := lease.Renew(e.ctx)
	if err != nil {
		t.Fatalf("%s: Renew: %v", label, err)
	}
	if got != held {
		t.Errorf("%s: Renew = %v, want %v", label, got, held)
	}
}

// testLeaseAcquireUpToMax: Max leases are acquired, InFlight counting
// them; the next is refused with RetryAfter until the earliest expiry; other
// identifiers are not affected.
func testLeaseAcquireUpToMax(t *testing.T, e *env) {
	e.requireLeaser()
	l := mustConcurrency(t, "conc", 3, leaseTTL)
	e.at(0)
	for i := int64(1); i <= 3; i++ {
		e.main.acquire(t, fmt.Sprintf("t0 lease %d", i), l, "user", true, i, 0)
	}
	e.main.acquire(t, "t0 lease 4", l, "user", false, 3, leaseTTL)
	e.at(4 * sec)
	e.main.acquire(t, "T0+4s lease 5", l, "user", false, 3, 6*sec)
	e.main.acquire(t, "T0+4s another identifier", l, "other", true, 1, 0)
	e.at(leaseTTL - ms)
	e.main.acquire(t, "T0+9.999s lease 6", l, "user", false, 3, ms)
}

// testLeaseReleaseFreesSlot: a release frees one slot at once; a second
// release of the same lease, and the release of a refused lease, free
// nothing.
func testLeaseReleaseFreesSlot(t *testing.T, e *env) {
	e.requireLeaser()
	l := mustConcurrency(t, "conc", 2, leaseTTL)
	e.at(0)
	a := e.main.acquire(t, "a", l, "user", true, 1, 0)
	b := e.main.acquire(t, "b", l, "user", true, 2, 0)
	c := e.main.acquire(t, "c", l, "user", false, 2, leaseTTL)
	e.at(sec)
	release(t, e, "a", a)
	d := e.main.acquire(t, "d after a's release", l, "user", true, 2, 0)
	release(t, e, "a again", a)
	release(t, e, "refused c", c)
	e.main.acquire(t, "e after a second release of a", l, "user", false, 2, leaseTTL-sec)
	release(t, e, "b", b)
	release(t, e, "d", d)
	e.main.acquire(t, "f after every release", l, "user", true, 1, 0)
}

// testLeaseExpiresAfterTTL: a lease nobody releases stops counting at its
// expiry (expiry <= now); releasing it afterwards frees nobody else's slot.
func testLeaseExpiresAfterTTL(t *testing.T, e *env) {
	e.requireLeaser()
	l := mustConcurrency(t, "conc", 1, leaseTTL)
	e.at(0)
	a := e.main.acquire(t, "a at T0", l, "user", true, 1, 0)
	e.at(leaseTTL - ms)
	e.main.acquire(t, "T0+9.999s", l, "user", false, 1, ms)
	e.at(leaseTTL)
	e.main.acquire(t, "T0+10s, a expired", l, "user", true, 1, 0)
	e.at(leaseTTL + 500*ms)
	release(t, e, "a, expired", a)
	e.main.acquire(t, "T0+10.5s after a's late release", l, "user", false, 1, leaseTTL-500*ms)
}

// testLeaseExpiredDoNotCount: expired leases are dropped from the count;
// RetryAfter follows the earliest unexpired lease.
func testLeaseExpiredDoNotCount(t *testing.T, e *env) {
	e.requireLeaser()
	l := mustConcurrency(t, "conc", 2, leaseTTL)
	e.at(0)
	e.main.acquire(t, "a at T0", l, "user", true, 1, 0)
	e.at(5 * sec)
	e.main.acquire(t, "b at T0+5s", l, "user", true, 2, 0)
	e.main.acquire(t, "T0+5s", l, "user", false, 2, 5*sec)
	e.at(leaseTTL)
	e.main.acquire(t, "c at T0+10s, a expired", l, "user", true, 2, 0)
	e.main.acquire(t, "T0+10s", l, "user", false, 2, 5*sec)
	e.at(15 * sec)
	e.main.acquire(t, "d at T0+15s, b expired", l, "user", true, 2, 0)
	e.at(hour)
	e.main.acquire(t, "T0+1h, all expired", l, "user", true, 1, 0)
}

// testLeaseRenew: Renew extends a held lease to now + TTL without counting
// it twice, takes an expired lease again when a slot is free, reports false
// when none is, never shortens an expiry when the clock steps back, and
// does nothing for a released or refused lease.
func testLeaseRenew(t *testing.T, e *env) {
	e.requireLeaser()
	l := mustConcurrency(t, "conc", 2, leaseTTL)
	e.at(0)
	a := e.main.acquire(t, "a at T0", l, "user", true, 1, 0)
	e.at(8 * sec)
	renew(t, e, "a at T0+8s", a, true)
	if want := T0.Add(18 * sec); !a.ExpiresAt.Equal(want) || a.InFlight != 1 {
		t.Errorf("renewed a: ExpiresAt T0%+v, InFlight %d; want T0+18s, 1", a.ExpiresAt.Sub(T0), a.InFlight)
	}
	e.at(9 * sec)
	b := e.main.acquire(t, "b at T0+9s (a counted once)", l, "user", true, 2, 0)
	e.main.acquire(t, "T0+9s", l, "user", false, 2, 9*sec)
	e.at(12 * sec)
	e.main.acquire(t, "T0+12s (a renewed)", l, "user", false, 2, 6*sec)
	e.at(18 * sec)
	d := e.main.acquire(t, "d at T0+18s, a expired", l, "user", true, 2, 0)
	renew(t, e, "a at T0+18s, expired, no slot", a, false)
	e.at(19 * sec)
	renew(t, e, "a at T0+19s, b expired", a, true)
	e.main.acquire(t, "T0+19s (a taken again)", l, "user", false, 2, 9*sec)
	release(t, e, "b", b)
	release(t, e, "d", d)
	renew(t, e, "d released", d, false)

	// Never shorter: a renewal at a clock that stepped back keeps the
	// later expiry.
	one := mustConcurrency(t, "conc-one", 1, leaseTTL)
	e.at(0)
	x := e.main.acquire(t, "x at T0", one, "user", true, 1, 0)
	e.at(5 * sec)
	renew(t, e, "x at T0+5s", x, true)
	e.at(sec)
	renew(t, e, "x at T0+1s (clock back)", x, true)
	if want := T0.Add(15 * sec); !x.ExpiresAt.Equal(want) {
		t.Errorf("x renewed at an earlier clock: ExpiresAt T0%+v, want T0+15s", x.ExpiresAt.Sub(T0))
	}
	e.at(15*sec - ms)
	refused := e.main.acquire(t, "T0+14.999s", one, "user", false, 1, ms)
	renew(t, e, "a refused lease", refused, false)
	e.at(15 * sec)
	e.main.acquire(t, "T0+15s, x expired", one, "user", true, 1, 0)
}

// testLeaseAcrossInstances: two throttlers over one store share the count,
// releases and expiries.
func testLeaseAcrossInstances(t *testing.T, e *env) {
	e.requireLeaser()
	l := mustConcurrency(t, "conc", 2, leaseTTL)
	other := e.newInstance(0)
	at(0, e.main, other)
	a := e.main.acquire(t, "a on instance 1", l, "user", true, 1, 0)
	other.acquire(t, "b on instance 2", l, "user", true, 2, 0)
	e.main.acquire(t, "instance 1, full", l, "user", false, 2, leaseTTL)
	other.acquire(t, "instance 2, full", l, "user", false, 2, leaseTTL)
	at(sec, e.main, other)
	release(t, e, "a on instance 1", a)
	other.acquire(t, "c on instance 2 after a's release", l, "user", true, 2, 0)
	at(leaseTTL, e.main, other)
	e.main.acquire(t, "instance 1 at T0+10s, b expired", l, "user", true, 2, 0)
}

// testLeaseReleaseUnknownHarmless: releasing a lease ID the store does not
// hold, for an identifier with or without leases, changes nothing; the
// outcome reports Held false and the leases still held.
func testLeaseReleaseUnknownHarmless(t *testing.T, e *env) {
	e.requireLeaser()
	lr := e.main.backend.(driver.Leaser)
	l := mustConcurrency(t, "conc", 1, leaseTTL)
	dl, err := driver.NewConcurrencyLimit("conc", 1, leaseTTL)
	if err != nil {
		t.Fatal(err)
	}
	e.at(0)
	req := driver.LeaseRequest{Limit: dl, Identifier: "nobody", Lease: "0123456789abcdef0123456789abcdef", Now: T0}
	out, err := lr.Release(e.ctx, req)
	if errors.Is(err, errors.ErrUnsupported) {
		t.Skipf("backend declares concurrency leases unsupported: %v", err)
	}
	if err != nil || out != (driver.LeaseOutcome{}) {
		t.Errorf("Release for an identifier without leases: %+v, %v; want the zero outcome", out, err)
	}
	e.main.acquire(t, "a", l, "user", true, 1, 0)
	req.Identifier = "user"
	out, err = lr.Release(e.ctx, req)
	if want := (driver.LeaseOutcome{InFlight: 1, NextExpiry: T0.Add(leaseTTL).UnixMilli()}); err != nil || out != want {
		t.Errorf("Release of an unknown lease: %+v, %v; want %+v", out, err, want)
	}
	e.main.acquire(t, "after the unknown release", l, "user", false, 1, leaseTTL)
}

// testLeaseOutcomeReportsHeld: the driver outcome's Held says whether the
// lease was held before the call: a renewal on Acquire, a freed slot on
// Release.
func testLeaseOutcomeReportsHeld(t *testing.T, e *env) {
	e.requireLeaser()
	lr := e.main.backend.(driver.Leaser)
	dl, err := driver.NewConcurrencyLimit("conc", 2, leaseTTL)
	if err != nil {
		t.Fatal(err)
	}
	x := driver.LeaseRequest{Limit: dl, Identifier: "user", Lease: strings.Repeat("a", 32), Now: T0}
	y := x
	y.Lease = strings.Repeat("b", 32)
	exp := func(d time.Duration) int64 { return T0.Add(d).UnixMilli() }
	for _, c := range []struct {
		label   string
		acquire bool
		req     driver.LeaseRequest
		at      time.Duration
		want    driver.LeaseOutcome
	}{
		{"acquire x", true, x, 0, driver.LeaseOutcome{Acquired: true, InFlight: 1, NextExpiry: exp(leaseTTL)}},
		{"acquire x again: a renewal", true, x, sec, driver.LeaseOutcome{Acquired: true, Held: true, InFlight: 1, NextExpiry: exp(sec + leaseTTL)}},
		{"acquire y", true, y, 2 * sec, driver.LeaseOutcome{Acquired: true, InFlight: 2, NextExpiry: exp(sec + leaseTTL)}},
		{"release x", false, x, 3 * sec, driver.LeaseOutcome{Held: true, InFlight: 1, NextExpiry: exp(2*sec + leaseTTL)}},
		{"release x again", false, x, 3 * sec, driver.LeaseOutcome{InFlight: 1, NextExpiry: exp(2*sec + leaseTTL)}},
		{"release y at its expiry", false, y, 2*sec + leaseTTL, driver.LeaseOutcome{}},
	} {
		req := c.req
		req.Now = T0.Add(c.at)
		var out driver.LeaseOutcome
		if c.acquire {
			out, err = lr.Acquire(e.ctx, req)
		} else {
			out, err = lr.Release(e.ctx, req)
		}
		if errors.Is(err, errors.ErrUnsupported) {
			t.Skipf("backend declares concurrency leases unsupported: %v", err)
		}
		if err != nil || out != c.want {
			t.Errorf("%s at T0+%v: %+v, %v; want %+v", c.label, c.at, out, err, c.want)
		}
	}
}

// testLeaseKeysIndependent: leases of distinct identifiers and distinct
// limits never share a count, whatever bytes they hold, and never touch a
// policy's counters.
func testLeaseKeysIndependent(t *testing.T, e *env) {
	e.requireLeaser()
	a := mustConcurrency(t, "conc", 10, leaseTTL)
	b := mustConcurrency(t, "conc:x", 10, leaseTTL)
	c := mustConcurrency(t, "conc%3Ax", 10, leaseTTL)
	d := mustConcurrency(t, "10/h", 10, leaseTTL)
	p := mustPolicy(t, "conc", throttler.PerHour(10).Named("10/h"))
	type pair struct {
		l  *throttler.ConcurrencyLimit
		id string
	}
	pairs := []pair{
		{a, "user:1"}, {a, "user%3A1"}, {a, "{user:1}"}, {a, "user:1}"}, {a, "\x00\xff\n "},
		{a, strings.Repeat("y", driver.MaxIdentifierLen)}, {b, "user:1"}, {c, "user:1"}, {d, "user:1"},
	}
	e.at(0)
	e.main.allow(t, "policy conc, 5 units", p, "user:1", 5)
	for i, k := range pairs {
		for n := int64(1); n <= int64(i%3+1); n++ {
			e.main.acquire(t, fmt.Sprintf("pair %d (%s, %s) lease %d", i, k.l.Name(), printable(k.id), n), k.l, k.id, true, n, 0)
		}
	}
	for i, k := range pairs {
		want := int64(i%3 + 2)
		e.main.acquire(t, fmt.Sprintf("pair %d (%s, %s) once more", i, k.l.Name(), printable(k.id)), k.l, k.id, true, want, 0)
	}
	if r := e.main.peek(t, "policy conc after the leases", p, "user:1"); r.Used != 5 {
		t.Errorf("policy conc: Used %d after leases under limits of the same names, want 5", r.Used)
	}
}

// testLeaseInvalidInput: bad limits and identifiers are errors that
// errors.Is matches, never a panic nor a lease.
func testLeaseInvalidInput(t *testing.T, e *env) {
	for _, c := range []struct {
		name string
		max  int64
		ttl  time.Duration
	}{
		{"", 1, sec}, {"c", 0, sec}, {"c", -1, sec}, {"c", driver.MaxQuota + 1, sec}, {"c", 1, 0},
		{"c", 1, -sec}, {"c", 1, 1500 * us}, {"c", 1, driver.MaxWindow + ms},
	} {
		if l, err := throttler.NewConcurrencyLimit(c.name, c.max, c.ttl); !errors.Is(err, throttler.ErrInvalidLimit) || l != nil {
			t.Errorf("NewConcurrencyLimit(%q, %d, %v) = %v, %v; want ErrInvalidLimit", c.name, c.max, c.ttl, l, err)
		}
	}
	e.at(0)
	l := mustConcurrency(t, "conc", 1, leaseTTL)
	for _, c := range []struct {
		label string
		l     *throttler.ConcurrencyLimit
		id    string
		want  error
	}{
		{"nil limit", nil, "user", throttler.ErrInvalidLimit},
		{"zero limit", &throttler.ConcurrencyLimit{}, "user", throttler.ErrInvalidLimit},
		{"empty identifier", l, "", throttler.ErrInvalidIdentifier},
		{"1025-byte identifier", l, strings.Repeat("x", driver.MaxIdentifierLen+1), throttler.ErrInvalidIdentifier},
	} {
		if lease, err := e.main.thr.Acquire(e.ctx, c.l, c.id); !errors.Is(err, c.want) || lease != nil {
			t.Errorf("%s: Acquire = %v, %v; want %v", c.label, lease, err, c.want)
		}
	}
	var zero *throttler.Lease
	if err := zero.Release(e.ctx); err != nil {
		t.Errorf("Release of a nil lease: %v, want nil", err)
	}
	if held, err := zero.Renew(e.ctx); held || err != nil {
		t.Errorf("Renew of a nil lease: %v, %v; want false, nil", held, err)
	}
}

// testConcurrentLeasesExact: at one clock reading, 32 goroutines acquiring
// without releasing get exactly Max leases, each with a distinct InFlight
// from 1 to Max.
func testConcurrentLeasesExact(t *testing.T, e *env) {
	e.requireLeaser()
	const max = 10
	l := mustConcurrency(t, "conc", max, hour)
	instances := []*instance{e.main, e.newInstance(0)}
	at(0, instances...)
	var (
		mu       sync.Mutex
		inFlight = map[int64]int{}
		refused  int
		errs     []string
		wg       sync.WaitGroup
	)
	deadline := time.Now().Add(burstTimeBound)
	start := make(chan struct{})
	for g := range burstGoroutines {
		in := instances[g%len(instances)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := 0; i < burstAttempts && time.Now().Before(deadline) && e.ctx.Err() == nil; i++ {
				lease, err := in.thr.Acquire(e.ctx, l, "hot")
				mu.Lock()
				switch {
				case err != nil:
					errs = append(errs, err.Error())
				case lease.Degraded:
					errs = append(errs, fmt.Sprintf("degraded lease: %v", lease.Err))
				case lease.Acquired:
					inFlight[lease.InFlight]++
				case lease.InFlight != max:
					errs = append(errs, fmt.Sprintf("refused with InFlight %d, want %d", lease.InFlight, max))
				default:
					refused++
				}
				mu.Unlock()
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d concurrent acquisitions failed; first: %s", len(errs), errs[0])
	}
	if n := len(inFlight) + refused; n < max {
		t.Fatalf("only %d acquisitions ran", n)
	}
	if len(inFlight) != max {
		t.Errorf("%d distinct InFlight values among acquired leases (%v), want exactly 1..%d once each", len(inFlight), inFlight, max)
	}
	for n, count := range inFlight {
		if n < 1 || n > max || count != 1 {
			t.Errorf("InFlight %d reported by %d acquired leases, want one", n, count)
		}
	}
}

// testConcurrentLeaseChurn: goroutines on two instances acquire, hold and
// release as fast as they can; the leases held at once, counted by the
// holders themselves, never exceed Max, and once all are released the
// count is back to zero.
func testConcurrentLeaseChurn(t *testing.T, e *env) {
	e.requireLeaser()
	const max = 5
	l := mustConcurrency(t, "conc", max, hour)
	instances := []*instance{e.main, e.newInstance(0)}
	at(0, instances...)
	var (
		holding, peak, acquired atomic.Int64
		mu                      sync.Mutex
		errs                    []string
		wg                      sync.WaitGroup
	)
	fail := func(s string) {
		mu.Lock()
		errs = append(errs, s)
		mu.Unlock()
	}
	deadline := time.Now().Add(burstTimeBound)
	start := make(chan struct{})
	for g := range burstGoroutines {
		in := instances[g%len(instances)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for i := 0; i < burstAttempts && time.Now().Before(deadline) && e.ctx.Err() == nil; i++ {
				lease, err := in.thr.Acquire(e.ctx, l, "hot")
				if err != nil || lease.Degraded {
					fail(fmt.Sprintf("acquire: %v %v", err, lease))
					continue
				}
				if !lease.Acquired {
					continue
				}
				acquired.Add(1)
				if lease.InFlight > max {
					fail(fmt.Sprintf("acquired with InFlight %d > %d", lease.InFlight, max))
				}
				n := holding.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				time.Sleep(10 * time.Microsecond)
				holding.Add(-1)
				if err := lease.Release(e.ctx); err != nil {
					fail(fmt.Sprintf("release: %v", err))
				}
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d lease operations failed; first: %s", len(errs), errs[0])
	}
	if peak.Load() > max {
		t.Errorf("%d leases held at once, more than Max %d", peak.Load(), max)
	}
	if acquired.Load() < max {
		t.Errorf("only %d leases acquired in the churn", acquired.Load())
	}
	e.main.acquire(t, "after the churn", l, "hot", true, 1, 0)
}
