package otelobserver

import (
	"context"
	"errors"
	"math"

	"go.opentelemetry.io/otel/metric"

	"github.com/throttlekit/throttlekit/backend/breaker"
	"github.com/throttlekit/throttlekit/observe/internal/metricsconfig"
)

// gauges are the observable instruments read at collection, made only when
// WithBreakers or WithRollout asks for them.
type gauges struct {
	breakerState      metric.Int64ObservableGauge
	breakerRejected   metric.Int64ObservableCounter
	rolloutRatio      metric.Float64ObservableGauge
	rolloutKilled     metric.Int64ObservableGauge
	rolloutEvents     metric.Int64ObservableCounter
	rolloutMismatches metric.Int64ObservableCounter
}

// registerGauges makes the breaker and rollout instruments that the options
// ask for and registers the callback that reads them.
func (o *Observer) registerGauges(meter metric.Meter) error {
	var insts []metric.Observable
	var errs []error
	add := func(inst metric.Observable, err error) {
		insts = append(insts, inst)
		errs = append(errs, err)
	}
	g := &o.gauges
	var err error
	if len(o.breakers) > 0 {
		g.breakerState, err = meter.Int64ObservableGauge("throttlekit.breaker.state", metric.WithUnit("1"),
			metric.WithDescription("Circuit breaker state by server: 1 for the current state (closed, half_open, open), 0 for the others."))
		add(g.breakerState, err)
		g.breakerRejected, err = meter.Int64ObservableCounter("throttlekit.breaker.rejected", metric.WithUnit("{call}"),
			metric.WithDescription("Calls a circuit breaker answered without calling its server."))
		add(g.breakerRejected, err)
	}
	if len(o.rollouts) > 0 {
		g.rolloutRatio, err = meter.Float64ObservableGauge("throttlekit.rollout.new_ratio", metric.WithUnit("1"),
			metric.WithDescription("Share of identifiers the rollout's split sends to the new backend, 0 to 1 (0 under the kill switch or before the source's first answer)."))
		add(g.rolloutRatio, err)
		g.rolloutKilled, err = meter.Int64ObservableGauge("throttlekit.rollout.killed", metric.WithUnit("1"),
			metric.WithDescription("1 while the rollout's kill switch sends every identifier to the old backend."))
		add(g.rolloutKilled, err)
		g.rolloutEvents, err = meter.Int64ObservableCounter("throttlekit.rollout.events", metric.WithUnit("{event}"),
			metric.WithDescription("Rollout events: default_routed, mirrored, mirror_shortfall, mirror_diverged, secondary_error, seed_checked, seeded, seed_unsupported, shadow_compared, shadow_mismatched, flag_missing."))
		add(g.rolloutEvents, err)
		g.rolloutMismatches, err = meter.Int64ObservableCounter("throttlekit.rollout.mismatches", metric.WithUnit("{mismatch}"),
			metric.WithDescription("Shadow-mode mismatches by kind (allowed_denied, denied_allowed, remaining, reset); one decision can differ in several ways."))
		add(g.rolloutMismatches, err)
	}
	if err := errors.Join(errs...); err != nil || len(insts) == 0 {
		return err
	}
	reg, err := meter.RegisterCallback(o.collect, insts...)
	if err != nil {
		return err
	}
	o.reg.Store(&reg)
	return nil
}

// collect reports every breaker's and rollout's state.
func (o *Observer) collect(_ context.Context, obs metric.Observer) error {
	g := &o.gauges
	metricsconfig.EachBreaker(o.breakers, func(s breaker.Status) {
		server := ServerKey.String(s.Server)
		for _, st := range metricsconfig.BreakerStates {
			var v int64
			if s.State == st {
				v = 1
			}
			obs.ObserveInt64(g.breakerState, v, metric.WithAttributes(server, StateKey.String(metricsconfig.StateName(st))))
		}
		obs.ObserveInt64(g.breakerRejected, clamp(s.Rejected), metric.WithAttributes(server))
	})
	for _, r := range o.rollouts {
		ratio, killed := metricsconfig.Split(r.Backend)
		name := RolloutKey.String(r.Name)
		obs.ObserveFloat64(g.rolloutRatio, ratio, metric.WithAttributes(name))
		obs.ObserveInt64(g.rolloutKilled, boolInt(killed), metric.WithAttributes(name))
		st := r.Backend.Stats()
		for _, ev := range metricsconfig.RolloutEvents(st) {
			obs.ObserveInt64(g.rolloutEvents, clamp(ev.Value), metric.WithAttributes(name, RolloutEventKey.String(ev.Name)))
		}
		for _, m := range metricsconfig.RolloutMismatches(st) {
			obs.ObserveInt64(g.rolloutMismatches, clamp(m.Value), metric.WithAttributes(name, MismatchKey.String(m.Name)))
		}
	}
	return nil
}

// clamp converts a uint64 count to int64, saturating.
func clamp(v uint64) int64 {
	if v > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(v)
}

// boolInt is 1 for true, 0 for false.
func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}
