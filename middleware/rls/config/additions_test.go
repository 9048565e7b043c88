package config_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/middleware/rls/config"
	"github.com/throttlekit/throttlekit/throttler"
)

// rule parses a file holding one descriptor, key "k", with the given
// rate_limit block (each line indented by six spaces), and returns its rule.
func rule(t *testing.T, rateLimit string, opts ...config.Option) *config.Rule {
	t.Helper()
	cfg := parse(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n"+rateLimit, opts...)
	rules := cfg.Rules()
	require.Len(t, rules, 1)
	return rules[0]
}

func TestUnitLimits(t *testing.T) {
	day := 24 * time.Hour
	tests := []struct {
		unit   string
		window time.Duration
	}{
		{"second", time.Second}, {"SECOND", time.Second}, {"Minute", time.Minute}, {"hour", time.Hour},
		{"day", day}, {"week", 7 * day}, {"month", 30 * day}, {"YEAR", 365 * day},
	}
	for _, tt := range tests {
		t.Run(tt.unit, func(t *testing.T) {
			r := rule(t, "      unit: "+tt.unit+"\n      requests_per_unit: 7\n")
			want := throttler.Per(7, tt.window).Using(throttler.AlignedWindow)
			assert.Equal(t, []throttler.Limit{want}, r.Limits)
			require.NotNil(t, r.Policy)
			assert.Equal(t, "d.k", r.Policy.Name())
			assert.Equal(t, notations(r.Limits), notations(r.Policy.Limits()))
			assert.Equal(t, lower(tt.unit), r.Unit)
			assert.Equal(t, uint32(7), r.RequestsPerUnit)
			assert.False(t, r.Blocks)
			assert.Equal(t, "test.yaml", r.File)
			assert.Equal(t, 4, r.Line)
		})
	}
}

// notations returns the limits' notations.
func notations(limits []throttler.Limit) []string {
	var out []string
	for _, l := range limits {
		out = append(out, l.String())
	}
	return out
}

func lower(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'A' <= c && c <= 'Z' {
			b[i] = c + 'a' - 'A'
		}
	}
	return string(b)
}

func TestAdditions(t *testing.T) {
	tests := []struct {
		name   string
		block  string
		opts   []config.Option
		limits []throttler.Limit
		mode   string
	}{
		{"default aligned", "unit: minute\nrequests_per_unit: 100", nil,
			[]throttler.Limit{throttler.Per(100, time.Minute).Using(throttler.AlignedWindow)}, ""},
		{"DefaultAlgorithm", "unit: minute\nrequests_per_unit: 100", []config.Option{config.DefaultAlgorithm(throttler.SlidingWindow)},
			[]throttler.Limit{throttler.Per(100, time.Minute).Using(throttler.SlidingWindow)}, ""},
		{"algorithm wins over DefaultAlgorithm", "unit: minute\nrequests_per_unit: 100\nalgorithm: Fixed", []config.Option{config.DefaultAlgorithm(throttler.SlidingWindow)},
			[]throttler.Limit{throttler.Per(100, time.Minute).Using(throttler.FixedWindow)}, ""},
		{"gcra", "unit: second\nrequests_per_unit: 10\nalgorithm: gcra", nil,
			[]throttler.Limit{throttler.Per(10, time.Second).Using(throttler.GCRA)}, ""},
		{"gcra burst", "unit: second\nrequests_per_unit: 10\nalgorithm: gcra\nburst: 50", nil,
			[]throttler.Limit{throttler.Per(10, time.Second).WithBurst(50)}, ""},
		{"burst under a gcra default", "unit: second\nrequests_per_unit: 10\nburst: 50", []config.Option{config.DefaultAlgorithm(throttler.GCRA)},
			[]throttler.Limit{throttler.Per(10, time.Second).WithBurst(50)}, ""},
		{"sliding", "unit: hour\nrequests_per_unit: 5000\nalgorithm: sliding", nil,
			[]throttler.Limit{throttler.Per(5000, time.Hour).Using(throttler.SlidingWindow)}, ""},
		{"extra limits", "unit: hour\nrequests_per_unit: 5000\nlimits: [\"10/s\", \"5000/h sliding\", \"100/min gcra burst=20\"]", nil,
			[]throttler.Limit{
				throttler.Per(5000, time.Hour).Using(throttler.AlignedWindow),
				throttler.PerSecond(10),
				throttler.PerHour(5000).Using(throttler.SlidingWindow),
				throttler.PerMinute(100).WithBurst(20),
			}, ""},
		{"limits only", "limits:\n  - 10/s\n  - 1000/day aligned", nil,
			[]throttler.Limit{throttler.PerSecond(10), throttler.Per(1000, 24*time.Hour).Using(throttler.AlignedWindow)}, ""},
		{"empty limits", "unit: second\nrequests_per_unit: 3\nlimits: []", nil,
			[]throttler.Limit{throttler.PerSecond(3).Using(throttler.AlignedWindow)}, ""},
		{"same window, other algorithm", "unit: second\nrequests_per_unit: 3\nlimits: [\"5/s\"]", nil,
			[]throttler.Limit{throttler.PerSecond(3).Using(throttler.AlignedWindow), throttler.PerSecond(5)}, ""},
		{"failure_mode open", "unit: second\nrequests_per_unit: 3\nfailure_mode: open", nil,
			[]throttler.Limit{throttler.PerSecond(3).Using(throttler.AlignedWindow)}, "open"},
		{"failure_mode closed", "unit: second\nrequests_per_unit: 3\nfailure_mode: CLOSED", nil,
			[]throttler.Limit{throttler.PerSecond(3).Using(throttler.AlignedWindow)}, "closed"},
		{"null additions are absent", "unit: second\nrequests_per_unit: 3\nalgorithm:\nburst:\nlimits:\nfailure_mode:", nil,
			[]throttler.Limit{throttler.PerSecond(3).Using(throttler.AlignedWindow)}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := rule(t, indent(tt.block), tt.opts...)
			assert.Equal(t, tt.limits, r.Limits)
			require.NotNil(t, r.Policy)
			assert.Equal(t, r.FullKey, r.Policy.Name())
			assert.Equal(t, notations(tt.limits), notations(r.Policy.Limits()))
			assert.Equal(t, tt.mode, r.FailureMode)
			assert.False(t, r.Blocks)
			assert.False(t, r.Unlimited)
		})
	}
}

// indent puts six spaces before each line of a rate_limit block.
func indent(block string) string {
	out := ""
	start := 0
	for i := 0; i <= len(block); i++ {
		if i == len(block) || block[i] == '\n' {
			out += "      " + block[start:i] + "\n"
			start = i + 1
		}
	}
	return out
}

func TestBlocksAndUnlimited(t *testing.T) {
	r := rule(t, indent("unit: second\nrequests_per_unit: 0\nalgorithm: gcra\nfailure_mode: closed"))
	assert.True(t, r.Blocks)
	assert.Nil(t, r.Limits)
	assert.Nil(t, r.Policy)
	assert.Equal(t, "second", r.Unit)
	assert.Equal(t, "closed", r.FailureMode)

	// requests_per_unit left out is 0, as in envoy ratelimit.
	r = rule(t, indent("unit: minute"))
	assert.True(t, r.Blocks)

	// envoy ratelimit ignores requests_per_unit and a unit it does not
	// know beside unlimited.
	r = rule(t, indent("unlimited: true\nrequests_per_unit: 5\nunit: bogus\nname: free"))
	assert.True(t, r.Unlimited)
	assert.False(t, r.Blocks)
	assert.Equal(t, "", r.Unit)
	assert.Equal(t, uint32(5), r.RequestsPerUnit)
	assert.Equal(t, "free", r.Name)
	assert.Nil(t, r.Limits)
	assert.Nil(t, r.Policy)
}

// TestYAMLReading checks that scalars are read as envoy ratelimit's YAML
// parser reads them, and that anchors, aliases and merge keys work.
func TestYAMLReading(t *testing.T) {
	cfg := parse(t, `
domain: 42
# envoy ratelimit ignores a name here: a place for an anchor.
name: &defaults
  unit: second
descriptors:
  - key: yes
    value: 0x10
    shadow_mode: yes
    quota_mode: on
    detailed_metric: N
    rate_limit: &limit
      <<: *defaults
      requests_per_unit: 1_000
  - key: b
    value: ~
    shadow_mode: ~
    rate_limit: *limit
  - key: c
    rate_limit:
      <<: [*limit, {unit: hour, name: c}]
      unit: minute
      requests_per_unit: 0x10
`)
	require.Equal(t, []string{"42"}, cfg.Domains())
	a := cfg.Lookup("42", d("yes", "0x10")).Rule
	require.NotNil(t, a)
	assert.Equal(t, "42.yes_0x10", a.FullKey)
	assert.True(t, a.ShadowMode)
	assert.True(t, a.QuotaMode)
	assert.False(t, a.DetailedMetric)
	assert.Equal(t, uint32(1000), a.RequestsPerUnit)
	assert.Equal(t, "second", a.Unit)

	b := cfg.Lookup("42", d("b", "x")).Rule
	require.NotNil(t, b)
	assert.Equal(t, "42.b", b.FullKey)
	assert.False(t, b.ShadowMode)
	assert.Equal(t, uint32(1000), b.RequestsPerUnit)
	assert.NotSame(t, a, b)

	c := cfg.Lookup("42", d("c", "x")).Rule
	require.NotNil(t, c)
	assert.Equal(t, "minute", c.Unit, "the mapping's own key wins")
	assert.Equal(t, uint32(16), c.RequestsPerUnit)
	assert.Equal(t, "c", c.Name, "merged from the second mapping")
}
