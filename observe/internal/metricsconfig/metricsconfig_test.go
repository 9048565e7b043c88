package metricsconfig

import (
	"errors"
	"math"
	"sync"
	"testing"

	"github.com/throttlekit/throttlekit/backend/breaker"
	"github.com/throttlekit/throttlekit/observe"
	"github.com/throttlekit/throttlekit/throttler"
)

// TestSetBuckets: one validation for both adapters; a refused set leaves
// the buckets as they were.
func TestSetBuckets(t *testing.T) {
	for _, tc := range []struct {
		name   string
		bounds []float64
		ok     bool
	}{
		{"one bound", []float64{1}, true},
		{"increasing", []float64{0.001, 0.01, 1}, true},
		{"negative then positive", []float64{-1, 0, 1}, true},
		{"none", nil, false},
		{"decreasing", []float64{1, 0.5}, false},
		{"repeated", []float64{1, 1}, false},
		{"NaN", []float64{0.1, math.NaN()}, false},
		{"NaN first", []float64{math.NaN(), 1}, false},
		{"+Inf", []float64{0.1, math.Inf(1)}, false},
		{"-Inf", []float64{math.Inf(-1), 0.1}, false},
	} {
		c := Defaults(DefaultBuckets())
		err := c.SetBuckets(tc.bounds)
		if tc.ok {
			if err != nil || len(c.Buckets) != len(tc.bounds) {
				t.Errorf("%s: err %v, buckets %v", tc.name, err, c.Buckets)
			}
			continue
		}
		if !errors.Is(err, throttler.ErrInvalidOption) {
			t.Errorf("%s: err %v, want ErrInvalidOption", tc.name, err)
		}
		if len(c.Buckets) != len(DefaultBuckets()) {
			t.Errorf("%s: buckets changed to %v on a refused set", tc.name, c.Buckets)
		}
	}
}

// TestSetBucketsCopies: the caller's slice can change afterwards.
func TestSetBucketsCopies(t *testing.T) {
	var c Common
	bounds := []float64{1, 2}
	if err := c.SetBuckets(bounds); err != nil {
		t.Fatal(err)
	}
	bounds[0] = 5
	if c.Buckets[0] != 1 {
		t.Fatalf("buckets follow the caller's slice: %v", c.Buckets)
	}
}

func TestSetNearLimit(t *testing.T) {
	for _, f := range []float64{0, 1, -0.5, 1.5, math.NaN(), math.Inf(1)} {
		c := Defaults(nil)
		if err := c.SetNearLimit(f); !errors.Is(err, throttler.ErrInvalidOption) || c.NearLimit != DefaultNearLimit {
			t.Errorf("SetNearLimit(%v): err %v, near limit %v", f, err, c.NearLimit)
		}
	}
	c := Defaults(nil)
	if err := c.SetNearLimit(0.5); err != nil || c.NearLimit != 0.5 {
		t.Fatalf("SetNearLimit(0.5): err %v, near limit %v", err, c.NearLimit)
	}
}

func TestAddRolloutAndBreakers(t *testing.T) {
	var c Common
	if err := c.AddBreakers(nil); !errors.Is(err, throttler.ErrInvalidOption) {
		t.Errorf("AddBreakers(nil): %v", err)
	}
	if err := c.AddRollout("", nil); !errors.Is(err, throttler.ErrInvalidOption) {
		t.Errorf("AddRollout without a name: %v", err)
	}
	if !errors.Is(NilOption(), throttler.ErrInvalidOption) {
		t.Error("NilOption does not wrap ErrInvalidOption")
	}
}

// TestEachBreakerOncePerServer: a server named by two sources is reported
// from the first.
func TestEachBreakerOncePerServer(t *testing.T) {
	a := func() []breaker.Status { return []breaker.Status{{Server: "s1", State: breaker.Open}} }
	b := func() []breaker.Status {
		return []breaker.Status{{Server: "s1", State: breaker.Closed}, {Server: "s2", State: breaker.HalfOpen}}
	}
	var got []breaker.Status
	EachBreaker([]func() []breaker.Status{a, b}, func(s breaker.Status) { got = append(got, s) })
	if len(got) != 2 || got[0].Server != "s1" || got[0].State != breaker.Open || got[1].Server != "s2" {
		t.Fatalf("got %+v", got)
	}
	for st, want := range map[breaker.State]string{breaker.Closed: "closed", breaker.HalfOpen: "half_open", breaker.Open: "open"} {
		if StateName(st) != want {
			t.Errorf("StateName(%v) = %q, want %q", st, StateName(st), want)
		}
	}
}

// TestIndexes: every outcome and kind has its index in the lists the
// adapters size their series by.
func TestIndexes(t *testing.T) {
	for _, r := range []throttler.Result{{Allowed: true}, {}, {Cached: true}, {Degraded: true, Allowed: true}, {Degraded: true}, {Local: true, Allowed: true}, {Local: true}} {
		if i := OutcomeIndex(&r); observe.Outcomes[i] != observe.Outcome(&r) {
			t.Errorf("OutcomeIndex(%+v) = %d", r, i)
		}
	}
	if i := KindIndex(errors.New("x")); observe.ErrorKinds[i] != observe.KindOther {
		t.Errorf("KindIndex of an unknown error = %d", i)
	}
}

// TestSeriesMakesOnce: concurrent first uses of one key make one series.
func TestSeriesMakesOnce(t *testing.T) {
	var s Series[string, *int]
	var made sync.Map
	var wg sync.WaitGroup
	got := make([]*int, 8)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i] = s.Get("k", func() *int {
				v := new(int)
				made.Store(v, true)
				return v
			})
		}()
	}
	wg.Wait()
	n := 0
	made.Range(func(any, any) bool { n++; return true })
	if n != 1 {
		t.Fatalf("made %d series for one key", n)
	}
	for _, p := range got {
		if p != got[0] {
			t.Fatal("two callers got different series")
		}
	}
	if s.Get("other", func() *int { return new(int) }) == got[0] {
		t.Fatal("a second key shares the first's series")
	}
}
