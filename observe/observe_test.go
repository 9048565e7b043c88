package observe_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/throttlekit/throttlekit/backend/breaker"
	"github.com/throttlekit/throttlekit/observe"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

func TestOutcome(t *testing.T) {
	for want, r := range map[string]throttler.Result{
		observe.Allowed:         {Allowed: true},
		observe.Denied:          {},
		observe.Cached:          {Cached: true},
		observe.DegradedAllowed: {Degraded: true, Allowed: true},
		observe.DegradedDenied:  {Degraded: true},
		observe.LocalAllowed:    {Degraded: true, Local: true, Allowed: true},
		observe.LocalDenied:     {Degraded: true, Local: true},
	} {
		assert.Equal(t, want, observe.Outcome(&r))
		assert.Contains(t, observe.Outcomes, want)
	}
}

func TestErrorKind(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("%w: redis: %w", throttler.ErrBackend, err) }
	for want, err := range map[string]error{
		observe.KindTimeout:     wrap(context.DeadlineExceeded),
		observe.KindCanceled:    wrap(context.Canceled),
		observe.KindBreakerOpen: wrap(fmt.Errorf("%w: 10.0.0.1:6379", breaker.ErrOpen)),
		observe.KindUnreachable: wrap(&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}),
		observe.KindBadReply:    wrap(driver.ErrBadReply),
		observe.KindClosed:      wrap(driver.ErrClosed),
		observe.KindOther:       wrap(errors.New("ERR unknown command")),
	} {
		assert.Equal(t, want, observe.ErrorKind(err), "%v", err)
		assert.Contains(t, observe.ErrorKinds, want)
	}
	assert.Equal(t, observe.KindTimeout, observe.ErrorKind(os.ErrDeadlineExceeded))
	assert.Equal(t, observe.KindUnreachable, observe.ErrorKind(io.EOF))
	assert.Equal(t, "", observe.ErrorKind(nil))
}

func TestNearLimit(t *testing.T) {
	assert.True(t, observe.NearLimit(&throttler.Result{Allowed: true, Limit: 10, Remaining: 1}, 0.2))
	assert.False(t, observe.NearLimit(&throttler.Result{Allowed: true, Limit: 10, Remaining: 2}, 0.2))
	assert.False(t, observe.NearLimit(&throttler.Result{Limit: 10}, 0.2), "a denial is over the limit")
	assert.False(t, observe.NearLimit(&throttler.Result{Allowed: true, Degraded: true, Limit: 10}, 0.2))
}

// TestErrorKindAllocatesNothing: classifying runs on the request path of
// every failed call.
func TestErrorKindAllocatesNothing(t *testing.T) {
	errs := []error{
		fmt.Errorf("%w: %w", throttler.ErrBackend, &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}),
		fmt.Errorf("%w: %w", throttler.ErrBackend, context.DeadlineExceeded),
		fmt.Errorf("%w: %w", throttler.ErrBackend, errors.New("ERR something")),
	}
	for _, err := range errs {
		if n := testing.AllocsPerRun(100, func() { _ = observe.ErrorKind(err) }); n != 0 {
			t.Errorf("ErrorKind(%v): %v allocations", err, n)
		}
	}
}
