package promobserver

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/throttlekit/throttlekit/backend/breaker"
	"github.com/throttlekit/throttlekit/observe"
	"github.com/throttlekit/throttlekit/observe/internal/metricsconfig"
	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler"
)

// DefaultNearLimit is the fraction of a limit's quota under which an
// allowed decision counts as near the limit.
const DefaultNearLimit = metricsconfig.DefaultNearLimit

// DefaultBuckets are the backend latency histogram's buckets, in seconds:
// 50 µs to 1 s, for calls that take tens of microseconds in process and a
// few hundred over the network.
var DefaultBuckets = metricsconfig.DefaultBuckets()

// Option configures a Collector.
type Option interface {
	apply(*config) error
}

// optionFunc adapts a function to Option.
type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	metricsconfig.Common
	namespace string
	quotas    []quotaGauge
}

// quotaGauge is a set of subjects whose remaining quota is read at every
// scrape.
type quotaGauge struct {
	t        *throttler.Throttler
	p        *throttler.Policy
	subjects []string
}

// MaxQuotaSubjects bounds the subjects of all WithQuotaGauge options of one
// Collector: each is a backend call at every scrape and a time series per
// limit.
const MaxQuotaSubjects = 100

// quotaScrapeTimeout bounds the peeks of one scrape.
const quotaScrapeTimeout = 2 * time.Second

// WithNamespace replaces the metric names' "throttlekit" prefix.
func WithNamespace(ns string) Option {
	return optionFunc(func(c *config) error {
		if ns == "" {
			return fmt.Errorf("%w: WithNamespace(\"\")", throttler.ErrInvalidOption)
		}
		c.namespace = ns
		return nil
	})
}

// WithNearLimit sets the fraction of a limit's quota under which an allowed
// decision counts as near the limit; the default is DefaultNearLimit. It
// must be above 0 and below 1.
func WithNearLimit(fraction float64) Option {
	return optionFunc(func(c *config) error { return c.SetNearLimit(fraction) })
}

// WithBuckets sets the backend latency histogram's buckets, in seconds;
// the default is DefaultBuckets. They must be finite and increasing
// (the histogram adds +Inf itself).
func WithBuckets(buckets []float64) Option {
	return optionFunc(func(c *config) error { return c.SetBuckets(buckets) })
}

// WithBreakers adds a source of circuit-breaker states, read at every
// scrape: redisbackend's Backend.Breakers, breaker.Set's Statuses, or a
// function of your own. It may be given several times.
func WithBreakers(statuses func() []breaker.Status) Option {
	return optionFunc(func(c *config) error { return c.AddBreakers(statuses) })
}

// WithRollout exports a rollout's split and counters under the label
// rollout=name, read at every scrape. It may be given several times, with
// distinct names.
func WithRollout(name string, b *rollout.Backend) Option {
	return optionFunc(func(c *config) error { return c.AddRollout(name, b) })
}

// WithQuotaGauge exports, for each of a few subjects the program names (a
// partner's API key, an outbound quota shared by a fleet), the remaining
// quota of every limit of p as throttlekit_quota_remaining{policy, limit,
// subject} and the limit itself as throttlekit_quota_limit, read with a
// Peek through t at every scrape. Subjects are identifiers, so this is the
// one place an identifier becomes a label: name only a handful, at most
// MaxQuotaSubjects in all. It may be given several times.
func WithQuotaGauge(t *throttler.Throttler, p *throttler.Policy, subjects ...string) Option {
	return optionFunc(func(c *config) error {
		if t == nil || p == nil || len(subjects) == 0 {
			return fmt.Errorf("%w: WithQuotaGauge needs a throttler, a policy and subjects", throttler.ErrInvalidOption)
		}
		n := len(subjects)
		for _, q := range c.quotas {
			n += len(q.subjects)
		}
		if n > MaxQuotaSubjects {
			return fmt.Errorf("%w: WithQuotaGauge: %d subjects, at most %d", throttler.ErrInvalidOption, n, MaxQuotaSubjects)
		}
		for _, s := range subjects {
			if s == "" {
				return fmt.Errorf("%w: WithQuotaGauge: an empty subject", throttler.ErrInvalidOption)
			}
		}
		c.quotas = append(c.quotas, quotaGauge{t, p, append([]string(nil), subjects...)})
		return nil
	})
}

// Collector counts a throttler's decisions and backend calls, and reads
// breakers and rollouts when scraped. Give it to throttler.WithObserver and
// register it with a prometheus.Registerer; one Collector may observe
// several throttlers. It is safe for concurrent use.
type Collector struct {
	cfg config

	decisions *prometheus.CounterVec
	nearLimit *prometheus.CounterVec
	latency   *prometheus.HistogramVec
	errors    *prometheus.CounterVec

	breakerState    *prometheus.Desc
	breakerRejected *prometheus.Desc
	rolloutRatio    *prometheus.Desc
	rolloutKilled   *prometheus.Desc
	rolloutEvents   *prometheus.Desc
	rolloutMismatch *prometheus.Desc
	quotaRemaining  *prometheus.Desc
	quotaLimit      *prometheus.Desc
	quotaErrors     *prometheus.Desc

	limits metricsconfig.Series[limitKey, *limitSeries]
	calls  metricsconfig.Series[callKey, *callSeries]
}

// limitKey names a policy's limit.
type limitKey struct{ policy, limit string }

type limitSeries struct {
	outcomes  [7]prometheus.Counter // in the order of observe.Outcomes
	nearLimit prometheus.Counter
}

type callKey struct{ backend, op string }

type callSeries struct {
	latency prometheus.Observer
	errors  [7]prometheus.Counter // in the order of observe.ErrorKinds
}

// New returns a Collector. A bad option is an error wrapping
// throttler.ErrInvalidOption.
func New(opts ...Option) (*Collector, error) {
	cfg := config{Common: metricsconfig.Defaults(DefaultBuckets), namespace: "throttlekit"}
	for _, o := range opts {
		if o == nil {
			return nil, metricsconfig.NilOption()
		}
		if err := o.apply(&cfg); err != nil {
			return nil, err
		}
	}
	ns := cfg.namespace
	c := &Collector{cfg: cfg,
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "decisions_total",
			Help: "Decisions by policy, binding limit and outcome (allowed, denied, cached, degraded_allowed, degraded_denied, local_allowed, local_denied)."},
			[]string{"policy", "limit", "outcome"}),
		nearLimit: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "near_limit_total",
			Help: fmt.Sprintf("Allowed decisions that left the binding limit under %g of its quota.", cfg.NearLimit)},
			[]string{"policy", "limit"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "backend_call_duration_seconds",
			Help: "Duration of the throttler's backend calls, by backend and operation.", Buckets: cfg.Buckets},
			[]string{"backend", "op"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "backend_errors_total",
			Help: "Failed backend calls by backend, operation and kind (timeout, canceled, breaker_open, unreachable, bad_reply, closed, other)."},
			[]string{"backend", "op", "kind"}),
		breakerState: prometheus.NewDesc(ns+"_breaker_state",
			"Circuit breaker state by server: 1 for the current state (closed, half_open, open), 0 for the others.",
			[]string{"server", "state"}, nil),
		breakerRejected: prometheus.NewDesc(ns+"_breaker_rejected_total",
			"Calls a circuit breaker answered without calling its server.", []string{"server"}, nil),
		rolloutRatio: prometheus.NewDesc(ns+"_rollout_new_ratio",
			"Share of identifiers the rollout's split sends to the new backend, 0 to 1 (0 under the kill switch or before the source's first answer).",
			[]string{"rollout"}, nil),
		rolloutKilled: prometheus.NewDesc(ns+"_rollout_killed",
			"1 while the rollout's kill switch sends every identifier to the old backend.", []string{"rollout"}, nil),
		rolloutEvents: prometheus.NewDesc(ns+"_rollout_events_total",
			"Rollout events: default_routed, mirrored, mirror_shortfall, mirror_diverged, secondary_error, seed_checked, seeded, seed_unsupported, shadow_compared, shadow_mismatched, flag_missing.",
			[]string{"rollout", "event"}, nil),
		rolloutMismatch: prometheus.NewDesc(ns+"_rollout_mismatches_total",
			"Shadow-mode mismatches by kind (allowed_denied, denied_allowed, remaining, reset); one decision can differ in several ways.",
			[]string{"rollout", "kind"}, nil),
		quotaRemaining: prometheus.NewDesc(ns+"_quota_remaining",
			"Remaining quota of a subject named with WithQuotaGauge, per limit, read at the scrape.",
			[]string{"policy", "limit", "subject"}, nil),
		quotaLimit: prometheus.NewDesc(ns+"_quota_limit",
			"The quota of each limit of a subject named with WithQuotaGauge.",
			[]string{"policy", "limit", "subject"}, nil),
		quotaErrors: prometheus.NewDesc(ns+"_quota_scrape_errors",
			"1 when the last scrape could not read a WithQuotaGauge subject (its gauges are then absent).",
			[]string{"policy", "subject"}, nil),
	}
	return c, nil
}

// Observe implements throttler.Observer.
func (c *Collector) Observe(_ context.Context, e throttler.Event) {
	if e.Op == "allow" && e.HasResult() {
		r := &e.Result
		ls := c.limit(e.Policy, r.Binding)
		ls.outcomes[metricsconfig.OutcomeIndex(r)].Inc()
		if observe.NearLimit(r, c.cfg.NearLimit) {
			ls.nearLimit.Inc()
		}
		if r.Cached {
			return // no backend call
		}
	}
	cs := c.call(e.Backend, e.Op)
	cs.latency.Observe(e.Latency.Seconds())
	if e.Err != nil {
		cs.errors[metricsconfig.KindIndex(e.Err)].Inc()
	}
}

// limit returns the series of a policy's limit, adding them on first use.
func (c *Collector) limit(policy, limit string) *limitSeries {
	return c.limits.Get(limitKey{policy, limit}, func() *limitSeries {
		ls := &limitSeries{nearLimit: c.nearLimit.WithLabelValues(policy, limit)}
		for i, o := range observe.Outcomes {
			ls.outcomes[i] = c.decisions.WithLabelValues(policy, limit, o)
		}
		return ls
	})
}

// call returns the series of a backend's operation, adding them on first
// use.
func (c *Collector) call(backend, op string) *callSeries {
	return c.calls.Get(callKey{backend, op}, func() *callSeries {
		cs := &callSeries{latency: c.latency.WithLabelValues(backend, op)}
		for i, k := range observe.ErrorKinds {
			cs.errors[i] = c.errors.WithLabelValues(backend, op, k)
		}
		return cs
	})
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	c.decisions.Describe(ch)
	c.nearLimit.Describe(ch)
	c.latency.Describe(ch)
	c.errors.Describe(ch)
	ch <- c.breakerState
	ch <- c.breakerRejected
	ch <- c.rolloutRatio
	ch <- c.rolloutKilled
	ch <- c.rolloutEvents
	ch <- c.rolloutMismatch
	ch <- c.quotaRemaining
	ch <- c.quotaLimit
	ch <- c.quotaErrors
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.decisions.Collect(ch)
	c.nearLimit.Collect(ch)
	c.latency.Collect(ch)
	c.errors.Collect(ch)
	metricsconfig.EachBreaker(c.cfg.Breakers, func(s breaker.Status) {
		for _, st := range metricsconfig.BreakerStates {
			v := 0.0
			if s.State == st {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(c.breakerState, prometheus.GaugeValue, v, s.Server, metricsconfig.StateName(st))
		}
		ch <- prometheus.MustNewConstMetric(c.breakerRejected, prometheus.CounterValue, float64(s.Rejected), s.Server)
	})
	c.collectQuotas(ch)
	for _, r := range c.cfg.Rollouts {
		ratio, killed := metricsconfig.Split(r.Backend)
		killedValue := 0.0
		if killed {
			killedValue = 1
		}
		ch <- prometheus.MustNewConstMetric(c.rolloutRatio, prometheus.GaugeValue, ratio, r.Name)
		ch <- prometheus.MustNewConstMetric(c.rolloutKilled, prometheus.GaugeValue, killedValue, r.Name)
		st := r.Backend.Stats()
		for _, ev := range metricsconfig.RolloutEvents(st) {
			ch <- prometheus.MustNewConstMetric(c.rolloutEvents, prometheus.CounterValue, float64(ev.Value), r.Name, ev.Name)
		}
		for _, m := range metricsconfig.RolloutMismatches(st) {
			ch <- prometheus.MustNewConstMetric(c.rolloutMismatch, prometheus.CounterValue, float64(m.Value), r.Name, m.Name)
		}
	}
}

// collectQuotas peeks every WithQuotaGauge subject, all within
// quotaScrapeTimeout.
func (c *Collector) collectQuotas(ch chan<- prometheus.Metric) {
	if len(c.cfg.quotas) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), quotaScrapeTimeout)
	defer cancel()
	for _, q := range c.cfg.quotas {
		policy := q.p.Name()
		for _, subject := range q.subjects {
			r, err := q.t.Peek(ctx, q.p, subject)
			failed := 0.0
			if err != nil || r.Degraded {
				failed = 1
			}
			ch <- prometheus.MustNewConstMetric(c.quotaErrors, prometheus.GaugeValue, failed, policy, subject)
			if failed != 0 {
				continue
			}
			for _, l := range r.Limits() {
				ch <- prometheus.MustNewConstMetric(c.quotaRemaining, prometheus.GaugeValue, float64(l.Remaining), policy, l.Name, subject)
				ch <- prometheus.MustNewConstMetric(c.quotaLimit, prometheus.GaugeValue, float64(l.Limit), policy, l.Name, subject)
			}
		}
	}
}
