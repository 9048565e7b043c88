package conformance

import (
	"errors"
	"math"
	"testing"

	"github.com/throttlekit/throttlekit/throttler"
)

// SPEC "Errors and failure" 1: invalid input returns an error errors.Is can
// match, and no input makes the library panic. These reach the backend only
// through the throttler, which must stop them before the backend sees them.

// testNegativeCostRejected: a negative cost or refund is ErrInvalidCost and
// changes nothing.
func testNegativeCostRejected(t *testing.T, e *env) {
	p := mustPolicy(t, "costs", throttler.PerMinute(5).Named("5/min"))
	e.at(0)
	e.main.allow(t, "t0", p, "user:42", 2)
	e.at(sec)
	thr := e.main.thr
	for _, cost := range []int64{-1, -5, math.MinInt64} {
		calls := map[string]func() error{
			"AllowN": func() error { _, err := thr.AllowN(e.ctx, p, "user:42", cost); return err },
			"Refund": func() error { _, err := thr.Refund(e.ctx, p, "user:42", cost); return err },
			"AllowAll": func() error {
				_, err := thr.AllowAll(e.ctx, cost, throttler.Subject{Policy: p, Identifier: "user:42"})
				return err
			},
		}
		for name, call := range calls {
			if err := callNoPanic(call); !errors.Is(err, throttler.ErrInvalidCost) {
				t.Errorf("%s cost %d: err = %v, want ErrInvalidCost", name, cost, err)
			}
		}
	}
	e.main.timeline(t, p, "user:42", []step{{sec, peek, 0, true, 3, 2, 60 * sec, 0}})
}

// testNilPolicyRejected: a nil or zero Policy is ErrInvalidPolicy for every
// operation, never a panic; so is AllowAll without subjects.
func testNilPolicyRejected(t *testing.T, e *env) {
	expectInvalid(t, e, nil, "user:42", throttler.ErrInvalidPolicy)
	expectInvalid(t, e, &throttler.Policy{}, "user:42", throttler.ErrInvalidPolicy)
	err := callNoPanic(func() error { _, err := e.main.thr.AllowAll(e.ctx, 1); return err })
	if !errors.Is(err, throttler.ErrInvalidPolicy) {
		t.Errorf("AllowAll without subjects: err = %v, want ErrInvalidPolicy", err)
	}
}
