package throttler_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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
		{"300000/day", throttler.PerDay(300000), "300000/day"},
		{"1500000/week", throttler.PerWeek(1500000), "1500000/week"},
		{"100/2h", throttler.Per(100, 2*time.Hour), "100/2h"},
		{"5/250ms", throttler.Per(5, 250*time.Millisecond), "5/250ms"},
		{"7/90s", throttler.Per(7, 90*time.Second), "7/90s"},
		{" 3/ 30d ", throttler.Limit{}, ""}, // space inside: rejected below
		{"60/minute aligned", throttler.PerMinute(60).Using(throttler.AlignedWindow), "60/min aligned"},
		{"10/s gcra", throttler.PerSecond(10).Using(throttler.GCRA), "10/s gcra"},
		{"10/s GCRA burst=50", throttler.PerSecond(10).WithBurst(50), "10/s gcra burst=50"},
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
		"10/s sliding", "99999999999999999999/s", "2000000000000/s", "10/99999999999999999999week",
		"1/1000000000000000h",
	} {
		t.Run(in, func(t *testing.T) {
			_, err := throttler.ParseLimit(in)
			require.Error(t, err)
			assert.ErrorIs(t, err, throttler.ErrInvalidLimit)
			assert.Contains(t, err.Error(), "invalid limit")
		})
	}
}

func TestLimitValidate(t *testing.T) {
	bad := []throttler.Limit{
		{Max: 0, Window: time.Second},
		{Max: 1, Window: 0},
		{Max: 1, Window: time.Microsecond},
		{Max: 1, Window: 1500 * time.Microsecond},
		{Max: 1, Window: throttler.MaxWindow + time.Millisecond},
		{Max: throttler.MaxQuota + 1, Window: time.Second},
		{Max: 1, Window: time.Second, Algorithm: 7},
		{Max: 1, Window: time.Second, Burst: 3},
		{Max: 1, Window: time.Second, Algorithm: throttler.GCRA, Burst: -1},
		// A burst this large times a one-day emission interval would run
		// the theoretical arrival time past what stores hold exactly.
		{Max: 1, Window: 24 * time.Hour, Algorithm: throttler.GCRA, Burst: 1 << 30},
	}
	for _, l := range bad {
		assert.ErrorIs(t, l.Validate(), throttler.ErrInvalidLimit, "%+v", l)
	}
	good := []throttler.Limit{
		throttler.PerSecond(1), throttler.Per(throttler.MaxQuota, throttler.MaxWindow),
		throttler.Per(1, throttler.MinWindow), throttler.PerHour(10).WithBurst(100),
	}
	for _, l := range good {
		assert.NoError(t, l.Validate(), "%+v", l)
	}
}

func TestNewPolicy(t *testing.T) {
	p, err := throttler.ParsePolicy("api", "10/s, 120/min, 240/h")
	require.NoError(t, err)
	assert.Equal(t, 3, p.Len())
	assert.Equal(t, "api: 10/s, 120/min, 240/h", p.String())
	assert.Equal(t, "120/min", p.Limit(1).Name)
	assert.Equal(t, throttler.FailOpen, p.FailureMode())

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
	assert.ErrorIs(t, err, throttler.ErrInvalidPolicy)
	_, err = throttler.NewPolicy("api", []throttler.Limit{throttler.PerSecond(1)}, throttler.WithCallTimeout(-1))
	assert.ErrorIs(t, err, throttler.ErrInvalidPolicy)

	// Two limits with one rate but different algorithms need names.
	_, err = throttler.NewPolicy("api", []throttler.Limit{throttler.PerSecond(1), throttler.PerSecond(1).Using(throttler.AlignedWindow)})
	require.NoError(t, err, "their notations differ")
	named, err := throttler.NewPolicy("api", []throttler.Limit{throttler.PerSecond(1).Named("a"), throttler.PerSecond(1).Named("a").Using(throttler.GCRA)})
	assert.Nil(t, named)
	assert.ErrorIs(t, err, throttler.ErrInvalidPolicy)
}

func TestLimitKeysNeverCollide(t *testing.T) {
	p, err := throttler.NewPolicy("p", []throttler.Limit{
		throttler.PerSecond(1).Named("a:b"),
		throttler.PerSecond(1).Named("a").Using(throttler.AlignedWindow),
		throttler.PerMinute(1).Named("a" + ":fixed"),
		throttler.PerSecond(1).Named("x").WithBurst(2),
		throttler.PerSecond(1).Named("y").WithBurst(3),
	})
	require.NoError(t, err)
	seen := map[string]bool{}
	for i := 0; i < p.Len(); i++ {
		k := p.LimitKey(i)
		assert.False(t, seen[k], k)
		seen[k] = true
		assert.False(t, strings.ContainsAny(k, "{} \n"), k)
	}
}

func TestEscapeKey(t *testing.T) {
	assert.Equal(t, "user-42_a.b", throttler.EscapeKey("user-42_a.b"))
	assert.Equal(t, "%7Ba%7D%20%00%0A%25%3A", throttler.EscapeKey("{a} \x00\n%:"))
	assert.Equal(t, "%FF%FE", throttler.EscapeKey("\xff\xfe"))
	// Injective: the escape of '%' keeps "%41" apart from "A".
	assert.NotEqual(t, throttler.EscapeKey("%41"), throttler.EscapeKey("A"))
}

func TestValidateIdentifier(t *testing.T) {
	assert.ErrorIs(t, throttler.ValidateIdentifier(""), throttler.ErrInvalidIdentifier)
	assert.ErrorIs(t, throttler.ValidateIdentifier(strings.Repeat("x", 1025)), throttler.ErrInvalidIdentifier)
	assert.NoError(t, throttler.ValidateIdentifier(strings.Repeat("x", 1024)))
	assert.NoError(t, throttler.ValidateIdentifier("\x00"))
	assert.True(t, errors.Is(throttler.ValidateIdentifier(""), throttler.ErrInvalidIdentifier))
}
