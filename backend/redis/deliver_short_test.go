package redisbackend

import (
	"errors"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// A batch reply shorter than its decisions, ending on a decision's
// boundary, must fail every decision with ErrUnexpectedReply, not panic.
func TestDeliverFailsAShortReplyWithoutPanic(t *testing.T) {
	l, err := driver.NewLimit("a", driver.FixedWindow, 10, time.Second, 0)
	if err != nil {
		t.Fatal(err)
	}
	p, err := driver.NewPolicy("p", l)
	if err != nil {
		t.Fatal(err)
	}
	for _, reply := range [][]any{
		{},                                // nothing for two decisions
		{int64(1), int64(1), int64(1000)}, // one decision's worth for two
	} {
		calls := []*pending{
			{policy: p, done: make(chan struct{}, 1)},
			{policy: p, done: make(chan struct{}, 1)},
		}
		m := manyCall{calls: calls}
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("reply %v: deliver panicked: %v", reply, r)
				}
			}()
			m.deliver(reply, nil)
		}()
		for i, c := range calls {
			if !errors.Is(c.err, ErrUnexpectedReply) {
				t.Errorf("reply %v: decision %d: err %v, want ErrUnexpectedReply", reply, i, c.err)
			}
		}
	}
}
