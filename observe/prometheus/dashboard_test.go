package promobserver_test

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/backend/breaker"
	memorybackend "github.com/throttlekit/throttlekit/backend/memory"
	"github.com/throttlekit/throttlekit/internal/testkit"
	promobserver "github.com/throttlekit/throttlekit/observe/prometheus"
	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler"
)

// dashboard is the Grafana dashboard shipped over these metrics.
const dashboard = "../../deploy/grafana/throttlekit.json"

var (
	metricName = regexp.MustCompile(`\bthrottlekit_[a-z_]+\b`)
	selector   = regexp.MustCompile(`\b(throttlekit_[a-z_]+)\{([^}]*)\}`)
	matcher    = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)
	grouping   = regexp.MustCompile(`\bby \(([^)]*)\)`)
)

// TestDashboardQueriesExportedMetrics reads every query of the dashboard
// and checks that each metric it names is one the collector exports, with
// the labels the query selects and groups by.
func TestDashboardQueriesExportedMetrics(t *testing.T) {
	raw, err := os.ReadFile(dashboard)
	require.NoError(t, err)
	var doc any
	require.NoError(t, json.Unmarshal(raw, &doc))
	var queries []string
	var walk func(v any, key string)
	walk = func(v any, key string) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				walk(x, k)
			}
		case []any:
			for _, x := range v {
				walk(x, key)
			}
		case string:
			if (key == "expr" || key == "query" || key == "definition") && strings.Contains(v, "throttlekit_") {
				queries = append(queries, v)
			}
		}
	}
	walk(doc, "")
	require.NotEmpty(t, queries)

	exported := exportedLabels(t)
	used := map[string]bool{}
	for _, q := range queries {
		names := metricName.FindAllString(q, -1)
		require.NotEmpty(t, names, q)
		labelsInQuery := map[string]bool{"le": true}
		for _, n := range names {
			base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(n, "_bucket"), "_sum"), "_count")
			if _, ok := exported[n]; ok {
				base = n
			}
			ls, ok := exported[base]
			if !assert.True(t, ok, "query %q reads %s, which the collector does not export", q, n) {
				continue
			}
			used[base] = true
			for l := range ls {
				labelsInQuery[l] = true
			}
		}
		for _, m := range selector.FindAllStringSubmatch(q, -1) {
			base := strings.TrimSuffix(m[1], "_bucket")
			for _, lm := range matcher.FindAllStringSubmatch(m[2], -1) {
				assert.True(t, exported[base][lm[1]], "query %q selects label %s, which %s does not have", q, lm[1], base)
			}
		}
		for _, g := range grouping.FindAllStringSubmatch(q, -1) {
			for _, l := range strings.Split(g[1], ",") {
				l = strings.TrimSpace(l)
				assert.True(t, labelsInQuery[l], "query %q groups by %s, which none of its metrics has", q, l)
			}
		}
	}
	// The dashboard shows every metric the collector exports: decisions,
	// near limit, latency, errors, breakers, the rollout and quota gauges.
	for name := range exported {
		assert.True(t, used[name], "the dashboard shows nothing of %s", name)
	}
}

// exportedLabels returns every metric family the collector exports, with
// its label names, after traffic that makes each of them appear.
func exportedLabels(t *testing.T) map[string]map[string]bool {
	t.Helper()
	down := failing{err: syscall.ECONNREFUSED}
	guarded, err := breaker.Wrap(down, "127.0.0.1:1", breaker.WithLogger(nil))
	require.NoError(t, err)
	src, err := rollout.NewStaticSource(50)
	require.NoError(t, err)
	ro, err := rollout.New(memorybackend.New(), memorybackend.New(), src)
	require.NoError(t, err)
	quota := testkit.Throttler(t, memorybackend.New())
	c, err := promobserver.New(promobserver.WithBreakers(guarded.Breakers), promobserver.WithRollout("main", ro),
		promobserver.WithQuotaGauge(quota, testkit.Policy(t, "partner", "300/min"), "partner:acme"))
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(c))
	ctx := context.Background()
	p := testkit.Policy(t, "api", "1/min")
	for _, b := range []*throttler.Throttler{
		testkit.Throttler(t, ro, throttler.WithObserver(c)),
		testkit.Throttler(t, guarded, throttler.WithObserver(c), throttler.WithLogger(nil)),
	} {
		for range 2 {
			_, err := b.Allow(ctx, p, "x")
			require.NoError(t, err)
		}
	}
	families, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]map[string]bool{}
	for _, f := range families {
		ls := map[string]bool{}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				ls[l.GetName()] = true
			}
		}
		out[f.GetName()] = ls
	}
	return out
}
