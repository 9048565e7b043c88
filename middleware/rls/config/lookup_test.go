package config_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/middleware/rls/config"
)

// parse parses one in-memory file named "test.yaml".
func parse(t *testing.T, yaml string, opts ...config.Option) *config.Config {
	t.Helper()
	cfg, err := config.Parse([]config.File{{Name: "test.yaml", Data: []byte(yaml)}}, opts...)
	require.NoError(t, err)
	return cfg
}

// keys is the part of a Match these tests compare: the rule's FullKey
// ("" for none), MetricKey and CacheKey.
type keys struct{ Rule, Metric, Cache string }

func keysOf(m config.Match) keys {
	if m.Rule == nil {
		return keys{}
	}
	return keys{m.Rule.FullKey, m.MetricKey, m.CacheKey}
}

func TestLookupMatchingOrder(t *testing.T) {
	cfg := parse(t, `
domain: d
descriptors:
  - key: path
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: /api/*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: path
    value: /api/v1/*
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: path
    value: /api/v1/users
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: "user*"
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: ip
    value: "*"
    rate_limit: {unit: second, requests_per_unit: 6}
`)
	tests := []struct {
		name    string
		entries []config.Entry
		want    keys
	}{
		{"key_value first", d("path", "/api/v1/users"), keys{"d.path_/api/v1/users", "d.path_/api/v1/users", "d_path_/api/v1/users"}},
		{"first wildcard in file order, not the longest", d("path", "/api/v1/orders"), keys{"d.path_/api/*", "d.path_/api/*", "d_path_/api/v1/orders"}},
		{"key alone last", d("path", "/static/x.css"), keys{"d.path", "d.path", "d_path_/static/x.css"}},
		{"a value equal to a wildcard matches it exactly", d("path", "/api/*"), keys{"d.path_/api/*", "d.path_/api/*", "d_path_/api/*"}},
		{"empty value, key alone", d("path", ""), keys{"d.path", "d.path", "d_path_"}},
		// A wildcard in the key matches key_value by prefix; envoy's
		// metric key then appends the wildcard to the request's key.
		{"wildcard key", d("username", "bob"), keys{"d.user*", "d.username_user*", "d_username_bob"}},
		{"wildcard key, exact key", d("user", "bob"), keys{"d.user*", "d.user_user*", "d_user_bob"}},
		{"value *", d("ip", "10.0.0.1"), keys{"d.ip_*", "d.ip_*", "d_ip_10.0.0.1"}},
		{"value * matches the empty value", d("ip", ""), keys{"d.ip_*", "d.ip_*", "d_ip_"}},
		{"unknown key", d("host", "a"), keys{}},
		{"case matters", d("Path", "/x"), keys{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, keysOf(cfg.Lookup("d", tt.entries)))
		})
	}
	assert.Equal(t, config.Match{}, cfg.Lookup("other", d("path", "/x")), "unknown domain")
	assert.Equal(t, config.Match{}, cfg.Lookup("d", nil), "no entries")
}

func TestLookupNestedDepth(t *testing.T) {
	cfg := parse(t, `
domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1}
    descriptors:
      - key: b
        rate_limit: {unit: second, requests_per_unit: 2}
        descriptors:
          - key: c
            value: "1"
            rate_limit: {unit: second, requests_per_unit: 3}
  - key: leaf
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: mid
    descriptors:
      - key: x
`)
	tests := []struct {
		name    string
		entries []config.Entry
		want    string // FullKey, "" for none
	}{
		{"level 1", d("a", "1"), "d.a"},
		{"level 2", d("a", "1", "b", "2"), "d.a.b"},
		{"level 3", d("a", "1", "b", "2", "c", "1"), "d.a.b.c_1"},
		{"level 3, no match there", d("a", "1", "b", "2", "c", "2"), ""},
		{"deeper than the tree", d("a", "1", "b", "2", "c", "1", "e", "1"), ""},
		{"a leaf stops the walk", d("leaf", "1", "x", "1"), ""},
		{"a missing level stops it", d("a", "1", "z", "1", "c", "1"), ""},
		{"a node without a rule", d("mid", "1"), ""},
		{"a leaf without a rule", d("mid", "1", "x", "1"), ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, keysOf(cfg.Lookup("d", tt.entries)).Rule)
		})
	}
}

// TestLookupShareThreshold checks the cache and metric keys of
// share_threshold, at one level and nested, alone and with the other
// metric flags.
func TestLookupShareThreshold(t *testing.T) {
	cfg := parse(t, `
domain: d
descriptors:
  - key: file
    value: report
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: file
    value: rep*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: tenant
    value: t/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: svc
    value: svc/*
    share_threshold: true
    descriptors:
      - key: endpoint
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 80}
  - key: path
    value: p/*
    share_threshold: true
    descriptors:
      - key: file
        value: f/*
        descriptors:
          - key: type
            rate_limit: {unit: minute, requests_per_unit: 120}
  - key: path
    value: q/*
    share_threshold: true
    descriptors:
      - key: path
        value: r/*
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 130}
  - key: vtm
    value: v/*
    value_to_metric: true
    rate_limit: {unit: minute, requests_per_unit: 140}
`)
	tests := []struct {
		name    string
		entries []config.Entry
		want    keys
	}{
		{"explicit value wins, own counter", d("file", "report"),
			keys{"d.file_report", "d.file_report", "d_file_report"}},
		{"shared counter", d("file", "reports"),
			keys{"d.file_rep*", "d.file_rep*", "d_file_rep*"}},
		{"shared counter, other value", d("file", "repo"),
			keys{"d.file_rep*", "d.file_rep*", "d_file_rep*"}},
		{"share_threshold wins over value_to_metric", d("tenant", "t/acme", "method", "GET"),
			keys{"d.tenant_t/*.method", "d.tenant_t/*.method", "d_tenant_t/*_method_GET"}},
		{"detailed_metric keeps the shared wildcard", d("svc", "svc/users", "endpoint", "get"),
			keys{"d.svc_svc/*.endpoint", "d.svc_svc/*.endpoint_get", "d_svc_svc/*_endpoint_get"}},
		{"only the share_threshold level is shared", d("path", "p/x", "file", "f/doc", "type", "pdf"),
			keys{"d.path_p/*.file_f/*.type", "d.path_p/*.file_f/*.type", "d_path_p/*_file_f/doc_type_pdf"}},
		{"two shared levels of one key", d("path", "q/1", "path", "r/2"),
			keys{"d.path_q/*.path_r/*", "d.path_q/*.path_r/*", "d_path_q/*_path_r/*"}},
		{"value_to_metric through a wildcard shows the whole value", d("vtm", "v/42"),
			keys{"d.vtm_v/*", "d.vtm_v/42", "d_vtm_v/42"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := cfg.Lookup("d", tt.entries)
			assert.Equal(t, tt.want, keysOf(m))
		})
	}
	r := cfg.Lookup("d", d("file", "reports")).Rule
	require.NotNil(t, r)
	assert.True(t, r.ShareThreshold)
}

func TestLookupMetricFlags(t *testing.T) {
	cfg := parse(t, `
domain: d
descriptors:
  - key: user
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: route
    value_to_metric: true
    descriptors:
      - key: method
        value: GET
        descriptors:
          - key: id
            detailed_metric: true
            rate_limit: {unit: second, requests_per_unit: 2}
      - key: method
        descriptors:
          - key: id
            value_to_metric: true
            rate_limit: {unit: second, requests_per_unit: 3}
  - key: both
    value_to_metric: true
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 4}
`)
	tests := []struct {
		name    string
		entries []config.Entry
		want    keys
	}{
		{"detailed_metric", d("user", "alice"), keys{"d.user", "d.user_alice", "d_user_alice"}},
		{"detailed_metric, empty value", d("user", ""), keys{"d.user", "d.user_", "d_user_"}},
		{"detailed_metric shows every value on the path", d("route", "r1", "method", "GET", "id", "7"),
			keys{"d.route.method_GET.id", "d.route_r1.method_GET.id_7", "d_route_r1_method_GET_id_7"}},
		{"value_to_metric per level", d("route", "r1", "method", "PUT", "id", "7"),
			keys{"d.route.method.id", "d.route_r1.method.id_7", "d_route_r1_method_PUT_id_7"}},
		{"value_to_metric, empty value", d("route", "", "method", "PUT", "id", "7"),
			keys{"d.route.method.id", "d.route.method.id_7", "d_route__method_PUT_id_7"}},
		{"detailed_metric wins", d("both", "x"), keys{"d.both", "d.both_x", "d_both_x"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, keysOf(cfg.Lookup("d", tt.entries)))
		})
	}
}

func TestMergeDomains(t *testing.T) {
	a := config.File{Name: "a.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: k1\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: w\n    value: x*\n    rate_limit: {unit: second, requests_per_unit: 3}\n")}
	b := config.File{Name: "b.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: k2\n    rate_limit: {unit: second, requests_per_unit: 2}\n  - key: w\n    value: xy*\n    rate_limit: {unit: second, requests_per_unit: 4}\n")}
	dup := config.File{Name: "c.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: k1\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")}
	other := config.File{Name: "e.yaml", Data: []byte("domain: e\n")}

	_, err := config.Parse([]config.File{a, b})
	assertConfigError(t, err, "b.yaml", 1, 9, `domain "d" is also defined in a.yaml (at line 1)`)

	_, err = config.Parse([]config.File{a, b}, config.MergeDomains(false))
	assertConfigError(t, err, "b.yaml", 1, 9, `domain "d" is also defined in a.yaml`)

	cfg, err := config.Parse([]config.File{a, other, b}, config.MergeDomains(true))
	require.NoError(t, err)
	assert.Equal(t, []string{"d", "e"}, cfg.Domains())
	assert.Equal(t, "d.k1", cfg.Lookup("d", d("k1", "v")).Rule.FullKey)
	k2 := cfg.Lookup("d", d("k2", "v")).Rule
	require.NotNil(t, k2)
	assert.Equal(t, "b.yaml", k2.File)
	assert.Equal(t, 4, k2.Line)
	// Wildcards keep the order of the files: a.yaml's x* comes first.
	assert.Equal(t, "d.w_x*", cfg.Lookup("d", d("w", "xyz")).Rule.FullKey)

	_, err = config.Parse([]config.File{a, dup}, config.MergeDomains(true))
	assertConfigError(t, err, "c.yaml", 3, 5, `descriptor "d.k1" is defined twice at this level (first in a.yaml at line 3)`)
}

func TestConfigAccessors(t *testing.T) {
	cfg, err := config.Parse([]config.File{
		{Name: "z.yaml", Data: []byte("domain: zeta\ndescriptors:\n  - key: b\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n")},
		{Name: "a.yaml", Data: []byte("domain: alpha\ndescriptors:\n  - key: x\n    descriptors:\n      - key: y\n        rate_limit: {unit: second, requests_per_unit: 1}\n")},
	})
	require.NoError(t, err)
	assert.Equal(t, []string{"alpha", "zeta"}, cfg.Domains())
	var full []string
	for _, r := range cfg.Rules() {
		full = append(full, r.FullKey)
	}
	assert.Equal(t, []string{"alpha.x.y", "zeta.a", "zeta.b"}, full)
	assert.True(t, cfg.HasDomain("alpha"))
	assert.False(t, cfg.HasDomain("beta"))

	// The slices returned are copies.
	cfg.Domains()[0] = "changed"
	cfg.Rules()[0] = nil
	assert.Equal(t, "alpha", cfg.Domains()[0])
	assert.NotNil(t, cfg.Rules()[0])

	empty, err := config.Parse(nil)
	require.NoError(t, err)
	assert.Empty(t, empty.Domains())
	assert.Empty(t, empty.Rules())
	assert.Equal(t, config.Match{}, empty.Lookup("d", d("k", "v")))
}

func TestLookupConcurrent(t *testing.T) {
	cfg := load(t, "example11.yaml")
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 1000; i++ {
				m := cfg.Lookup("example11", d("files", "files/a.pdf"))
				if m.CacheKey != "example11_files_files/*" {
					t.Errorf("CacheKey %q", m.CacheKey)
					return
				}
				_ = cfg.Rules()
				_ = cfg.Domains()
			}
		}()
	}
	wg.Wait()
}

func BenchmarkLookup(b *testing.B) {
	cfg, err := config.Parse([]config.File{{Name: "b.yaml", Data: []byte(`
domain: d
descriptors:
  - key: tenant
    descriptors:
      - key: path
        value: /api/*
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 100}
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 10}
`)}})
	if err != nil {
		b.Fatal(err)
	}
	for _, bc := range []struct {
		name    string
		entries []config.Entry
	}{
		{"wildcard", d("tenant", "acme", "path", "/api/users")},
		{"key", d("tenant", "acme", "path", "/static/app.js")},
		{"miss", d("user", "bob")},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				_ = cfg.Lookup("d", bc.entries)
			}
		})
	}
}
