package otelobserver

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/throttlekit/throttlekit/backend/breaker"
	"github.com/throttlekit/throttlekit/observe"
	"github.com/throttlekit/throttlekit/observe/internal/metricsconfig"
	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler"
)

// ScopeName is the instrumentation scope of the Observer's meter and
// tracer: this package's import path.
const ScopeName = "github.com/throttlekit/throttlekit/observe/otel"

// DefaultNearLimit is the fraction of a limit's quota under which an
// allowed decision counts as near the limit, as in observe/prometheus.
const DefaultNearLimit = metricsconfig.DefaultNearLimit

// DefaultBuckets are the explicit bucket boundaries, in seconds, advised
// for throttlekit.backend.call.duration: 50 µs to 1 s, the same as the
// Prometheus collector's. A View of the MeterProvider may override them.
var DefaultBuckets = metricsconfig.DefaultBuckets()

// The attribute keys the Observer sets on metrics and spans.
const (
	// PolicyKey is the policy's name.
	PolicyKey = attribute.Key("throttlekit.policy")
	// LimitKey is the binding limit's name ("10/s" unless the policy
	// names it).
	LimitKey = attribute.Key("throttlekit.limit")
	// OutcomeKey is the decision's outcome, one of observe.Outcomes.
	OutcomeKey = attribute.Key("throttlekit.outcome")
	// BackendKey is the backend's kind: "memory", "redis", "rollout"...
	BackendKey = attribute.Key("throttlekit.backend")
	// OpKey is the operation: allow, peek, refund or reset.
	OpKey = attribute.Key("throttlekit.op")
	// ErrorTypeKey is the semantic conventions' error.type: the kind of a
	// backend error, one of observe.ErrorKinds.
	ErrorTypeKey = attribute.Key("error.type")
	// QuotaKey is the binding limit's quota (spans only).
	QuotaKey = attribute.Key("throttlekit.quota")
	// RemainingKey is what is left of the binding limit (spans only).
	RemainingKey = attribute.Key("throttlekit.remaining")
	// RetryAfterKey is a denial's RetryAfter in seconds (spans only).
	RetryAfterKey = attribute.Key("throttlekit.retry_after")
	// NeverAllowedKey is true on a denial no wait can lift: a cost above
	// a limit's capacity (spans only; such a span has no RetryAfterKey).
	NeverAllowedKey = attribute.Key("throttlekit.never_allowed")
	// IdentifierKey is the identifier, on spans only and only with
	// WithIdentifierAttribute.
	IdentifierKey = attribute.Key("throttlekit.identifier")
	// ServerKey is a circuit breaker's server.
	ServerKey = attribute.Key("throttlekit.server")
	// StateKey is a circuit breaker's state: closed, half_open or open.
	StateKey = attribute.Key("throttlekit.state")
	// RolloutKey is the name a rollout was given with WithRollout.
	RolloutKey = attribute.Key("throttlekit.rollout.name")
	// RolloutEventKey names a rollout counter: default_routed, mirrored,
	// mirror_shortfall, mirror_diverged, secondary_error, seed_checked,
	// seeded, seed_unsupported, shadow_compared, shadow_mismatched,
	// flag_missing.
	RolloutEventKey = attribute.Key("throttlekit.rollout.event")
	// MismatchKey is a shadow mismatch's kind: allowed_denied,
	// denied_allowed, remaining or reset.
	MismatchKey = attribute.Key("throttlekit.rollout.mismatch")
)

// Option configures an Observer.
type Option interface {
	apply(*config) error
}

// optionFunc adapts a function to Option.
type optionFunc func(*config) error

func (f optionFunc) apply(c *config) error { return f(c) }

type config struct {
	metricsconfig.Common
	mp     metric.MeterProvider
	tp     trace.TracerProvider
	spans  bool
	withID bool
}

// WithMeterProvider sets the MeterProvider the metrics are made with; the
// default is otel.GetMeterProvider() at the time New is called (the global
// provider, which forwards to one installed later).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) error {
		if mp == nil {
			return fmt.Errorf("%w: WithMeterProvider(nil)", throttler.ErrInvalidOption)
		}
		c.mp = mp
		return nil
	})
}

// WithTracerProvider sets the TracerProvider spans are made with, and turns
// spans on.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) error {
		if tp == nil {
			return fmt.Errorf("%w: WithTracerProvider(nil)", throttler.ErrInvalidOption)
		}
		c.tp, c.spans = tp, true
		return nil
	})
}

// WithSpans turns spans on or off; they are off by default. Without
// WithTracerProvider, spans go to otel.GetTracerProvider(). A later option
// overrides an earlier one.
func WithSpans(on bool) Option {
	return optionFunc(func(c *config) error {
		c.spans = on
		return nil
	})
}

// WithIdentifierAttribute puts the identifier on spans as
// throttlekit.identifier. It never becomes a metric attribute.
func WithIdentifierAttribute() Option {
	return optionFunc(func(c *config) error {
		c.withID = true
		return nil
	})
}

// WithNearLimit sets the fraction of a limit's quota under which an allowed
// decision counts as near the limit; the default is DefaultNearLimit. It
// must be above 0 and below 1.
func WithNearLimit(fraction float64) Option {
	return optionFunc(func(c *config) error { return c.SetNearLimit(fraction) })
}

// WithBuckets sets the bucket boundaries, in seconds, advised for the
// backend call duration histogram; the default is DefaultBuckets. They
// must be finite and increasing.
func WithBuckets(bounds []float64) Option {
	return optionFunc(func(c *config) error { return c.SetBuckets(bounds) })
}

// WithBreakers adds a source of circuit-breaker states, read at every
// collection: redisbackend's Backend.Breakers, breaker.Set's Statuses, or a
// function of your own. It may be given several times; a server named by
// two sources is reported once, from the first.
func WithBreakers(statuses func() []breaker.Status) Option {
	return optionFunc(func(c *config) error { return c.AddBreakers(statuses) })
}

// WithRollout reports a rollout's split and counters with the attribute
// throttlekit.rollout.name=name, read at every collection. It may be given
// several times, with distinct names.
func WithRollout(name string, b *rollout.Backend) Option {
	return optionFunc(func(c *config) error { return c.AddRollout(name, b) })
}

// Observer records a throttler's decisions and backend calls as
// OpenTelemetry metrics, and optionally spans. Give it to
// throttler.WithObserver; one Observer may observe several throttlers. It
// is safe for concurrent use.
type Observer struct {
	nearLimit float64
	withID    bool
	tracer    trace.Tracer // nil without spans

	decisions metric.Int64Counter
	near      metric.Int64Counter
	duration  metric.Float64Histogram
	errors    metric.Int64Counter

	breakers []func() []breaker.Status
	rollouts []metricsconfig.NamedRollout
	gauges   gauges
	reg      atomic.Pointer[metric.Registration]

	decisionS metricsconfig.Series[decisionKey, *decisionSeries]
	callS     metricsconfig.Series[callKey, *callSeries]
}

// decisionKey is what a decision's metric attributes, but its outcome,
// depend on.
type decisionKey struct{ policy, limit string }

// decisionSeries holds a policy's limit's precomputed attribute sets, one
// per outcome (in the order of observe.Outcomes) and one for near_limit.
type decisionSeries struct {
	outcomes [][]metric.AddOption
	near     []metric.AddOption
}

type callKey struct{ backend, op string }

// callSeries holds a backend operation's precomputed attribute sets: the
// duration's, and one per error kind in the order of observe.ErrorKinds.
type callSeries struct {
	duration []metric.RecordOption
	errors   [][]metric.AddOption
}

// New returns an Observer. A bad option is an error wrapping
// throttler.ErrInvalidOption; an instrument the MeterProvider refuses is an
// error too.
func New(opts ...Option) (*Observer, error) {
	cfg := config{Common: metricsconfig.Defaults(DefaultBuckets)}
	for _, opt := range opts {
		if opt == nil {
			return nil, metricsconfig.NilOption()
		}
		if err := opt.apply(&cfg); err != nil {
			return nil, err
		}
	}
	if cfg.mp == nil {
		cfg.mp = otel.GetMeterProvider()
	}
	o := &Observer{nearLimit: cfg.NearLimit, withID: cfg.withID, breakers: cfg.Breakers, rollouts: cfg.Rollouts}
	if cfg.spans {
		tp := cfg.tp
		if tp == nil {
			tp = otel.GetTracerProvider()
		}
		o.tracer = tp.Tracer(ScopeName)
	}
	meter := cfg.mp.Meter(ScopeName)
	var errs [4]error
	o.decisions, errs[0] = meter.Int64Counter("throttlekit.decisions", metric.WithUnit("{decision}"),
		metric.WithDescription("Decisions by policy, binding limit and outcome (allowed, denied, cached, degraded_allowed, degraded_denied, local_allowed, local_denied)."))
	o.near, errs[1] = meter.Int64Counter("throttlekit.near_limit", metric.WithUnit("{decision}"),
		metric.WithDescription(fmt.Sprintf("Allowed decisions that left the binding limit under %g of its quota.", cfg.NearLimit)))
	o.duration, errs[2] = meter.Float64Histogram("throttlekit.backend.call.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of the throttler's backend calls, by backend and operation."),
		metric.WithExplicitBucketBoundaries(cfg.Buckets...))
	o.errors, errs[3] = meter.Int64Counter("throttlekit.backend.errors", metric.WithUnit("{error}"),
		metric.WithDescription("Failed backend calls by backend, operation and error.type (timeout, canceled, breaker_open, unreachable, bad_reply, closed, other)."))
	if err := errors.Join(errs[:]...); err != nil {
		return nil, fmt.Errorf("throttlekit: otel: %w", err)
	}
	if err := o.registerGauges(meter); err != nil {
		return nil, fmt.Errorf("throttlekit: otel: %w", err)
	}
	return o, nil
}

// Close unregisters the callback that reports breakers and rollouts, so
// that a MeterProvider which outlives the Observer stops reading them. It
// is safe to call more than once; Observe keeps working after it.
func (o *Observer) Close() error {
	if o == nil {
		return nil
	}
	if reg := o.reg.Swap(nil); reg != nil {
		return (*reg).Unregister()
	}
	return nil
}

// Observe implements throttler.Observer. Once a policy's limit and a
// backend's operation have been seen, recording metrics takes no lock and,
// with the SDK's MeterProvider, allocates nothing.
func (o *Observer) Observe(ctx context.Context, e throttler.Event) {
	if o == nil {
		return
	}
	if ctx == nil {
		ctx = context.Background()
	}
	r := &e.Result
	hasResult := e.HasResult()
	if e.Op == "allow" && hasResult {
		s := o.decision(e.Policy, r.Binding)
		o.decisions.Add(ctx, 1, s.outcomes[metricsconfig.OutcomeIndex(r)]...)
		if observe.NearLimit(r, o.nearLimit) {
			o.near.Add(ctx, 1, s.near...)
		}
	}
	if !(hasResult && r.Cached) { // a cached denial made no backend call
		c := o.call(e.Backend, e.Op)
		o.duration.Record(ctx, e.Latency.Seconds(), c.duration...)
		if e.Err != nil {
			o.errors.Add(ctx, 1, c.errors[metricsconfig.KindIndex(e.Err)]...)
		}
	}
	if o.tracer != nil {
		o.span(ctx, &e)
	}
}

// decision returns the attribute sets of a policy's limit, computing them
// on first use.
func (o *Observer) decision(policy, limit string) *decisionSeries {
	return o.decisionS.Get(decisionKey{policy, limit}, func() *decisionSeries {
		s := &decisionSeries{
			outcomes: make([][]metric.AddOption, len(observe.Outcomes)),
			near:     addOption(PolicyKey.String(policy), LimitKey.String(limit)),
		}
		for i, outcome := range observe.Outcomes {
			s.outcomes[i] = addOption(PolicyKey.String(policy), LimitKey.String(limit), OutcomeKey.String(outcome))
		}
		return s
	})
}

// call returns the attribute sets of a backend's operation, computing them
// on first use.
func (o *Observer) call(backend, op string) *callSeries {
	return o.callS.Get(callKey{backend, op}, func() *callSeries {
		set := attribute.NewSet(BackendKey.String(backend), OpKey.String(op))
		s := &callSeries{
			duration: []metric.RecordOption{metric.WithAttributeSet(set)},
			errors:   make([][]metric.AddOption, len(observe.ErrorKinds)),
		}
		for i, kind := range observe.ErrorKinds {
			s.errors[i] = addOption(BackendKey.String(backend), OpKey.String(op), ErrorTypeKey.String(kind))
		}
		return s
	})
}

// addOption returns the options of a measurement with attrs, ready to pass
// to Add without building a slice.
func addOption(attrs ...attribute.KeyValue) []metric.AddOption {
	return []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attrs...))}
}

var _ throttler.Observer = (*Observer)(nil)
