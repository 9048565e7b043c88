package throttler_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/throttler"
)

// TestPolicyStringRoundTrips: String prints the one notation, and
// ParsePolicy reads it back to an equal policy: name, limit names,
// algorithms and bursts, whatever bytes the names hold. (The conformance
// suite checks the same on every policy it builds.)
func TestPolicyStringRoundTrips(t *testing.T) {
	for _, c := range []struct {
		name   string
		limits []throttler.Limit
		want   string
	}{
		{"api", []throttler.Limit{throttler.PerSecond(10), throttler.PerHour(5000)}, "api: 10/s, 5000/h"},
		{"api", []throttler.Limit{throttler.PerSecond(10).Named("per-sec"), throttler.PerHour(5000).WithBurst(20)},
			"api: 10/s name=per-sec, 5000/h gcra burst=20"},
		{"api", []throttler.Limit{throttler.PerMinute(60).Using(throttler.AlignedWindow).Named("Burst"), throttler.PerMinute(100).Using(throttler.SlidingWindow)},
			"api: 60/min aligned name=Burst, 100/min sliding"},
		{"api:v2", []throttler.Limit{throttler.PerSecond(3).Named("a:b")}, "api:v2: 3/s name=a:b"},
		{"api:", []throttler.Limit{throttler.PerSecond(3)}, "api:: 3/s"},
		{"a,b", []throttler.Limit{throttler.PerSecond(3)}, "a,b: 3/s"},
		{"GET /v1: list", []throttler.Limit{throttler.PerSecond(3)}, `"GET /v1: list": 3/s`},
		{" padded ", []throttler.Limit{throttler.PerSecond(3)}, `" padded ": 3/s`},
		{`say "hi"`, []throttler.Limit{throttler.PerSecond(3)}, `"say \"hi\"": 3/s`},
		{"p", []throttler.Limit{
			throttler.Per(10, time.Minute).WithBurst(3).Named("10/min burst 3"),
			throttler.PerSecond(1).Named("per user, per second"),
			throttler.PerSecond(2).Named(`quote"d`),
			throttler.PerSecond(4).Named("a: b"),
			throttler.PerSecond(5).Named("tab\there"),
		}, `p: 10/min gcra burst=3 name="10/min burst 3", 1/s name="per user, per second", 2/s name="quote\"d", 4/s name="a: b", 5/s name="tab\there"`},
		{"p", []throttler.Limit{throttler.PerSecond(10).Named("10/s")}, "p: 10/s"}, // a notation names nothing
	} {
		p, err := throttler.NewPolicy(c.name, c.limits)
		require.NoError(t, err, c.want)
		assert.Equal(t, c.want, p.String())
		for _, name := range []string{"", c.name} {
			again, err := throttler.ParsePolicy(name, p.String())
			require.NoError(t, err, "ParsePolicy(%q, %q)", name, p.String())
			assert.Equal(t, p.Name(), again.Name(), c.want)
			assert.Equal(t, p.Limits(), again.Limits(), c.want)
			assert.Equal(t, p.String(), again.String(), c.want)
		}
		for _, l := range p.Limits() {
			again, err := throttler.ParseLimit(l.String())
			require.NoError(t, err, l.String())
			if l.Name == l.String() {
				continue // an unnamed limit: its name is its notation
			}
			assert.Equal(t, l, again, "ParseLimit(Limit.String()) for %q", l.String())
		}
	}
}

// TestParsePolicyPrefix: the name may come from the argument, from the
// text, or from both when they agree.
func TestParsePolicyPrefix(t *testing.T) {
	p, err := throttler.ParsePolicy("", "core:\t10/s")
	require.NoError(t, err)
	assert.Equal(t, "core", p.Name())
	p, err = throttler.ParsePolicy("core", "core: 10/s")
	require.NoError(t, err)
	assert.Equal(t, "core: 10/s", p.String())
	p, err = throttler.ParsePolicy("api", `10/s name="a: b"`)
	require.NoError(t, err, "a colon inside quotes ends no policy name")
	assert.Equal(t, "api", p.Name())
	assert.Equal(t, "a: b", p.Limits()[0].Name)

	for text, why := range map[string]string{
		"core: 10/s":         `named "api", and "core"`,
		`"core 10/s`:         "quoted policy name",
		`"core" 10/s`:        "quoted policy name",
		"10/s name=a\"b":     "double quote",
		`10/s name="a`:       "not a whole double-quoted string",
		`10/s name=""`:       "name must not be empty",
		"burst=5/min":        `to name this one "burst", write "5/min name=burst"`,
		"x/min":              `max "x" must be a positive whole number`,
		"5/min gcra burst=y": `burst "y" must be a positive whole number`,
	} {
		_, err := throttler.ParsePolicy("api", text)
		require.Error(t, err, text)
		assert.Contains(t, err.Error(), why, text)
	}
	_, err = throttler.ParsePolicy("", "10/s")
	assert.ErrorIs(t, err, throttler.ErrInvalidPolicy, "no name anywhere")
}
