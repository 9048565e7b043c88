package rollout

import (
	"context"
	"fmt"
	"strings"

	"github.com/throttlekit/throttlekit/throttler"
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
	Request throttler.Request
	// PrimaryResult and ShadowResult are the two outcomes, evaluated.
	PrimaryResult, ShadowResult throttler.Result
}

// Stats is a snapshot of a Backend's counters since it was made.
type Stats struct {
	// DefaultRouted counts decisions made before the flag source had an
	// answer, sent to the default side.
	DefaultRouted uint64
	// Mirrored counts decisions whose units the secondary recorded
	// (MirrorMode), whole or in part.
	Mirrored uint64
	// MirrorShortfalls counts decisions whose units the secondary could not
	// all record, because it was fuller than the primary or failed;
	// MirrorShortfallUnits counts the units it missed.
	MirrorShortfalls, MirrorShortfallUnits uint64
	// SecondaryErrors counts failures of the secondary backend in
	// MirrorMode and ShadowMode (decisions and refunds). They never change a
	// decision.
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
	}
}

// shadow runs req on the backend that does not serve the identifier and
// compares its outcome with primary, the serving backend's.
func (b *Backend) shadow(ctx context.Context, primarySide Side, req throttler.Request, primary throttler.Outcome) {
	shadowSide := primarySide.other()
	out, err := b.backends[shadowSide].Decide(ctx, req)
	if err == nil && len(out.States) != req.Policy.Len() {
		err = fmt.Errorf("%w: %d states for %d limits", throttler.ErrBadReply, len(out.States), req.Policy.Len())
	}
	if err != nil {
		b.secondaryFailed(shadowSide, "shadow", err)
		return
	}
	b.stats.compared.Add(1)
	pr := throttler.Evaluate(req.Policy, req.Now, req.Cost, primary.Allowed, primary.States)
	sr := throttler.Evaluate(req.Policy, req.Now, req.Cost, out.Allowed, out.States)
	kinds := compare(pr, sr)
	if kinds == 0 {
		return
	}
	b.stats.mismatches.Add(1)
	if kinds&VerdictDiffers != 0 {
		if pr.Allowed {
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
		pr.Identifier, sr.Identifier = req.Identifier, req.Identifier
		b.onMismatch(Mismatch{Kinds: kinds, Primary: primarySide, Request: req, PrimaryResult: pr, ShadowResult: sr})
	}
}

// compare returns how two evaluated results of one request differ, limit by
// limit, so that a different binding limit cannot hide a difference.
func compare(a, b throttler.Result) MismatchKind {
	var kinds MismatchKind
	if a.Allowed != b.Allowed {
		kinds |= VerdictDiffers
	}
	for i := range min(len(a.Limits), len(b.Limits)) {
		if a.Limits[i].Remaining != b.Limits[i].Remaining {
			kinds |= RemainingDiffers
		}
		if !a.Limits[i].ResetAt.Equal(b.Limits[i].ResetAt) {
			kinds |= ResetDiffers
		}
	}
	return kinds
}
