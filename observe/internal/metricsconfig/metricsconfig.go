// Package metricsconfig is what the OpenTelemetry observer and the
// Prometheus collector share: the options both take (near-limit fraction,
// histogram buckets, breaker and rollout sources) with one validation, and
// the readings both report (breaker states, rollout split and counters), so
// that the two cannot drift apart. Each adapter keeps its own exported
// Option type and wraps these setters in one line each.
package metricsconfig

import (
	"fmt"
	"math"
	"sync"
	"sync/atomic"

	"github.com/throttlekit/throttlekit/backend/breaker"
	"github.com/throttlekit/throttlekit/observe"
	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler"
)

// DefaultNearLimit is the fraction of a limit's quota under which an
// allowed decision counts as near the limit.
const DefaultNearLimit = 0.2

// DefaultBuckets returns the backend call duration buckets, in seconds:
// 50 µs to 1 s, for calls that take tens of microseconds in process and a
// few hundred over the network. It returns a fresh slice each time.
func DefaultBuckets() []float64 {
	return []float64{.00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}
}

// NamedRollout is a rollout reported under a name.
type NamedRollout struct {
	Name    string
	Backend *rollout.Backend
}

// Common is the configuration both adapters take.
type Common struct {
	NearLimit float64
	Buckets   []float64
	Breakers  []func() []breaker.Status
	Rollouts  []NamedRollout
}

// Defaults returns the configuration before any option: DefaultNearLimit,
// buckets, no breakers, no rollouts.
func Defaults(buckets []float64) Common {
	return Common{NearLimit: DefaultNearLimit, Buckets: buckets}
}

// invalid wraps throttler.ErrInvalidOption with what was wrong.
func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{throttler.ErrInvalidOption}, args...)...)
}

// SetNearLimit sets the near-limit fraction: above 0 and below 1.
func (c *Common) SetNearLimit(fraction float64) error {
	if !(fraction > 0 && fraction < 1) {
		return invalid("WithNearLimit(%v): want a fraction above 0 and below 1", fraction)
	}
	c.NearLimit = fraction
	return nil
}

// SetBuckets sets the histogram bounds: at least one, finite and strictly
// increasing. A NaN or infinite bound is refused: Prometheus adds +Inf
// itself, and OpenTelemetry SDKs reject non-finite bounds.
func (c *Common) SetBuckets(bounds []float64) error {
	if len(bounds) == 0 {
		return invalid("WithBuckets: no buckets")
	}
	for i, b := range bounds {
		if math.IsNaN(b) || math.IsInf(b, 0) || i > 0 && !(b > bounds[i-1]) {
			return invalid("WithBuckets: %v is not finite and increasing", bounds)
		}
	}
	c.Buckets = append([]float64(nil), bounds...)
	return nil
}

// AddBreakers adds a source of circuit-breaker states.
func (c *Common) AddBreakers(statuses func() []breaker.Status) error {
	if statuses == nil {
		return invalid("WithBreakers(nil)")
	}
	c.Breakers = append(c.Breakers, statuses)
	return nil
}

// AddRollout adds a rollout under a name no other rollout has.
func (c *Common) AddRollout(name string, b *rollout.Backend) error {
	if name == "" || b == nil {
		return invalid("WithRollout needs a name and a backend")
	}
	for _, r := range c.Rollouts {
		if r.Name == name {
			return invalid("WithRollout: two rollouts named %q", name)
		}
	}
	c.Rollouts = append(c.Rollouts, NamedRollout{name, b})
	return nil
}

// NilOption is the error of a nil Option given to New.
func NilOption() error { return invalid("nil Option") }

// BreakerStates are the states a breaker's gauge reports, in order.
var BreakerStates = [...]breaker.State{breaker.Closed, breaker.HalfOpen, breaker.Open}

// StateName names a breaker state as a label or attribute value.
func StateName(s breaker.State) string {
	switch s {
	case breaker.Closed:
		return "closed"
	case breaker.HalfOpen:
		return "half_open"
	}
	return "open"
}

// EachBreaker calls f once per server named by the sources, from the
// first source that names it: two sources naming one server would be a
// duplicate series.
func EachBreaker(sources []func() []breaker.Status, f func(breaker.Status)) {
	seen := map[string]bool{}
	for _, statuses := range sources {
		for _, s := range statuses() {
			if seen[s.Server] {
				continue
			}
			seen[s.Server] = true
			f(s)
		}
	}
}

// Split reads a rollout's split: the share sent to the new backend (0 to
// 1) and whether the kill switch is on. Before the flag source has an
// answer, both are zero.
func Split(b *rollout.Backend) (ratio float64, killed bool) {
	src := b.Source()
	if src == nil {
		return 0, false
	}
	sp := src.Split()
	switch {
	case sp == nil:
		return 0, false
	case sp.Killed():
		return 0, true
	}
	return float64(sp.Percent()) / 100, false
}

// Count is a named counter's value.
type Count struct {
	Name  string
	Value uint64
}

// RolloutEvents lists a rollout's event counters, in a fixed order.
func RolloutEvents(st rollout.Stats) [11]Count {
	return [...]Count{
		{"default_routed", st.DefaultRouted}, {"mirrored", st.Mirrored},
		{"mirror_shortfall", st.MirrorShortfalls}, {"secondary_error", st.SecondaryErrors},
		{"shadow_compared", st.ShadowCompared}, {"shadow_mismatched", st.ShadowMismatches},
		{"mirror_diverged", st.MirrorDiverged}, {"seed_checked", st.SeedChecks},
		{"seeded", st.Seeded}, {"seed_unsupported", st.SeedUnsupported},
		{"flag_missing", st.FlagMissing},
	}
}

// RolloutMismatches lists a rollout's shadow mismatches by kind.
func RolloutMismatches(st rollout.Stats) [4]Count {
	return [...]Count{
		{"allowed_denied", st.AllowedDenied}, {"denied_allowed", st.DeniedAllowed},
		{"remaining", st.RemainingDiffers}, {"reset", st.ResetDiffers},
	}
}

// OutcomeIndex is the index of observe.Outcome(r) in observe.Outcomes.
func OutcomeIndex(r *throttler.Result) int { return indexOf(observe.Outcomes, observe.Outcome(r)) }

// KindIndex is the index of observe.ErrorKind(err) in observe.ErrorKinds;
// an unknown kind counts as the last, "other".
func KindIndex(err error) int {
	i := indexOf(observe.ErrorKinds, observe.ErrorKind(err))
	if i == len(observe.ErrorKinds) {
		return i - 1
	}
	return i
}

// indexOf returns the index of s in list, or len(list).
func indexOf(list []string, s string) int {
	for i, v := range list {
		if v == s {
			return i
		}
	}
	return len(list)
}

// Series maps a key to the instruments or attribute sets made for it on
// first use. Reads take no lock: the map is copied on write, and series are
// added only while a new policy, limit or operation is first seen.
type Series[K comparable, V any] struct {
	mu sync.Mutex
	m  atomic.Pointer[map[K]V]
}

// Get returns the series of key, made by newSeries on first use.
func (s *Series[K, V]) Get(key K, newSeries func() V) V {
	if m := s.m.Load(); m != nil {
		if v, ok := (*m)[key]; ok {
			return v
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var old map[K]V
	if m := s.m.Load(); m != nil {
		old = *m
	}
	if v, ok := old[key]; ok {
		return v
	}
	v := newSeries()
	next := make(map[K]V, len(old)+1)
	for k, x := range old {
		next[k] = x
	}
	next[key] = v
	s.m.Store(&next)
	return v
}
