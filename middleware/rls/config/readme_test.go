package config_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/middleware/rls/config"
)

// load parses one file of testdata/envoy-readme.
func load(t *testing.T, name string, opts ...config.Option) *config.Config {
	t.Helper()
	path := filepath.Join("testdata", "envoy-readme", name)
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	cfg, err := config.Parse([]config.File{{Name: path, Data: data}}, opts...)
	require.NoError(t, err)
	return cfg
}

// d builds a descriptor from alternating keys and values.
func d(kv ...string) []config.Entry {
	var out []config.Entry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, config.Entry{Key: kv[i], Value: kv[i+1]})
	}
	return out
}

// want is what a lookup should find; an empty FullKey means no rule.
type want struct {
	FullKey         string
	Unit            string
	RequestsPerUnit uint32
	Unlimited       bool
	Shadow          bool
	Blocks          bool
	Name            string
	Replaces        []string
	MetricKey       string
	CacheKey        string
}

// check asserts one lookup against w.
func check(t *testing.T, cfg *config.Config, domain string, entries []config.Entry, w want) {
	t.Helper()
	m := cfg.Lookup(domain, entries)
	if w.FullKey == "" {
		assert.Nil(t, m.Rule, "%v", entries)
		assert.Equal(t, config.Match{}, m)
		return
	}
	require.NotNil(t, m.Rule, "%v", entries)
	r := m.Rule
	assert.Equal(t, w.FullKey, r.FullKey, "FullKey")
	assert.Equal(t, w.Unit, r.Unit, "Unit")
	assert.Equal(t, w.RequestsPerUnit, r.RequestsPerUnit, "RequestsPerUnit")
	assert.Equal(t, w.Unlimited, r.Unlimited, "Unlimited")
	assert.Equal(t, w.Shadow, r.ShadowMode, "ShadowMode")
	assert.Equal(t, w.Blocks, r.Blocks, "Blocks")
	assert.Equal(t, w.Name, r.Name, "Name")
	assert.Equal(t, w.Replaces, r.Replaces, "Replaces")
	assert.Equal(t, w.MetricKey, m.MetricKey, "MetricKey")
	assert.Equal(t, w.CacheKey, m.CacheKey, "CacheKey")
	switch {
	case r.Unlimited || r.Blocks:
		assert.Nil(t, r.Limits)
		assert.Nil(t, r.Policy)
	default:
		require.NotEmpty(t, r.Limits)
		require.NotNil(t, r.Policy)
		assert.Equal(t, int64(r.RequestsPerUnit), r.Limits[0].Max)
	}
}

// TestEnvoyReadmeExamples loads each configuration example of envoy
// ratelimit's README and checks what it says of its descriptors.
func TestEnvoyReadmeExamples(t *testing.T) {
	type lookup struct {
		entries []config.Entry
		want    want
	}
	tests := []struct {
		file, domain string
		lookups      []lookup
	}{
		{"example1.yaml", "mongo_cps", []lookup{
			{d("database", "users"), want{FullKey: "mongo_cps.database_users", Unit: "second", RequestsPerUnit: 500,
				MetricKey: "mongo_cps.database_users", CacheKey: "mongo_cps_database_users"}},
			{d("database", "default"), want{FullKey: "mongo_cps.database_default", Unit: "second", RequestsPerUnit: 500,
				MetricKey: "mongo_cps.database_default", CacheKey: "mongo_cps_database_default"}},
			{d("database", "orders"), want{}},
			{d("database", "users", "table", "x"), want{}},
		}},
		{"example2.yaml", "messaging", []lookup{
			// 5 a day per number for marketing messages, each number its own counter.
			{d("message_type", "marketing", "to_number", "2061111111"), want{FullKey: "messaging.message_type_marketing.to_number",
				Unit: "day", RequestsPerUnit: 5, MetricKey: "messaging.message_type_marketing.to_number",
				CacheKey: "messaging_message_type_marketing_to_number_2061111111"}},
			{d("message_type", "marketing", "to_number", "2062222222"), want{FullKey: "messaging.message_type_marketing.to_number",
				Unit: "day", RequestsPerUnit: 5, MetricKey: "messaging.message_type_marketing.to_number",
				CacheKey: "messaging_message_type_marketing_to_number_2062222222"}},
			// 100 a day to any number.
			{d("to_number", "2061111111"), want{FullKey: "messaging.to_number", Unit: "day", RequestsPerUnit: 100,
				MetricKey: "messaging.to_number", CacheKey: "messaging_to_number_2061111111"}},
			// The placeholder has no limit of its own.
			{d("message_type", "marketing"), want{}},
			{d("message_type", "transactional", "to_number", "2061111111"), want{}},
		}},
		{"example3.yaml", "edge_proxy_per_ip", []lookup{
			{d("remote_address", "50.0.0.1"), want{FullKey: "edge_proxy_per_ip.remote_address", Unit: "second", RequestsPerUnit: 10,
				MetricKey: "edge_proxy_per_ip.remote_address", CacheKey: "edge_proxy_per_ip_remote_address_50.0.0.1"}},
			// The most specific match wins: the black-listed address.
			{d("remote_address", "50.0.0.5"), want{FullKey: "edge_proxy_per_ip.remote_address_50.0.0.5", Unit: "second", Blocks: true,
				MetricKey: "edge_proxy_per_ip.remote_address_50.0.0.5", CacheKey: "edge_proxy_per_ip_remote_address_50.0.0.5"}},
		}},
		{"example4.yaml", "example4", []lookup{
			{d("key", "value", "subkey", "subvalue"), want{}}, // two tuples, a rule at the first level
			{d("key", "value"), want{FullKey: "example4.key_value", Unit: "second", RequestsPerUnit: 300,
				MetricKey: "example4.key_value", CacheKey: "example4_key_value"}},
		}},
		{"example4_nested.yaml", "example4", []lookup{
			{d("key", "value", "subkey", "subvalue"), want{FullKey: "example4.key_value.subkey", Unit: "second", RequestsPerUnit: 300,
				MetricKey: "example4.key_value.subkey", CacheKey: "example4_key_value_subkey_subvalue"}},
			{d("key", "value"), want{}},
		}},
		{"example5.yaml", "internal", []lookup{
			{d("ldap", "cn=admin"), want{FullKey: "internal.ldap", Unlimited: true,
				MetricKey: "internal.ldap", CacheKey: "internal_ldap_cn=admin"}},
			{d("azure", "blob"), want{FullKey: "internal.azure", Unit: "minute", RequestsPerUnit: 100,
				MetricKey: "internal.azure", CacheKey: "internal_azure_blob"}},
			{d("aws", "s3"), want{}},
		}},
		{"example6.yaml", "example6", []lookup{
			{d("service", "auth-service", "user", "user-a"), want{FullKey: "example6.service.user_user-a", Unit: "second",
				RequestsPerUnit: 10, Shadow: true, MetricKey: "example6.service.user_user-a",
				CacheKey: "example6_service_auth-service_user_user-a"}},
			{d("service", "auth-service", "user", "user-b"), want{FullKey: "example6.service.user_user-b", Unit: "second",
				RequestsPerUnit: 20, MetricKey: "example6.service.user_user-b",
				CacheKey: "example6_service_auth-service_user_user-b"}},
			{d("service", "auth-service", "user", "user-c"), want{}},
		}},
		{"example7.yaml", "example7", []lookup{
			{d("key_1", "value_1", "user", "bkthomps"), want{FullKey: "example7.key_1_value_1.user_bkthomps", Unit: "second",
				RequestsPerUnit: 5, Name: "specific_limit", MetricKey: "example7.key_1_value_1.user_bkthomps",
				CacheKey: "example7_key_1_value_1_user_bkthomps"}},
			{d("key_2", "value_2", "user", "bkthomps"), want{FullKey: "example7.key_2_value_2.user_bkthomps", Unit: "second",
				RequestsPerUnit: 10, Replaces: []string{"specific_limit"}, MetricKey: "example7.key_2_value_2.user_bkthomps",
				CacheKey: "example7_key_2_value_2_user_bkthomps"}},
		}},
		{"example8.yaml", "example8", []lookup{
			{d("key1", "unspecified_value"), want{FullKey: "example8.key1", Unit: "minute", RequestsPerUnit: 10,
				MetricKey: "example8.key1_unspecified_value", CacheKey: "example8_key1_unspecified_value"}},
			{d("key1", "unspecified_value2"), want{FullKey: "example8.key1", Unit: "minute", RequestsPerUnit: 10,
				MetricKey: "example8.key1_unspecified_value2", CacheKey: "example8_key1_unspecified_value2"}},
			{d("key1", "value1"), want{FullKey: "example8.key1_value1", Unit: "minute", RequestsPerUnit: 20,
				MetricKey: "example8.key1_value1", CacheKey: "example8_key1_value1"}},
		}},
		{"example9.yaml", "example9", []lookup{
			{d("key1", "value_1"), want{FullKey: "example9.key1_value*", Unit: "minute", RequestsPerUnit: 20,
				MetricKey: "example9.key1_value*", CacheKey: "example9_key1_value_1"}},
			{d("key1", "value_2"), want{FullKey: "example9.key1_value*", Unit: "minute", RequestsPerUnit: 20,
				MetricKey: "example9.key1_value*", CacheKey: "example9_key1_value_2"}},
			{d("key1", "other"), want{}},
		}},
		{"example10.yaml", "example10", []lookup{
			{d("route", "api", "http_method", "GET", "subject_id", "123"), want{FullKey: "example10.route.http_method.subject_id",
				Unit: "minute", RequestsPerUnit: 60, MetricKey: "example10.route_api.http_method_GET.subject_id",
				CacheKey: "example10_route_api_http_method_GET_subject_id_123"}},
			{d("route", "web", "http_method", "POST", "subject_id", "456"), want{FullKey: "example10.route.http_method.subject_id",
				Unit: "minute", RequestsPerUnit: 60, MetricKey: "example10.route_web.http_method_POST.subject_id",
				CacheKey: "example10_route_web_http_method_POST_subject_id_456"}},
		}},
		{"example10_wildcard.yaml", "example10_wildcard", []lookup{
			{d("user", "alice", "action", "readfile", "resource", "documents"), want{FullKey: "example10_wildcard.user.action_read*.resource",
				Unit: "minute", RequestsPerUnit: 100, MetricKey: "example10_wildcard.user_alice.action_readfile.resource",
				CacheKey: "example10_wildcard_user_alice_action_readfile_resource_documents"}},
			{d("user", "alice", "action", "write", "resource", "documents"), want{}},
		}},
		{"example11.yaml", "example11", []lookup{
			// One counter for every files/* value.
			{d("files", "files/a.pdf"), want{FullKey: "example11.files_files/*", Unit: "hour", RequestsPerUnit: 10,
				MetricKey: "example11.files_files/*", CacheKey: "example11_files_files/*"}},
			{d("files", "files/b.csv"), want{FullKey: "example11.files_files/*", Unit: "hour", RequestsPerUnit: 10,
				MetricKey: "example11.files_files/*", CacheKey: "example11_files_files/*"}},
			// One counter per value without share_threshold.
			{d("files_no_share", "files_no_share/a.pdf"), want{FullKey: "example11.files_no_share_files_no_share/*", Unit: "hour",
				RequestsPerUnit: 10, MetricKey: "example11.files_no_share_files_no_share/*",
				CacheKey: "example11_files_no_share_files_no_share/a.pdf"}},
			{d("files_no_share", "files_no_share/b.csv"), want{FullKey: "example11.files_no_share_files_no_share/*", Unit: "hour",
				RequestsPerUnit: 10, MetricKey: "example11.files_no_share_files_no_share/*",
				CacheKey: "example11_files_no_share_files_no_share/b.csv"}},
		}},
		{"example11_metrics.yaml", "example11_metrics", []lookup{
			// The README gives "example11_metrics.route_api.method_GET" here;
			// envoy ratelimit's GetLimit (and its own test of this
			// configuration, TestShareThreshold) gives the shared wildcard
			// with its '*', and the method key without its value, which
			// is what the service must report.
			{d("route", "api/v1", "method", "GET"), want{FullKey: "example11_metrics.route_api/*.method", Unit: "minute",
				RequestsPerUnit: 60, MetricKey: "example11_metrics.route_api/*.method",
				CacheKey: "example11_metrics_route_api/*_method_GET"}},
			{d("route", "api/v2", "method", "POST"), want{FullKey: "example11_metrics.route_api/*.method", Unit: "minute",
				RequestsPerUnit: 60, MetricKey: "example11_metrics.route_api/*.method",
				CacheKey: "example11_metrics_route_api/*_method_POST"}},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			cfg := load(t, tt.file)
			assert.Equal(t, []string{tt.domain}, cfg.Domains())
			assert.True(t, cfg.HasDomain(tt.domain))
			for _, l := range tt.lookups {
				check(t, cfg, tt.domain, l.entries, l.want)
			}
		})
	}
}

// TestEnvoyReadmeAllLoad loads every example at once: their domains are
// distinct but for Example 4's two variants.
func TestEnvoyReadmeAllLoad(t *testing.T) {
	paths, err := filepath.Glob(filepath.Join("testdata", "envoy-readme", "*.yaml"))
	require.NoError(t, err)
	require.Len(t, paths, 14)
	var files []config.File
	for _, p := range paths {
		if filepath.Base(p) == "example4_nested.yaml" {
			continue
		}
		data, err := os.ReadFile(p)
		require.NoError(t, err)
		files = append(files, config.File{Name: p, Data: data})
	}
	cfg, err := config.Parse(files)
	require.NoError(t, err)
	assert.Len(t, cfg.Domains(), 13)
	assert.Len(t, cfg.Rules(), 21)
}
