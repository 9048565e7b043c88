package debugpage

import (
	"time"
)

// Page is what the page shows. ?format=json serves it as JSON; the field
// names in its tags, and in those of the types it holds, are the schema,
// kept stable: fields may be added, never renamed or removed.
type Page struct {
	// GeneratedAt is when the page was gathered, in UTC.
	GeneratedAt time.Time `json:"generated_at"`
	// Uptime is how long the Handler has existed, as "1h2m3s".
	Uptime string `json:"uptime"`
	// Backends lists the backends of WithBackend, in the order given.
	Backends []Backend `json:"backends"`
	// Breakers lists the circuit breakers the backends report, then those
	// of WithBreakers and WithBreakerSet.
	Breakers []Breaker `json:"breakers"`
	// Rollouts lists the rollouts of WithRollout, in the order given.
	Rollouts []Rollout `json:"rollouts"`
	// Policies lists the policies of WithPolicies, in the order given.
	Policies []Policy `json:"policies"`
	// TopDenied is the heaviest denied identifiers.
	TopDenied TopDenied `json:"top_denied"`
}

// Backend is one backend's health.
type Backend struct {
	// Name is the name given to WithBackend.
	Name string `json:"name"`
	// Kind is the backend's Go type, such as "*redisbackend.Backend".
	Kind string `json:"kind"`
	// Pinged reports that the backend implements driver.Pinger and was
	// pinged; a backend that cannot be pinged is shown as healthy.
	Pinged bool `json:"pinged"`
	// Healthy reports a ping answered without error.
	Healthy bool `json:"healthy"`
	// PingMs is how long the ping took, in milliseconds.
	PingMs float64 `json:"ping_ms"`
	// Error is the ping's error, empty when healthy.
	Error string `json:"error,omitempty"`
	// ErrorKind classifies Error as observe.ErrorKind does ("timeout",
	// "unreachable", "breaker_open", ...), empty when healthy.
	ErrorKind string `json:"error_kind,omitempty"`
}

// Breaker is one circuit breaker's state.
type Breaker struct {
	// Source is the name of the backend, or of the WithBreakers or
	// WithBreakerSet option, the breaker comes from.
	Source string `json:"source"`
	// Server is the server the breaker guards.
	Server string `json:"server"`
	// State is "closed", "half-open" or "open"; "unknown" when the
	// backend failed to report its breakers, Server then saying why.
	State string `json:"state"`
	// Rejected counts the calls the breaker rejected since it was made.
	Rejected uint64 `json:"rejected"`
}

// Rollout is a rollout's split, flag source and counters.
type Rollout struct {
	// Name is the name given to WithRollout.
	Name string `json:"name"`
	// Mode is "split", "mirror" or "shadow".
	Mode string `json:"mode"`
	// HasSplit reports that the source has had an answer; before, the
	// rollout's default side serves and the split fields are zero.
	HasSplit bool `json:"has_split"`
	// Split describes the split in force, as "30% new (group g)", or
	// "none yet".
	Split string `json:"split"`
	// PercentNew is the percentage of identifiers the new backend serves.
	PercentNew int `json:"percent_new"`
	// Killed reports the kill switch: every identifier on the old backend.
	Killed bool `json:"killed"`
	// GroupID is the split's group ID, which buckets identifiers.
	GroupID string `json:"group_id,omitempty"`
	// Source is the flag source's health and freshness.
	Source Source `json:"source"`
	// Stats are the rollout's counters.
	Stats RolloutStats `json:"stats"`
}

// Source is a rollout's flag source: its health, and how fresh the split
// in force is.
type Source struct {
	// Kind is the source's Go type, such as "*unleashflag.Source".
	Kind string `json:"kind"`
	// Pinged reports that the source implements driver.Pinger and was
	// pinged; a source that cannot be pinged is shown as healthy.
	Pinged bool `json:"pinged"`
	// Healthy reports a ping answered without error.
	Healthy bool `json:"healthy"`
	// Error is the ping's error, empty when healthy.
	Error string `json:"error,omitempty"`
	// LastFetch is when the source's server last answered; absent when
	// the source does not say, or has had no answer.
	LastFetch *time.Time `json:"last_fetch,omitempty"`
	// FetchAgeSeconds is how long ago LastFetch was, in seconds.
	FetchAgeSeconds *float64 `json:"fetch_age_seconds,omitempty"`
	// LastUpdate is when the source last published a new split
	// (WithSourceStatus).
	LastUpdate *time.Time `json:"last_update,omitempty"`
	// Errors counts the source's errors (WithSourceStatus).
	Errors uint64 `json:"errors,omitempty"`
	// LastError is the latest of them (WithSourceStatus).
	LastError string `json:"last_error,omitempty"`
}

// RolloutStats are a rollout's counters (rollout.Stats), since it was
// made.
type RolloutStats struct {
	// DefaultRouted counts decisions made before the source had an answer.
	DefaultRouted uint64 `json:"default_routed"`
	// Mirrored counts decisions the secondary recorded too (mirror mode).
	Mirrored uint64 `json:"mirrored"`
	// MirrorShortfalls counts decisions the secondary could not record in
	// full.
	MirrorShortfalls uint64 `json:"mirror_shortfalls"`
	// MirrorShortfallUnits counts the units the secondary missed.
	MirrorShortfallUnits uint64 `json:"mirror_shortfall_units"`
	// MirrorDiverged counts mirrored decisions whose secondary was apart
	// from the primary before the write; it stops growing once the stores
	// have converged.
	MirrorDiverged uint64 `json:"mirror_diverged"`
	// SeedChecks counts split-mode decisions that looked for an
	// identifier's state on the other backend; Seeded those that carried
	// some over.
	SeedChecks uint64 `json:"seed_checks"`
	// Seeded counts split-mode decisions that carried state over.
	Seeded uint64 `json:"seeded"`
	// SecondaryErrors counts failures of the secondary backend.
	SecondaryErrors uint64 `json:"secondary_errors"`
	// ShadowCompared counts shadow-mode decisions both backends answered.
	ShadowCompared uint64 `json:"shadow_compared"`
	// ShadowMismatches counts compared decisions that differ in any way.
	ShadowMismatches uint64 `json:"shadow_mismatches"`
	// MismatchesByKind counts the mismatches by kind; one decision may
	// differ in several ways.
	MismatchesByKind Mismatches `json:"mismatches_by_kind"`
}

// Mismatches counts shadow-mode mismatches by kind.
type Mismatches struct {
	// AllowedDenied: the primary allowed, the shadow denied.
	AllowedDenied uint64 `json:"allowed_denied"`
	// DeniedAllowed: the primary denied, the shadow allowed.
	DeniedAllowed uint64 `json:"denied_allowed"`
	// RemainingDiffers: some limit's Remaining differs.
	RemainingDiffers uint64 `json:"remaining_differs"`
	// ResetDiffers: some limit's ResetAt differs.
	ResetDiffers uint64 `json:"reset_differs"`
}

// Policy is a policy in use and its limits.
type Policy struct {
	// Name is the policy's name.
	Name string `json:"name"`
	// Spec is the policy in the notation ParsePolicy reads.
	Spec string `json:"spec"`
	// Limits are the policy's limits, in its order.
	Limits []Limit `json:"limits"`
}

// Limit is one limit of a policy.
type Limit struct {
	// Name is the limit's name in its policy.
	Name string `json:"name"`
	// Spec is the limit in the notation ParseLimit reads, as "10/s".
	Spec string `json:"spec"`
	// Algorithm is the limit's algorithm, as "fixed" or "gcra".
	Algorithm string `json:"algorithm"`
	// Max is the limit's quota per Window.
	Max int64 `json:"max"`
	// Window is the limit's window, as "1m0s".
	Window string `json:"window"`
	// Burst is the GCRA burst, absent otherwise.
	Burst int64 `json:"burst,omitempty"`
}

// TopDenied is the heaviest denied identifiers, from a Space-Saving sketch
// of K counters: memory stays fixed whatever the number of identifiers,
// each Count overestimates its identifier's denials by at most Err, and
// every identifier denied more than Denials/K times is listed.
type TopDenied struct {
	// K is the sketch's number of counters, the most identifiers listed.
	K int `json:"k"`
	// Since is when the sketch started counting: the Handler's creation or
	// its latest ResetDenied.
	Since time.Time `json:"since"`
	// Denials counts every denial the sketch saw.
	Denials uint64 `json:"denials"`
	// ByOutcome splits Denials by observe.Outcome: "denied", "cached",
	// "local_denied".
	ByOutcome map[string]uint64 `json:"by_outcome"`
	// Tracked is how many identifiers the sketch counts, at most K.
	Tracked int `json:"tracked"`
	// Heaviest lists them, the most denied first.
	Heaviest []Denied `json:"heaviest"`
}

// Denied is one of the heaviest denied identifiers: its true number of
// denials lies in [Count-Err, Count].
type Denied struct {
	// Policy is the policy, or concurrency limit, that denied it.
	Policy string `json:"policy"`
	// Identifier is the identifier denied.
	Identifier string `json:"identifier"`
	// Count is its estimated number of denials, an overestimate by at
	// most Err.
	Count uint64 `json:"count"`
	// Err bounds Count's overestimate: the count its counter held when
	// the identifier took it over, 0 when counted from its first denial.
	Err uint64 `json:"err"`
}
