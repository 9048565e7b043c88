package throttler_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/throttler"
)

func TestParseLimit(t *testing.T) {
	day := 24 * time.Hour
	tests := []struct {
		in   string
		want throttler.Limit
		str  string
	}{
		{"10/s", throttler.PerSecond(10), "10/s"},
		{"120/min", throttler.PerMinute(120), "120/min"},
		{"5000/h", throttler.PerHour(5000), "5000/h"},
		{"300000/day", throttler.Per(300000, day), "300000/day"},
		{"1500000/week", throttler.Per(1500000, 7*day), "1500000/week"},
		{"100/2h", throttler.Per(100, 2*time.Hour), "100/2h"},
		{"5/250ms", throttler.Per(5, 250*time.Millisecond), "5/250ms"},
		{"7/90s", throttler.Per(7, 90*time.Second), "7/90s"},
		{" 3/ 30d ", throttler.Limit{}, ""}, // space inside: rejected below
		{"60/minute aligned", throttler.Limit{Max: 60, Window: time.Minute, Algorithm: throttler.AlignedWindow}, "60/min aligned"},
		{"10/s gcra", throttler.Limit{Max: 10, Window: time.Second, Algorithm: throttler.GCRA}, "10/s gcra"},
		{"10/s GCRA burst=50", throttler.Limit{Max: 10, Window: time.Second, Algorithm: throttler.GCRA, Burst: 50}, "10/s gcra burst=50"},
		{"1/400d", throttler.Per(1, 400*day), "1/400day"},
		{"2/Hours", throttler.Per(2, time.Hour), "2/h"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := throttler.ParseLimit(tt.in)
			if tt.str == "" {
				require.ErrorIs(t, err, throttler.ErrInvalidLimit)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tt.want, got)
			assert.Equal(t, tt.str, got.String())
			again, err := throttler.ParseLimit(got.String())
			require.NoError(t, err, "String is parseable")
			assert.Equal(t, got, again)
		})
	}
}

func TestParseLimitErrors(t *testing.T) {
	for _, in := range []string{
		"", "10", "/s", "0/s", "-1/s", "x/s", "10/", "10/parsec", "10/0s", "10/-1s",
		"10/month", "10/401d", "10/s burst=5", "10/s gcra burst=0", "10/s gcra burst=x",
		"10/s sliding gcra", "10/s leaky", "1000000000000/400day sliding", "99999999999999999999/s", "2000000000000/s", "10/99999999999999999999week",
		"1/1000000000000000h",
		// Conflicting or repeated options.
		"10/s aligned gcra", "10/s gcra aligned", "10/s fixed aligned", "10/s gcra gcra",
		"10/s aligned aligned", "10/s gcra burst=5 burst=6",
	} {
		t.Run(in, func(t *testing.T) {
			_, err := throttler.ParseLimit(in)
			require.Error(t, err)
			assert.ErrorIs(t, err, throttler.ErrInvalidLimit)
			assert.Contains(t, err.Error(), "invalid limit")
		})
	}
}

func TestParseLimitNamesTheConflict(t *testing.T) {
	_, err := throttler.ParseLimit("10/s aligned gcra")
	require.ErrorIs(t, err, throttler.ErrInvalidLimit)
	assert.Contains(t, err.Error(), `"aligned" and "gcra" conflict`)
	_, err = throttler.ParseLimit("10/s gcra burst=5 burst=6")
	assert.Contains(t, err.Error(), `"burst" given twice`)
}

func TestInvalidLimits(t *testing.T) {
	bad := []throttler.Limit{
		{Max: 0, Window: time.Second},
		{Max: 1, Window: 0},
		{Max: 1, Window: time.Microsecond},
		{Max: 1, Window: 1500 * time.Microsecond},
		{Max: 1, Window: 400*24*time.Hour + time.Millisecond},
		{Max: 1<<40 + 1, Window: time.Second},
		{Max: 1, Window: time.Second, Algorithm: 7},
		{Max: 1, Window: time.Second, Burst: 3},
		{Max: 1, Window: time.Second, Algorithm: throttler.GCRA, Burst: -1},
		// A burst this large times a one-day emission interval would run
		// the theoretical arrival time past what stores hold exactly.
		{Max: 1, Window: 24 * time.Hour, Algorithm: throttler.GCRA, Burst: 1 << 30},
	}
	for _, l := range bad {
		_, err := throttler.NewPolicy("p", []throttler.Limit{l})
		assert.ErrorIs(t, err, throttler.ErrInvalidLimit, "%+v", l)
	}
	good := []throttler.Limit{
		throttler.PerSecond(1), throttler.Per(1<<40, 400*24*time.Hour),
		throttler.Per(1, time.Millisecond), {Max: 10, Window: time.Hour, Algorithm: throttler.GCRA, Burst: 100},
	}
	for _, l := range good {
		_, err := throttler.NewPolicy("p", []throttler.Limit{l})
		assert.NoError(t, err, "%+v", l)
	}
}

func TestNewPolicy(t *testing.T) {
	p, err := throttler.ParsePolicy("api", "10/s, 120/min, 240/h")
	require.NoError(t, err)
	assert.Len(t, p.Limits(), 3)
	assert.Equal(t, "api", p.Name())
	assert.Equal(t, "api: 10/s, 120/min, 240/h", p.String())
	assert.Equal(t, "120/min", p.Limits()[1].Name)

	_, err = throttler.ParsePolicy("api", "10/s, 10/s")
	assert.ErrorIs(t, err, throttler.ErrInvalidPolicy, "duplicate names")
	_, err = throttler.NewPolicy("", []throttler.Limit{throttler.PerSecond(1)})
	assert.ErrorIs(t, err, throttler.ErrInvalidPolicy)
	_, err = throttler.NewPolicy("api", nil)
	assert.ErrorIs(t, err, throttler.ErrInvalidPolicy)
	_, err = throttler.NewPolicy("api", []throttler.Limit{{Max: 0, Window: time.Second}})
	assert.ErrorIs(t, err, throttler.ErrInvalidLimit)
	_, err = throttler.ParsePolicy("api", "10/s,, 5/h")
	assert.ErrorIs(t, err, throttler.ErrInvalidLimit)
	_, err = throttler.NewPolicy("api", []throttler.Limit{throttler.PerSecond(1)}, throttler.WithFailureMode(9))
	assert.ErrorIs(t, err, throttler.ErrInvalidOption)
	_, err = throttler.NewPolicy("api", []throttler.Limit{throttler.PerSecond(1)}, throttler.WithCallTimeout(-1))
	assert.ErrorIs(t, err, throttler.ErrInvalidOption)
	_, err = throttler.NewPolicy("api", []throttler.Limit{throttler.PerSecond(1)}, throttler.WithLogger(nil))
	assert.ErrorIs(t, err, throttler.ErrInvalidOption, "a throttler-only option on a policy")
	_, err = throttler.NewPolicy("api", []throttler.Limit{throttler.PerSecond(1)}, nil)
	assert.ErrorIs(t, err, throttler.ErrInvalidOption)

	// Two limits with one rate but different algorithms need names.
	_, err = throttler.NewPolicy("api", []throttler.Limit{throttler.PerSecond(1), {Max: 1, Window: time.Second, Algorithm: throttler.AlignedWindow}})
	require.NoError(t, err, "their notations differ")
	named, err := throttler.NewPolicy("api", []throttler.Limit{{Name: "a", Max: 1, Window: time.Second}, {Name: "a", Max: 1, Window: time.Second, Algorithm: throttler.GCRA}})
	assert.Nil(t, named)
	assert.ErrorIs(t, err, throttler.ErrInvalidPolicy)

	// The caller's slice is not modified.
	ls := []throttler.Limit{throttler.PerSecond(1)}
	_, err = throttler.NewPolicy("api", ls)
	require.NoError(t, err)
	assert.Empty(t, ls[0].Name)
}

func TestNewRejectsBadOptions(t *testing.T) {
	for _, opt := range []throttler.Option{throttler.WithCallTimeout(-time.Second), throttler.WithClock(nil),
		throttler.WithObserver(nil), throttler.WithFailureMode(-1), nil} {
		_, err := throttler.New(memorybackend.New(), opt)
		assert.ErrorIs(t, err, throttler.ErrInvalidOption)
	}
	_, err := throttler.New(nil)
	assert.ErrorIs(t, err, throttler.ErrNotInitialized)
}
