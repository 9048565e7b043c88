package config_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/middleware/rls/config"
	"github.com/throttlekit/throttlekit/throttler"
)

// assertConfigError asserts that err is an *Error of file at line:column
// whose message contains msg (a line or column of -1 is not checked), and that it wraps ErrInvalidConfig.
func assertConfigError(t *testing.T, err error, file string, line, column int, msg string) {
	t.Helper()
	require.Error(t, err)
	assert.ErrorIs(t, err, config.ErrInvalidConfig)
	var ce *config.Error
	require.ErrorAs(t, err, &ce)
	assert.Equal(t, file, ce.File, "File")
	if line >= 0 {
		assert.Equal(t, line, ce.Line, "Line of %q", err)
	}
	if column >= 0 {
		assert.Equal(t, column, ce.Column, "Column of %q", err)
	}
	assert.Contains(t, ce.Msg, msg)
}

// head is the start of most files below: a domain and one descriptor at
// line 3, its fields from line 4 on.
const head = "domain: d\ndescriptors:\n  - key: a\n"

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name         string
		yaml         string
		line, column int // column -1: not checked
		msg          string
	}{
		// Envoy ratelimit's own refusals.
		{"yaml syntax", "domain: d\ndescriptors:\n  - key: a\n    value: b\n      c: d\n", 5, 0, "YAML syntax error: mapping values are not allowed"},
		{"yaml syntax, parser error in a list", "domain: d\ndescriptors:\n  - key: a\n   value: b\n", 3, 0, "YAML syntax error: did not find expected '-' indicator"},
		{"yaml syntax, unclosed flow mapping", "{domain: d\n", 2, 0, "YAML syntax error: did not find expected ',' or '}'"},
		{"yaml syntax, unclosed flow list", "domain: d\nname: x\ndescriptors: [{key: a}\n", 3, 0, "YAML syntax error: did not find expected ',' or ']'"},
		{"yaml syntax, tab", "domain: d\n\tdescriptors: []\n", 2, 0, "YAML syntax error"},
		{"unknown top-level key", "domain: d\ndescriptor: []\n", 2, 1, `unknown key "descriptor"`},
		{"unknown descriptor key", head + "    rate_limits: {}\n", 4, 5, `unknown key "rate_limits"`},
		{"unknown rate_limit key", head + "    rate_limit:\n      unit: second\n      request_per_unit: 5\n", 6, 7, `unknown key "request_per_unit"`},
		{"unknown key in an ignored value", "domain: d\nname: {foo: 1}\n", 2, 8, `unknown key "foo"`},
		{"unknown key in replaces", head + "    rate_limit:\n      unit: second\n      replaces:\n        - nam: x\n", 7, 11, `unknown key "nam"`},
		{"non-string key", "domain: d\n1: x\n", 2, 1, "a mapping key must be a string, not 1"},
		{"key given twice", head + "    value: x\n    value: y\n", 5, 5, `key "value" given twice in one mapping (first at line 4)`},
		{"empty file", "", 0, 0, "file has no domain"},
		{"null document", "~\n", 1, 1, "file has no domain"},
		{"no domain", "descriptors: []\n", 1, 1, "file has no domain"},
		{"empty domain", "domain: ''\n", 1, 9, "domain is empty"},
		{"null domain", "domain:\ndescriptors: []\n", 1, 8, "domain is empty"},
		{"top level not a mapping", "- domain: d\n", 1, 1, "the top level must be a mapping"},
		{"descriptors not a list", "domain: d\ndescriptors: {key: a}\n", 2, 14, "descriptors must be a list"},
		{"descriptor not a mapping", "domain: d\ndescriptors:\n  - a\n", 3, 5, `a descriptor must be a mapping, not "a"`},
		{"no descriptor key", "domain: d\ndescriptors:\n  - value: x\n", 3, 5, "descriptor has no key"},
		{"empty descriptor key", "domain: d\ndescriptors:\n  - key: \"\"\n", 3, 10, "descriptor key is empty"},
		{"duplicate composite key", head + "  - key: a\n    value: \"\"\n", 4, 5, `descriptor "d.a" is defined twice at this level (first in test.yaml at line 3)`},
		{"duplicate composite key, nested", head + "    descriptors:\n      - key: b\n        value: c\n      - key: b\n        value: c\n", 7, 9, `descriptor "d.a.b_c" is defined twice`},
		{"duplicate composite key across key and value", "domain: d\ndescriptors:\n  - key: a_b\n  - key: a\n    value: b\n", 4, 5, `descriptor "d.a_b" is defined twice`},
		{"no unit", head + "    rate_limit:\n      requests_per_unit: 5\n", 4, 5, "rate_limit needs a unit"},
		{"empty rate_limit", head + "    rate_limit: {}\n", 4, 5, "rate_limit needs a unit"},
		{"invalid unit", head + "    rate_limit:\n      unit: fortnight\n      requests_per_unit: 5\n", 5, 13, `invalid unit "fortnight"`},
		{"unit with unlimited", head + "    rate_limit:\n      unlimited: true\n      unit: Second\n", 6, 13, "an unlimited rate_limit takes no unit"},
		{"empty replaces name", head + "    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: \"\"\n", 8, 11, "a replaces entry needs a name"},
		{"replaces without name", head + "    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - {}\n", 8, 11, "a replaces entry needs a name"},
		{"replaces itself", head + "    rate_limit:\n      name: me\n      unit: second\n      requests_per_unit: 1\n      replaces:\n        - name: other\n        - name: me\n", 10, 11, `rate_limit "me" replaces itself`},
		{"replaces not a list", head + "    rate_limit:\n      unit: second\n      replaces: me\n", 6, 17, "replaces must be a list"},
		{"share_threshold without wildcard", head + "    value: files\n    share_threshold: true\n", 5, 22, `share_threshold applies to wildcard values only (ending in '*'), and "a_files" is none`},
		{"rate_limit not a mapping", head + "    rate_limit: 5/s\n", 4, 17, "rate_limit must be a mapping"},
		{"float anywhere", head + "    value: 1.5\n", 4, 12, "value must be a string, not the number 1.5"},
		{"float in an ignored value", "domain: d\nname: 1.5\n", 2, 7, "unexpected number 1.5"},
		{"list of scalars in an ignored value", "domain: d\nname: [a]\n", 2, 8, `a list here holds mappings only, not "a"`},
		{"key not a string", head + "    value: [x]\n", 4, 12, "value must be a string, not a list"},
		// Types.
		{"requests_per_unit a word", head + "    rate_limit:\n      unit: second\n      requests_per_unit: ten\n", 6, 26, `requests_per_unit must be a whole number from 0 to 4294967295, not "ten"`},
		{"requests_per_unit quoted", head + "    rate_limit:\n      unit: second\n      requests_per_unit: \"10\"\n", 6, 26, "requests_per_unit must be a whole number"},
		{"requests_per_unit negative", head + "    rate_limit:\n      unit: second\n      requests_per_unit: -1\n", 6, 26, "not -1"},
		{"requests_per_unit fraction", head + "    rate_limit:\n      unit: second\n      requests_per_unit: 2.5\n", 6, 26, "not 2.5"},
		{"requests_per_unit above uint32", head + "    rate_limit:\n      unit: second\n      requests_per_unit: 4294967296\n", 6, 26, "from 0 to 4294967295"},
		{"requests_per_unit above 2^40", head + "    rate_limit:\n      unit: second\n      requests_per_unit: 1099511627777\n", 6, 26, "from 0 to 4294967295"},
		{"bool a number", head + "    shadow_mode: 1\n", 4, 18, "shadow_mode must be true or false, not 1"},
		{"bool quoted", head + "    rate_limit:\n      unlimited: \"yes\"\n", 5, 18, `unlimited must be true or false, not "yes"`},
		// throttlekit's additions.
		{"addition outside rate_limit", head + "    algorithm: gcra\n", 4, 5, "algorithm is valid only in a rate_limit block"},
		{"addition at the top", "domain: d\nlimits: [\"1/s\"]\n", 2, 1, "limits is valid only in a rate_limit block"},
		{"bad algorithm", head + "    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      algorithm: leaky\n", 7, 18, `algorithm must be aligned, fixed, gcra or sliding, not "leaky"`},
		{"burst without gcra", head + "    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      burst: 5\n", 7, 14, "burst applies to the gcra algorithm only, and this rule's is aligned"},
		{"burst with fixed", head + "    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      algorithm: fixed\n      burst: 5\n", 8, 14, "this rule's is fixed"},
		{"burst zero", head + "    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      algorithm: gcra\n      burst: 0\n", 8, 14, "burst must be from 1"},
		{"burst a word", head + "    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      algorithm: gcra\n      burst: many\n", 8, 14, "burst must be a whole number from 0 to 1099511627776"},
		{"burst above 2^40", head + "    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      algorithm: gcra\n      burst: 1099511627777\n", 8, 14, "burst must be a whole number"},
		{"burst when blocking", head + "    rate_limit:\n      unit: second\n      requests_per_unit: 0\n      algorithm: gcra\n      burst: 3\n", 8, 14, "burst has no effect when requests_per_unit is 0"},
		{"burst without unit", head + "    rate_limit:\n      limits: [\"1/s gcra\"]\n      burst: 3\n", 6, 14, "burst applies to the unit's limit, and there is no unit"},
		{"algorithm without unit", head + "    rate_limit:\n      limits: [\"1/s\"]\n      algorithm: gcra\n", 6, 18, "algorithm applies to the unit's limit, and there is no unit"},
		{"requests_per_unit without unit", head + "    rate_limit:\n      limits: [\"1/s\"]\n      requests_per_unit: 3\n", 6, 26, "requests_per_unit needs a unit"},
		{"bad limit", head + "    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      limits:\n        - 5/h\n        - ten/s\n", 9, 11, `limit "ten/s"`},
		{"limit not a string", head + "    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      limits: [10]\n", 7, 16, "a limit must be a string"},
		{"limits not a list", head + "    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      limits: 10/s\n", 7, 15, "limits must be a list"},
		{"limits with zero", head + "    rate_limit:\n      unit: second\n      requests_per_unit: 0\n      limits: [\"5/h\"]\n", 6, 26, "requests_per_unit 0 blocks every request and cannot be combined with limits"},
		{"limits with absent requests_per_unit", head + "    rate_limit:\n      unit: second\n      limits: [\"5/h\"]\n", 4, 5, "cannot be combined with limits"},
		{"limit duplicating the unit's", head + "    rate_limit:\n      unit: hour\n      requests_per_unit: 100\n      limits: [\"10/s\", \"5000/h aligned\"]\n", 7, 24, "limit 5000/h aligned has the same window and algorithm as 100/h aligned"},
		{"two listed limits alike", head + "    rate_limit:\n      limits:\n        - 10/s gcra\n        - 20/s gcra burst=40\n", 7, 11, "has the same window and algorithm"},
		{"named limits alike", head + "    rate_limit:\n      limits: [\"10/s name=a\", \"20/s name=b\"]\n", 5, 31, "has the same window and algorithm"},
		{"limit refused by throttler", head + "    rate_limit:\n      unit: year\n      requests_per_unit: 4000000000\n      algorithm: sliding\n", 4, 5, "rate_limit: throttlekit"},
		{"bad failure_mode", head + "    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      failure_mode: Local\n", 7, 21, `failure_mode must be open or closed, not "Local"`},
		{"addition with unlimited", head + "    rate_limit:\n      unlimited: true\n      failure_mode: open\n", 6, 7, "an unlimited rate_limit takes no failure_mode"},
		{"limits with unlimited", head + "    rate_limit:\n      unlimited: true\n      limits: [\"1/s\"]\n", 6, 7, "an unlimited rate_limit takes no limits"},
		// Files.
		{"two documents", "domain: d\n---\ndomain: e\n", 2, 1, "a file holds one YAML document"},
		{"merge key of a scalar", "domain: d\n<<: x\n", 2, 5, "a merge key (<<) takes a mapping or a list of mappings"},
		{"alias of nothing", "domain: *x\n", 0, 0, "YAML syntax error: unknown anchor 'x'"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := config.Parse([]config.File{{Name: "test.yaml", Data: []byte(tt.yaml)}})
			assert.Nil(t, cfg)
			assertConfigError(t, err, "test.yaml", tt.line, tt.column, tt.msg)
		})
	}
}

func TestErrorString(t *testing.T) {
	assert.Equal(t, "a.yaml:3:7: bad", (&config.Error{File: "a.yaml", Line: 3, Column: 7, Msg: "bad"}).Error())
	assert.Equal(t, "a.yaml:3: bad", (&config.Error{File: "a.yaml", Line: 3, Msg: "bad"}).Error())
	assert.Equal(t, "a.yaml: bad", (&config.Error{File: "a.yaml", Msg: "bad"}).Error())
	assert.ErrorIs(t, &config.Error{}, config.ErrInvalidConfig)

	_, err := config.Parse([]config.File{{Name: "x.yaml", Data: []byte("domain: d\nfoo: 1\n")}})
	assert.EqualError(t, err, `x.yaml:2:1: unknown key "foo"`)
}

func TestParseOptionErrors(t *testing.T) {
	_, err := config.Parse(nil, config.DefaultAlgorithm(throttler.Algorithm(42)))
	assert.ErrorIs(t, err, throttler.ErrInvalidOption)
	assert.False(t, errors.Is(err, config.ErrInvalidConfig))
	_, err = config.Parse(nil, nil)
	assert.ErrorIs(t, err, throttler.ErrInvalidOption)
}

// TestParseBounds checks the limits on the input's size and shape.
func TestParseBounds(t *testing.T) {
	t.Run("file over 4 MiB", func(t *testing.T) {
		data := []byte("domain: d\n# " + strings.Repeat("x", 4<<20) + "\n")
		_, err := config.Parse([]config.File{{Name: "big.yaml", Data: data}})
		assertConfigError(t, err, "big.yaml", 0, 0, "file is larger than 4194304 bytes")
	})
	t.Run("file of 4 MiB", func(t *testing.T) {
		data := []byte("domain: d\n# " + strings.Repeat("x", 4<<20-13) + "\n")
		require.Len(t, data, 4<<20)
		_, err := config.Parse([]config.File{{Name: "big.yaml", Data: data}})
		require.NoError(t, err)
	})
	nested := func(levels int) string {
		var b strings.Builder
		b.WriteString("domain: d\ndescriptors:\n")
		for i := 0; i < levels; i++ {
			ind := strings.Repeat("    ", i)
			b.WriteString(ind + "  - key: k\n")
			if i < levels-1 {
				b.WriteString(ind + "    descriptors:\n")
			} else {
				b.WriteString(ind + "    rate_limit: {unit: second, requests_per_unit: 1}\n")
			}
		}
		return b.String()
	}
	t.Run("32 levels", func(t *testing.T) {
		cfg := parse(t, nested(32))
		entries := make([]config.Entry, 32)
		for i := range entries {
			entries[i] = config.Entry{Key: "k", Value: "v"}
		}
		m := cfg.Lookup("d", entries)
		require.NotNil(t, m.Rule)
		assert.Equal(t, "d"+strings.Repeat(".k", 32), m.Rule.FullKey)
	})
	t.Run("33 levels", func(t *testing.T) {
		_, err := config.Parse([]config.File{{Name: "deep.yaml", Data: []byte(nested(33))}})
		assertConfigError(t, err, "deep.yaml", 2+2*32, 4*31+4+1, "descriptors nest deeper than 32 levels")
	})
	t.Run("deep YAML in an ignored value", func(t *testing.T) {
		data := "domain: d\nname: " + strings.Repeat("{name: ", 100) + "x" + strings.Repeat("}", 100) + "\n"
		_, err := config.Parse([]config.File{{Name: "deep.yaml", Data: []byte(data)}})
		assertConfigError(t, err, "deep.yaml", 2, -1, "YAML nests deeper than 72 levels")
	})
	t.Run("alias bomb", func(t *testing.T) {
		// Each level is a list of ten mappings whose replaces is the level
		// before: ten levels make 10^10 nodes once aliases are expanded.
		keys := []string{"replaces", "unit", "requests_per_unit", "unlimited", "shadow_mode", "quota_mode", "key", "value", "detailed_metric", "value_to_metric"}
		var b strings.Builder
		b.WriteString("domain: d\nname: &l0 [{name: x}]\n")
		for i, k := range keys {
			item := "{replaces: *l" + strconv.Itoa(i) + "}"
			b.WriteString(k + ": &l" + strconv.Itoa(i+1) + " [" + strings.TrimSuffix(strings.Repeat(item+", ", 10), ", ") + "]\n")
		}
		start := time.Now()
		_, err := config.Parse([]config.File{{Name: "bomb.yaml", Data: []byte(b.String())}})
		assertConfigError(t, err, "bomb.yaml", -1, -1, "file expands to more than 4194304 YAML nodes")
		t.Logf("refused in %v", time.Since(start))
	})
}
