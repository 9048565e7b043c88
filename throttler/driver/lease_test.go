package driver_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

func TestNewConcurrencyLimit(t *testing.T) {
	l, err := driver.NewConcurrencyLimit("up loads:a", 3, 90*time.Second)
	require.NoError(t, err)
	assert.Equal(t, int64(90000), l.TTLMillis)
	assert.Equal(t, "up%20loads%3Aa", l.Key, "a stored key: it must never change")
	assert.True(t, l.Valid())
	for _, c := range []struct {
		name string
		max  int64
		ttl  time.Duration
	}{
		{"", 1, time.Second}, {"c", 0, time.Second}, {"c", driver.MaxQuota + 1, time.Second},
		{"c", 1, 0}, {"c", 1, time.Microsecond}, {"c", 1, 1500 * time.Microsecond}, {"c", 1, driver.MaxWindow + time.Millisecond},
	} {
		l, err := driver.NewConcurrencyLimit(c.name, c.max, c.ttl)
		assert.Nil(t, l)
		assert.True(t, errors.Is(err, driver.ErrInvalidLimit), "%q %d %v: %v", c.name, c.max, c.ttl, err)
	}
	var zero *driver.ConcurrencyLimit
	assert.False(t, zero.Valid())
	assert.False(t, (&driver.ConcurrencyLimit{}).Valid())
}

func TestAcquireAndReleaseLease(t *testing.T) {
	l, err := driver.NewConcurrencyLimit("c", 2, 10*time.Second)
	require.NoError(t, err)
	t0 := time.UnixMilli(1_900_000_000_000)
	set := map[string]int64{}
	ms := t0.UnixMilli()
	assert.Equal(t, driver.LeaseOutcome{Acquired: true, InFlight: 1, NextExpiry: ms + 10000}, driver.AcquireLease(l, set, "a", t0))
	assert.Equal(t, driver.LeaseOutcome{Acquired: true, InFlight: 2, NextExpiry: ms + 10000}, driver.AcquireLease(l, set, "b", t0.Add(time.Second)))
	assert.Equal(t, driver.LeaseOutcome{InFlight: 2, NextExpiry: ms + 10000}, driver.AcquireLease(l, set, "c", t0.Add(time.Second)))
	// A renewal is never refused, never counts twice, never shortens.
	assert.Equal(t, driver.LeaseOutcome{Acquired: true, Held: true, InFlight: 2, NextExpiry: ms + 11000}, driver.AcquireLease(l, set, "a", t0.Add(5*time.Second)))
	assert.Equal(t, driver.LeaseOutcome{Acquired: true, Held: true, InFlight: 2, NextExpiry: ms + 11000}, driver.AcquireLease(l, set, "a", t0))
	assert.Equal(t, int64(ms+15000), set["a"])
	// b expires at its expiry exactly.
	assert.Equal(t, driver.LeaseOutcome{Acquired: true, InFlight: 2, NextExpiry: ms + 15000}, driver.AcquireLease(l, set, "c", t0.Add(11*time.Second)))
	assert.Equal(t, driver.LeaseOutcome{Held: true, InFlight: 1, NextExpiry: ms + 21000}, driver.ReleaseLease(l, set, "a", t0.Add(11*time.Second)))
	assert.Equal(t, driver.LeaseOutcome{InFlight: 1, NextExpiry: ms + 21000}, driver.ReleaseLease(l, set, "a", t0.Add(11*time.Second)))
	assert.Equal(t, driver.LeaseOutcome{}, driver.ReleaseLease(l, set, "zzz", t0.Add(time.Hour)))
	assert.Empty(t, set)
}

func TestLeaseRequestCheck(t *testing.T) {
	l, err := driver.NewConcurrencyLimit("c", 1, time.Second)
	require.NoError(t, err)
	ok := driver.LeaseRequest{Limit: l, Identifier: "u", Lease: "x", Now: time.UnixMilli(1)}
	require.NoError(t, ok.Check())
	for name, mutate := range map[string]func(*driver.LeaseRequest){
		"nil limit":     func(r *driver.LeaseRequest) { r.Limit = nil },
		"no identifier": func(r *driver.LeaseRequest) { r.Identifier = "" },
		"no lease":      func(r *driver.LeaseRequest) { r.Lease = "" },
		"before 1970":   func(r *driver.LeaseRequest) { r.Now = time.UnixMilli(-1) },
		"after 2200":    func(r *driver.LeaseRequest) { r.Now = time.UnixMilli(driver.MaxUnixMilli + 1) },
		"2200 + 1 ns":   func(r *driver.LeaseRequest) { r.Now = time.UnixMilli(driver.MaxUnixMilli).Add(time.Nanosecond) },
		"2200 + 999999 ns": func(r *driver.LeaseRequest) {
			r.Now = time.UnixMilli(driver.MaxUnixMilli).Add(999_999 * time.Nanosecond)
		},
		"long lease":     func(r *driver.LeaseRequest) { r.Lease = string(make([]byte, driver.MaxLeaseIDLen+1)) },
		"long identifer": func(r *driver.LeaseRequest) { r.Identifier = string(make([]byte, driver.MaxIdentifierLen+1)) },
	} {
		r := ok
		mutate(&r)
		err := r.Check()
		assert.True(t, errors.Is(err, driver.ErrInvalidLimit) || errors.Is(err, driver.ErrInvalidOption), "%s: %v", name, err)
	}
}
