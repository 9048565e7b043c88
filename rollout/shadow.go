package rollout

import (
	"context"
	"strings"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// MismatchKind is a set of ways two backends' outcomes for one decision
// differ.
type MismatchKind uint8

const (
	// VerdictDiffers: one backend allowed the request, the other denied it.
	VerdictDiffers MismatchKind = 1 << iota
	// RemainingDiffers: some limit's Remaining differs.
	RemainingDiffers
	// ResetDiffers: some limit's ResetAt differs.
	ResetDiffers
)

// String lists the kinds, e.g. "verdict|remaining", or "none".
func (k MismatchKind) String() string {
	if k == 0 {
		return "none"
	}
	var parts []string
	for _, kn := range []struct {
		kind MismatchKind
		name string
	}{{VerdictDiffers, "verdict"}, {RemainingDiffers, "remaining"}, {ResetDiffers, "reset"}} {
		if k&kn.kind != 0 {
			parts = append(parts, kn.name)
		}
	}
	return strings.Join(parts, "|")
}

// Mismatch describes one ShadowMode decision on which the two backends
// disagreed.
type Mismatch struct {
	// Kinds says how the outcomes differ.
	Kinds MismatchKind
	// Primary is the backend whose verdict was used; the other one shadowed.
	Primary Side
	// Request is the request both decided.
	Request driver.Request
	// PrimaryAllowed and ShadowAllowed are the two verdicts.
	PrimaryAllowed, ShadowAllowed bool
	// PrimaryLimits and ShadowLimits are the two outcomes' figures, limit
	// by limit in the policy's order.
	PrimaryLimits, ShadowLimits []driver.Status
}

// Stats is a snapshot of a Backend's counters since it was made.
type Stats struct {
	// DefaultRouted counts decisions made before the flag source had an
	// answer, sent to the default side.
	DefaultRouted uint64
	// Mirrored counts decisions whose units the secondary recorded
	// (MirrorMode), whole or in part, and concurrency leases it took too.
	Mirrored uint64
	// MirrorShortfalls counts decisions whose units the secondary could not
	// all record, because it was fuller than the primary or failed, and
	// leases it refused (one unit each); MirrorShortfallUnits counts the
	// units it missed.
	MirrorShortfalls, MirrorShortfallUnits uint64
	// SecondaryErrors counts failures of the secondary backend in
	// MirrorMode and ShadowMode (decisions, refunds and leases), and of the
	// other backend asked to release a lease in SplitMode. They never change
	// a decision.
	SecondaryErrors uint64
	// ShadowCompared counts ShadowMode decisions both backends answered.
	ShadowCompared uint64
	// ShadowMismatches counts compared decisions that differ in any way.
	// The counts by kind below may add up to more: one decision can differ
	// in several ways.
	ShadowMismatches uint64
	// AllowedDenied counts decisions the primary allowed and the shadow
	// denied; DeniedAllowed the reverse. Their sum is the VerdictDiffers
	// count.
	AllowedDenied, DeniedAllowed uint64
	// RemainingDiffers and ResetDiffers count compared decisions where some
	// limit's Remaining, or ResetAt, differs.
	RemainingDiffers, ResetDiffers uint64
	// MirrorDiverged counts MirrorMode decisions whose secondary held a
	// state apart from the primary's before the write: had it decided the
	// same request itself, some limit would have counted differently, or
	// it held a fixed window open with another end, which the write does
	// not move. It falls to 0 once the stores have converged; mirroring
	// begun in the middle of open windows raises it once per identifier,
	// and once per decision while the secondary's window of another end
	// stays open.
	MirrorDiverged uint64
	// SeedChecks counts SplitMode decisions (and takes) that looked for an
	// identifier's state on the other backend, because it may have moved
	// within its policy's horizon; Seeded counts those that found some and
	// merged it into the serving backend first. SeedUnsupported counts
	// checks skipped because the serving backend is no driver.Seeder.
	SeedChecks, Seeded, SeedUnsupported uint64
	// FlagMissing counts the answers of the flag source that did not hold
	// the flag it follows (a typo in its name, or a project or environment
	// its token does not see): the kill switch is then in force, silently
	// but for this count, the source's log and its Ping. It is 0 for a
	// source that cannot tell (see MissingCounter).
	FlagMissing uint64
}

// Stats returns a snapshot of the counters. Each counter is read atomically,
// but not all of them at one instant.
func (b *Backend) Stats() Stats {
	c := &b.stats
	return Stats{
		DefaultRouted:        c.defaultRouted.Load(),
		Mirrored:             c.mirrored.Load(),
		MirrorShortfalls:     c.mirrorShortfalls.Load(),
		MirrorShortfallUnits: c.mirrorShortfallUnits.Load(),
		SecondaryErrors:      c.secondaryErrors.Load(),
		ShadowCompared:       c.compared.Load(),
		ShadowMismatches:     c.mismatches.Load(),
		AllowedDenied:        c.allowedDenied.Load(),
		DeniedAllowed:        c.deniedAllowed.Load(),
		RemainingDiffers:     c.remainingDiffers.Load(),
		ResetDiffers:         c.resetDiffers.Load(),
		MirrorDiverged:       c.mirrorDiverged.Load(),
		SeedChecks:           c.seedChecks.Load(),
		Seeded:               c.seeded.Load(),
		SeedUnsupported:      c.seedUnsupported.Load(),
		FlagMissing:          flagMissing(b.source),
	}
}

// shadow runs req on the backend that does not serve the identifier and
// compares its outcome with primary, the serving backend's.
func (b *Backend) shadow(ctx context.Context, primarySide Side, req driver.Request, primary driver.Outcome) {
	shadowSide := primarySide.other()
	out, err := b.backends[shadowSide].Decide(ctx, req)
	if err == nil && len(out.States) != len(req.Policy.Limits) {
		err = driver.Errorf("%w: %d states for %d limits", driver.ErrBadReply, len(out.States), len(req.Policy.Limits))
	}
	if err != nil {
		b.secondaryFailed(shadowSide, "shadow", err)
		return
	}
	b.stats.compared.Add(1)
	pr := figures(req, primary)
	sr := figures(req, out)
	kinds := compare(primary.Allowed, out.Allowed, pr, sr)
	if kinds == 0 {
		return
	}
	b.stats.mismatches.Add(1)
	if kinds&VerdictDiffers != 0 {
		if primary.Allowed {
			b.stats.allowedDenied.Add(1)
		} else {
			b.stats.deniedAllowed.Add(1)
		}
	}
	if kinds&RemainingDiffers != 0 {
		b.stats.remainingDiffers.Add(1)
	}
	if kinds&ResetDiffers != 0 {
		b.stats.resetDiffers.Add(1)
	}
	if b.onMismatch != nil {
		b.onMismatch(Mismatch{Kinds: kinds, Primary: primarySide, Request: req,
			PrimaryAllowed: primary.Allowed, ShadowAllowed: out.Allowed, PrimaryLimits: pr, ShadowLimits: sr})
	}
}

// compare returns how two evaluated results of one request differ, limit by
// limit, so that a different binding limit cannot hide a difference.
func compare(aAllowed, bAllowed bool, a, b []driver.Status) MismatchKind {
	var kinds MismatchKind
	if aAllowed != bAllowed {
		kinds |= VerdictDiffers
	}
	for i := range min(len(a), len(b)) {
		if a[i].Remaining != b[i].Remaining {
			kinds |= RemainingDiffers
		}
		if !a[i].ResetAt.Equal(b[i].ResetAt) {
			kinds |= ResetDiffers
		}
	}
	return kinds
}

// figures evaluates every limit of an outcome of req.
func figures(req driver.Request, out driver.Outcome) []driver.Status {
	st := make([]driver.Status, len(req.Policy.Limits))
	for i := range st {
		st[i] = driver.Evaluate(&req.Policy.Limits[i], out.States[i], req.Now, req.Cost, out.Allowed)
	}
	return st
}

// MissingCounter is implemented by a FlagSource that can tell when its
// server answers without the flag the source follows. The rollout reports
// the count in Stats.FlagMissing, which the metrics export
// (event="flag_missing").
type MissingCounter interface {
	// MissingFetches counts the server's answers that lacked the flag.
	MissingFetches() uint64
}

// flagMissing is src's MissingFetches, or 0 when src cannot tell.
func flagMissing(src FlagSource) uint64 {
	if mc, ok := src.(MissingCounter); ok {
		return mc.MissingFetches()
	}
	return 0
}
