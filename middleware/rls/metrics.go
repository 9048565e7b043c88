package rls

import (
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics holds envoy ratelimit's statistics under the names its
// Prometheus mapping gives them, so that dashboards and alerts written for
// envoy ratelimit read the service unchanged:
//
//	ratelimit_service_rate_limit_total_hits{domain, key1, key2}    hits, counted by hits_addend
//	ratelimit_service_rate_limit_within_limit{domain, key1, key2}  hits allowed
//	ratelimit_service_rate_limit_near_limit{domain, key1, key2}    hits past the near-limit ratio
//	ratelimit_service_rate_limit_over_limit{domain, key1, key2}    hits over the limit
//	ratelimit_service_rate_limit_shadow_mode{domain, key1, key2}   over-limit hits a shadow rule let pass
//	ratelimit_service_should_rate_limit_error{err_type}             requests refused with an error
//	ratelimit_service_config_load_success                           configurations loaded
//	ratelimit_service_config_load_error                             configurations refused
//	ratelimit_service_global_shadow_mode                            verdicts the global shadow mode overrode
//
// key1 is the rule's first level (key, or key_value), key2 the rest of its
// statistics key joined with '.', empty for a rule of one level. The
// throttler's own metrics (observe/prometheus) sit beside these.
type Metrics struct {
	totalHits, withinLimit, nearLimit, overLimit, shadowMode *prometheus.CounterVec

	errors                    *prometheus.CounterVec
	configSuccess, configFail prometheus.Counter
	globalShadowCount         prometheus.Counter

	// rules caches each statistics key's counters, so a decision costs
	// atomic adds and no label hashing.
	rules sync.Map
}

// ruleCounters are one statistics key's counters.
type ruleCounters struct {
	totalHits, withinLimit, nearLimit, overLimit, shadowMode prometheus.Counter
}

// NewMetrics registers the service's metrics with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	if reg == nil {
		return nil, fmt.Errorf("%w: nil registerer", ErrInvalidOption)
	}
	labels := []string{"domain", "key1", "key2"}
	vec := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "ratelimit_service_rate_limit_" + name, Help: help}, labels)
	}
	m := &Metrics{
		totalHits:   vec("total_hits", "Hits a rule received, counted by hits_addend."),
		withinLimit: vec("within_limit", "Hits a rule allowed."),
		nearLimit:   vec("near_limit", "Hits past the rule's near-limit ratio but within its limit."),
		overLimit:   vec("over_limit", "Hits over the rule's limit."),
		shadowMode:  vec("shadow_mode", "Over-limit hits a shadow_mode rule let pass."),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ratelimit_service_should_rate_limit_error",
			Help: "Requests answered with an error, by kind.",
		}, []string{"err_type"}),
		configSuccess: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_service_config_load_success", Help: "Configurations loaded."}),
		configFail: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_service_config_load_error", Help: "Configurations refused; the previous one stays in force."}),
		globalShadowCount: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "ratelimit_service_global_shadow_mode", Help: "Over-limit verdicts the global shadow mode answered OK."}),
	}
	for _, c := range []prometheus.Collector{m.totalHits, m.withinLimit, m.nearLimit, m.overLimit, m.shadowMode,
		m.errors, m.configSuccess, m.configFail, m.globalShadowCount} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidOption, err)
		}
	}
	return m, nil
}

// ConfigLoadFailed counts a configuration the service refused.
func (m *Metrics) ConfigLoadFailed() { m.configFail.Inc() }

func (m *Metrics) configLoaded() { m.configSuccess.Inc() }

func (m *Metrics) globalShadow() { m.globalShadowCount.Inc() }

// requestError counts a request answered with an error.
func (m *Metrics) requestError(err error) {
	kind := "internal"
	switch {
	case errors.Is(err, ErrInvalidRequest):
		kind = "invalid_request"
	case errors.Is(err, ErrUnknownDomain):
		kind = "unknown_domain"
	case errors.Is(err, ErrNoConfig):
		kind = "no_config"
	case errors.Is(err, ErrStoreUnavailable):
		kind = "store_unavailable"
	}
	m.errors.WithLabelValues(kind).Inc()
}

// counters returns the counters of an item's statistics key.
func (m *Metrics) counters(key string) *ruleCounters {
	if c, ok := m.rules.Load(key); ok {
		return c.(*ruleCounters)
	}
	domain, rest, _ := strings.Cut(key, ".")
	key1, key2, _ := strings.Cut(rest, ".")
	labels := []string{domain, key1, key2}
	c := &ruleCounters{
		totalHits:   m.totalHits.WithLabelValues(labels...),
		withinLimit: m.withinLimit.WithLabelValues(labels...),
		nearLimit:   m.nearLimit.WithLabelValues(labels...),
		overLimit:   m.overLimit.WithLabelValues(labels...),
		shadowMode:  m.shadowMode.WithLabelValues(labels...),
	}
	actual, _ := m.rules.LoadOrStore(key, c)
	return actual.(*ruleCounters)
}

// unlimited counts a hit of an unlimited rule.
func (m *Metrics) unlimited(it *item) {
	m.counters(it.match.MetricKey).totalHits.Add(float64(it.cost))
}

// record counts one decided hit of cost units as envoy ratelimit does:
// limit is the binding limit's quota, used its count after the decision.
// A hit over the limit counts, of its units, those past the limit as
// over_limit (and, in a shadow rule, shadow_mode) and those between the
// near-limit threshold and the limit as near_limit; an allowed hit counts
// its units past the threshold as near_limit and all of them as
// within_limit.
func (m *Metrics) record(it *item, limit, used int64, allowed bool, ratio float64) {
	c := m.counters(it.match.MetricKey)
	cost := it.cost
	c.totalHits.Add(float64(cost))
	if cost == 0 {
		return
	}
	near := int64(float64(limit) * ratio)
	if allowed {
		c.withinLimit.Add(float64(cost))
		before := used - cost
		if used > near {
			c.nearLimit.Add(float64(used - max(near, before)))
		}
		return
	}
	// Denied: throttlekit spent nothing, so the count before the hit is
	// used, and after it used+cost.
	before, after := used, used+cost
	over := cost
	if before < limit {
		over = after - limit
		c.nearLimit.Add(float64(limit - max(near, before)))
	}
	c.overLimit.Add(float64(over))
	if it.shadow {
		c.shadowMode.Add(float64(over))
	}
}
