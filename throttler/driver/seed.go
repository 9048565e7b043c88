package driver

import (
	"context"
	"fmt"
	"time"
)

// Seeder is implemented by backends that can take states another store
// decided, so that an identifier's windows move with it from one store to
// another (a rollout's mirror and split modes, a key-layout upgrade, a way
// in from a hand-written limiter).
//
// Seed merges given, one state per limit of req.Policy in order, into the
// stored states exactly as the package function Merge does at req.Now,
// then decides req.Cost on the merged states as Decide would (cost 0: the
// merge alone), all in one atomic step. It returns the verdict and the
// states after the step in Outcome.States, and the states the store held
// before it in Outcome.Prior. A given slice whose length does not match
// the policy is invalid input (ErrInvalidState).
//
// Fallback: without Seeder, a rollout cannot carry state to the backend:
// its mirror mode replays each decision instead, and its split mode starts
// a moved identifier afresh on its new backend.
type Seeder interface {
	Seed(ctx context.Context, req Request, given []State) (Outcome, error)
}

// InForce returns s as it counts for limit l at now, in a canonical form
// that two stores holding equivalent states agree on:
//
//   - fixed windows: s when its window is open (End > now, Used not below
//     0), the zero State when it is closed;
//   - GCRA: s when its TAT lies after now, the zero State otherwise;
//   - sliding window: the counts in force at now (Sliding 1) written as
//     End = the end of the window holding now (or the later End a clock
//     ahead of this one wrote), Used = the current count, Prev = the
//     previous one; the zero State when both counts are 0.
//
// The zero State means that s no longer matters at now: a store may drop it.
func InForce(l *Limit, s State, now time.Time) State {
	switch l.Algorithm {
	case GCRA:
		if s.End > now.UnixMicro() {
			return State{End: s.End}
		}
	case SlidingWindow:
		cur, prev, end, _ := slidingCounts(l, s, now.UnixMilli())
		if cur > 0 || prev > 0 {
			return State{Used: cur, End: end, Prev: prev}
		}
	default:
		if s.End > now.UnixMilli() {
			return State{Used: max(s.Used, 0), End: s.End}
		}
	}
	return State{}
}

// Merge writes given into held, in place, limit by limit at now, and
// reports whether any held state changed. Both are first read as they count
// at now (InForce). Then, per limit:
//
//  1. a given state that counts nothing at now (a closed window, a TAT at
//     or before now, a sliding window whose counts are both 0) is ignored:
//     held stays as it is;
//  2. otherwise, when held counts nothing, held becomes the given state;
//  3. otherwise both count:
//     - fixed windows (anchored and aligned): the store keeps the window
//     it holds, its End unchanged, and Used becomes the larger of the
//     two counts. With the same End that is one window's writers racing
//     (a window's count only grows); with a different End one of the two
//     is a window the caller could not vouch for (read from a store
//     another process opened its own window in, or written late), and
//     neither its reset nor a unit either store counted is given away;
//     - GCRA: the later TAT;
//     - sliding window: the same End keeps the larger Used and the larger
//     Prev; a different End (a clock ahead wrote one of them) keeps the
//     later one, as Sliding 1 keeps a clock's units that runs ahead: both
//     are aligned, so the later one is the same series further on.
//
// So a merge never moves the End of a fixed window that is open at now,
// forward or back (a ResetAt a client was shown stays until that window
// closes), never lowers a count in force, and never moves a TAT or a
// sliding window back. Merging a state into a store that already holds it
// changes nothing, so a write repeated or arriving late changes nothing
// either, or only raises a count. A slice whose length does not match the
// policy changes nothing.
func Merge(p *Policy, now time.Time, held, given []State) bool {
	if len(held) != len(p.Limits) || len(given) != len(p.Limits) {
		return false
	}
	changed := false
	for i := range p.Limits {
		l := &p.Limits[i]
		g := InForce(l, given[i], now)
		if g == (State{}) {
			continue
		}
		h := InForce(l, held[i], now)
		next := g
		if h != (State{}) {
			next = mergeOne(l, h, g)
		}
		if next != h {
			held[i] = next
			changed = true
		}
	}
	return changed
}

// mergeOne returns the merge of two states that both count at now, already
// in their InForce form (rule 3 of Merge).
func mergeOne(l *Limit, h, g State) State {
	switch l.Algorithm {
	case GCRA:
		return State{End: max(h.End, g.End)}
	case SlidingWindow:
		switch {
		case g.End == h.End:
			return State{Used: max(h.Used, g.Used), End: h.End, Prev: max(h.Prev, g.Prev)}
		case g.End > h.End:
			return g
		}
		return h
	}
	// Fixed windows: the held window stays, whatever End the given one has.
	return State{Used: max(h.Used, g.Used), End: h.End}
}

// Seed is the reference implementation of Seeder.Seed on one identifier's
// states: it merges given into states (Merge), then decides cost on the
// result (Decide). It returns the verdict; states holds the states after
// both steps (after the merge alone when the decision is denied).
func Seed(p *Policy, now time.Time, cost int64, states, given []State) bool {
	Merge(p, now, states, given)
	return Decide(p, now, cost, states)
}

// CheckGiven returns an error wrapping ErrInvalidState unless given holds
// one state per limit of p, with no negative count or time. Seeders call
// it before touching the store.
func CheckGiven(p *Policy, given []State) error {
	if len(given) != len(p.Limits) {
		return fmt.Errorf("%w: %d states for the %d limits of policy %q", ErrInvalidState, len(given), len(p.Limits), p.Name)
	}
	for i, s := range given {
		if s.Used < 0 || s.End < 0 || s.Prev < 0 {
			return fmt.Errorf("%w: limit %q: negative field in %+v", ErrInvalidState, p.Limits[i].Name, s)
		}
	}
	return nil
}

// Horizon returns how long a state of policy p can matter after the
// decision that wrote it: the longest over its limits of Window (fixed
// windows), twice Window (sliding), and Capacity × EmissionMicros (GCRA,
// at least Window). An identifier that no store has decided for during
// the last Horizon holds nothing that counts anywhere.
func Horizon(p *Policy) time.Duration {
	var h time.Duration
	for i := range p.Limits {
		l := &p.Limits[i]
		d := l.Window
		switch l.Algorithm {
		case SlidingWindow:
			d = 2 * l.Window
		case GCRA:
			d = max(l.Window, time.Duration(l.Capacity*l.EmissionMicros)*time.Microsecond)
		}
		h = max(h, d)
	}
	return h
}
