package driver

import (
	"context"
	"time"
)

// Request is one operation for one identifier, as a backend receives it.
// The throttler has validated every field before a backend sees it: Policy
// is built by NewPolicy, Identifier is 1 to MaxIdentifierLen bytes, Now lies
// between the Unix epoch and MaxUnixMilli, and Cost is 0 to
// Policy.Capacity for Decide, Peek and Seed, 1 or more for Take and 0 or
// more for Refund. The last two have no upper bound: a Take or a Refund of
// math.MaxInt64 units is valid, so compute min(n, what is there) before
// multiplying n by anything (a GCRA refund's n*T overflows; Refund and
// Take show how).
type Request struct {
	// Policy holds the limits to decide, all together.
	Policy *Policy
	// Identifier is what is being limited: arbitrary bytes, NUL, braces,
	// colons and invalid UTF-8 included. A store that keys by one string
	// encodes it: EscapeKey gives at most 3 × MaxIdentifierLen bytes of
	// letters, digits and "-._%", enough for Redis, memcached and SQL text;
	// AlnumKey gives lower-case letters and digits only, for stores that
	// refuse '%' or treat '.' as a separator (NATS KV) or compare keys
	// without case. EscapeKey says which store needs which.
	Identifier string
	// Cost is the number of units to consume (Decide, Take, Seed) or give
	// back (Refund). Zero is a peek.
	Cost int64
	// Now is the throttler clock's reading, at the clock's full precision
	// (nanoseconds; it is neither truncated nor rounded, and its location
	// is the clock's). Backends decide with it and never with a clock of
	// their own. The algorithms read it as Now.UnixMilli() for windows and
	// Now.UnixMicro() for GCRA, which truncate (Now is never before the
	// epoch, so that is the floor): a store must receive those integers,
	// never a time value it might round (a SQL timestamp column rounds to
	// microseconds) nor its own clock's reading.
	Now time.Time
	// Buffer, when not nil, is an empty slice with room for one state per
	// limit of Policy. A backend may append its Outcome's states to it
	// instead of allocating a slice of its own. It belongs to the
	// throttler: a backend must not keep it after the call returns.
	Buffer []State
}

// States returns an empty slice with room for one state per limit of
// r.Policy: r.Buffer when it has that room, a new slice otherwise.
func (r *Request) States() []State {
	if n := len(r.Policy.Limits); cap(r.Buffer) >= n {
		return r.Buffer[:0]
	}
	return make([]State, 0, len(r.Policy.Limits))
}

// Outcome is a backend's answer: its verdict and the limit states after the
// operation, one per limit of the request's policy, in order. The throttler
// computes every figure of the result from these states with Evaluate.
type Outcome struct {
	// Allowed is the verdict: for Decide, Peek and Seed, what the package
	// function Decide returns on the states (after Seed's merge). For cost
	// 0 it is true unless a state is already beyond its limit: Used above
	// a Max that was lowered, a sliding count over Max, or a GCRA TAT later
	// than now + Capacity×T (a lowered burst, a clock that stepped back);
	// the throttler reports it as the peek's Allowed. Refund sets it to
	// true; Take sets it to Granted > 0.
	Allowed bool
	// States holds the states after the operation, one per limit of the
	// request's policy, in order; the zero State for a limit the store
	// holds nothing for. A State that counts nothing at Now (InForce is
	// zero) is equivalent to the zero State.
	States []State
	// Granted is, for Taker.Take, the units granted (Allowed is Granted >
	// 0); other operations leave it zero.
	Granted int64
	// Prior is, for Seeder.Seed, the states the store held before the
	// step, one per limit; other operations leave it nil.
	Prior []State
}

// Backend stores limit state and decides requests. It is the one interface a
// store must implement; the optional interfaces below add capabilities.
//
// Implementations must be safe for concurrent use by any number of
// goroutines, processes and hosts deciding for the same identifier. Each
// operation is atomic over all the limits of its policy for one
// identifier: a lock (or transaction, or script) that covers the pair
// (Policy.Name, Identifier) and is shared by Decide, Take, Refund, Seed and
// Reset is enough, since two policy names never share state and every
// definition of one name does. A lease operation needs the pair
// (ConcurrencyLimit.Key, Identifier). A coarser lock is correct and only
// slower; one per limit is not enough.
type Backend interface {
	// Decide applies req to the identifier's policy atomically, exactly as
	// the package function Decide would on the stored states: allowed only
	// if every limit allows; then every limit consumes req.Cost; denied:
	// nothing changes. Cost 0 changes nothing and opens no window. It
	// returns the verdict and the states after the decision. A failure of
	// the store is returned as an error, never as a verdict. Decide must
	// return promptly once ctx is done.
	Decide(ctx context.Context, req Request) (Outcome, error)
}

// Peeker is implemented by backends that can answer a peek more cheaply than
// Decide with cost 0, for instance from a replica. Peek must never change
// state. A replica may lag: Peek returns the states it read, and Evaluate
// ignores any window that is closed at req.Now.
//
// Fallback: without Peeker, the throttler calls Decide with Cost 0.
type Peeker interface {
	Peek(ctx context.Context, req Request) (Outcome, error)
}

// Refunder is implemented by backends that can give units back. Refund gives
// back up to req.Cost units of the current windows, exactly as the package
// function Refund would, atomically for all limits, and returns the states
// after it with Allowed set to true: a fixed window's Used falls by up to
// req.Cost, not below 0; a GCRA TAT moves back by up to req.Cost×T, not
// before now; a sliding window's current count (End at or after the end of
// the window holding now) falls by up to req.Cost, not below 0, and its
// previous count is history and stays. A closed window, a past TAT and a
// sliding state whose current window is empty are left alone. req.Cost may
// be any n >= 0, math.MaxInt64 included.
//
// Fallback: without Refunder, the throttler's Refund returns
// errors.ErrUnsupported, and its AllowAll peeks every subject before
// consuming any, so that a denial is usually known before anything is spent.
type Refunder interface {
	Refund(ctx context.Context, req Request) (Outcome, error)
}

// Resetter is implemented by backends that can forget an identifier's state
// for a policy (an administrator's operation).
//
// Fallback: without Resetter, the throttler's Reset returns
// errors.ErrUnsupported.
type Resetter interface {
	Reset(ctx context.Context, p *Policy, identifier string) error
}

// Taker is implemented by backends that can take up to req.Cost units
// atomically: grant the largest k <= req.Cost that every limit allows,
// charge every limit k in one atomic step, exactly as the package function
// Take does, and return k in Granted with the states after it (the states
// as they were when k is 0).
//
// Fallback: without Taker, the throttler peeks, decides the headroom it
// saw with Decide and peeks again if a concurrent request took it first.
// That is atomic per attempt but costs two round trips.
type Taker interface {
	Take(ctx context.Context, req Request) (Outcome, error)
}

// takeAttempts bounds the rounds of TakeWith when concurrent requests keep
// taking the headroom it saw.
const takeAttempts = 4

// TakeWith takes up to req.Cost units on b: with b's own Take when b is a
// Taker; otherwise by rounds of a peek (Peeker, or Decide with cost 0) and
// a Decide of the headroom the peek showed, until a Decide is allowed or
// the headroom is gone. Each round is atomic; a round whose headroom a
// concurrent request took first is tried again, up to four times. It is
// the fallback the throttler and the decorators use for backends without
// Taker.
func TakeWith(ctx context.Context, b Backend, req Request) (Outcome, error) {
	if tk, ok := b.(Taker); ok {
		return tk.Take(ctx, req)
	}
	var out Outcome
	for range takeAttempts {
		var err error
		out, err = PeekWith(ctx, b, req)
		if err != nil {
			return Outcome{}, err
		}
		k := min(req.Cost, Headroom(req.Policy, req.Now, out.States))
		if k <= 0 {
			return Outcome{States: out.States}, nil
		}
		decide := req
		decide.Cost = k
		out, err = b.Decide(ctx, decide)
		if err != nil {
			return Outcome{}, err
		}
		if out.Allowed {
			out.Granted = k
			return out, nil
		}
	}
	// Every round lost its headroom to concurrent requests: nothing
	// granted, with the states of the last denial.
	return Outcome{States: out.States}, nil
}

// PeekWith answers a peek (req with cost 0) on b: with b's own Peek when b
// is a Peeker, otherwise with Decide of cost 0, the fallback Peeker
// documents. Decorators and the throttler use it wherever they peek.
func PeekWith(ctx context.Context, b Backend, req Request) (Outcome, error) {
	req.Cost = 0
	if pk, ok := b.(Peeker); ok {
		return pk.Peek(ctx, req)
	}
	return b.Decide(ctx, req)
}

// Pinger is implemented by backends that can check their store is reachable.
//
// Fallback: without Pinger, the throttler's Ping reports nil.
type Pinger interface {
	Ping(ctx context.Context) error
}

// Nonblocking is implemented by backends whose calls never wait on I/O or
// on another process, such as an in-process store. For them the throttler
// skips the per-call timeout, whose context would cost more than the call.
// A decorator reports true only when every backend it wraps does.
//
// Fallback: without Nonblocking, every call is bounded by the per-call
// timeout.
type Nonblocking interface {
	Nonblocking() bool
}

// Closer is implemented by backends that own resources: clients they
// opened themselves, goroutines. Close releases them; later calls return an
// error wrapping ErrClosed. Close never deletes or expires stored state,
// nor releases anything stored state depends on (a lease or TTL that the
// store would then expire): the windows belong to every process sharing
// the store and outlive this one. A client passed to a backend's constructor stays
// the caller's to close. A decorator (sharded, rollout) owns the backends it
// wraps, so its Close closes each of them that implements Closer.
//
// Fallback: without Closer there is nothing to release.
type Closer interface {
	Close() error
}
