package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler"
)

const sidesHelp = `Backends: give one of --redis, --redis-cluster, --redis-groups or
--memcached, or the two sides of a rollout (package rollout) as --old and
--new, each KIND=VALUE where KIND is redis, redis-cluster, redis-groups or
memcached and VALUE is what that flag takes:

  --old memcached=10.0.0.1:11211,10.0.0.2:11211 --old-prefix tk
  --new 'redis-groups=a=redis://10.0.0.3:6379?replica=redis://10.0.0.4:6379,b=redis://10.0.0.5:6379'
  --new-prefix app-v2:

Environment variables give defaults: THROTTLEKIT_REDIS, _REDIS_CLUSTER,
_REDIS_GROUPS, _MEMCACHED, _OLD and _NEW are used only when no backend flag
is given; THROTTLEKIT_PREFIX, _OLD_PREFIX, _NEW_PREFIX, _POLICY and
_POLICY_NAME fill the flags of those names when they are not given.
`

const inspectDescription = `Inspect shows, for every limit of the policy, what the identifier has used,
what remains and when the limit is whole again, on every side (the old and
the new backend of a rollout, both when both are given). It peeks
(Throttler.Peek): nothing is consumed and no window is opened. A side that
holds nothing shows full quotas. The policy and its name must be the
application's: stored keys hold the policy name and each limit's name
(none for an unnamed limit), algorithm and window, and a GCRA limit's burst
when set; not its max.

  throttlekit inspect --redis redis://127.0.0.1:6379 --policy "10/s, 5000/h" user:42

A limit that holds no state on any side while others do is named in a
warning on stderr: its window may have closed, or its notation (name,
algorithm, window, GCRA burst) differs from the application's, so its key
is not the one the application writes ('throttlekit explain' shows the
keys). Exit status 4 when no limit holds state on any side (nothing
matched: check the policy and its name); 1 when a side failed (its error
is in the output).

With --old and --new, inspect also says which side serves the identifier:
its bucket (1 to 100) under the rollout's group ID (--group-id: the Unleash
toggle's groupId, the feature name unless pinned, or WithStaticGroupID's
value; default "` + rollout.DefaultStaticGroupID + `"), the percentage from which the
new side serves it and, given the rollout's percentage (--percent), the
side serving now. A rollout in split mode may still read the other side
once after a move (see package rollout).

` + sidesHelp

const resetDescription = `Reset forgets the identifier's state under the policy (Throttler.Reset) on
every side, so that every limit is whole again at once. With --old and
--new, both sides are reset, as rollout.Backend.Reset does. A side that
fails does not stop the others; the exit status is then 1.

  throttlekit reset --memcached 127.0.0.1:11211 --policy "10/s, 5000/h" user:42

` + sidesHelp

// inspectDoc is the JSON document of inspect (schema in doc.go).
type inspectDoc struct {
	Command    string    `json:"command"`
	Identifier string    `json:"identifier"`
	Policy     policyDoc `json:"policy"`
	At         string    `json:"at"`
	Found      bool      `json:"found"`
	// LimitsWithoutState names the limits that hold no state on any side
	// that answered, when others do.
	LimitsWithoutState []string    `json:"limits_without_state,omitempty"`
	Rollout            *rolloutDoc `json:"rollout,omitempty"`
	Sides              []sideDoc   `json:"sides"`
}

// rolloutDoc says which side of a rollout serves the identifier.
type rolloutDoc struct {
	GroupID string `json:"group_id"`
	Bucket  int    `json:"bucket"`
	// NewFrom is the smallest percentage at which the new side serves the
	// identifier: its bucket.
	NewFrom int `json:"new_from_percent"`
	// Percent and Serving are present when --percent was given.
	Percent *int   `json:"percent,omitempty"`
	Serving string `json:"serving,omitempty"`
}

type sideDoc struct {
	Side    string     `json:"side"`
	Backend string     `json:"backend"`
	Target  string     `json:"target"`
	Prefix  string     `json:"prefix"`
	Group   string     `json:"group,omitempty"`
	OK      bool       `json:"ok"`
	Error   string     `json:"error,omitempty"`
	Limits  []limitDoc `json:"limits,omitempty"`
}

type limitDoc struct {
	Name      string `json:"name"`
	Algorithm string `json:"algorithm"`
	WindowMs  int64  `json:"window_ms"`
	Limit     int64  `json:"limit"`
	Used      int64  `json:"used"`
	Remaining int64  `json:"remaining"`
	ResetAt   string `json:"reset_at"`
	ResetInMs int64  `json:"reset_in_ms"`
}

// target is what inspect and reset work on: the identifier, the policy
// and the opened sides.
type target struct {
	id     string
	policy *throttler.Policy
	sides  []*side
	close  func()
	json   bool
	tmo    time.Duration
	// rollout is set for inspect over --old and --new.
	rollout *rolloutDoc
}

// setupTarget parses the flags shared by inspect and reset and opens the
// sides.
func setupTarget(a *app, name, description string, args []string) (*target, error) {
	fs := newFlagSet(name, name+" [flags] ID", description)
	cf := addConnFlags(fs, true, true, true)
	pf := addPolicyFlags(fs, true)
	asJSON := fs.Bool("json", false, "print a JSON document (schema in the package documentation)")
	var groupID *string
	var percent *int
	if name == "inspect" {
		groupID = fs.String("group-id", rollout.DefaultStaticGroupID, "with --old and --new: the rollout's group `ID` identifiers are hashed with (the Unleash toggle's groupId)")
		percent = fs.Int("percent", -1, "with --old and --new: the rollout's current `percentage` (0 to 100), to show the side serving the identifier now")
	}
	pos, err := parseFlags(fs, a, args)
	if err != nil {
		return nil, err
	}
	cf.resolve(fs, a.getenv, true)
	pf.resolve(fs, a.getenv)
	if len(pos) != 1 {
		return nil, usagef("want one identifier, got %d arguments", len(pos))
	}
	if err := checkIdentifier(pos[0]); err != nil {
		return nil, err
	}
	if cf.timeout <= 0 {
		return nil, usagef("--timeout must be positive")
	}
	p, err := parsePolicy(pf.name, pf.spec)
	if err != nil {
		return nil, err
	}
	specs, err := cf.sides()
	if err != nil {
		return nil, err
	}
	var ro *rolloutDoc
	if groupID != nil {
		ro, err = serving(pos[0], specs, *groupID, *percent, fs)
		if err != nil {
			return nil, err
		}
	}
	sides, closeAll, err := openSides(specs, cf.timeout)
	if err != nil {
		return nil, err
	}
	return &target{id: pos[0], policy: p, sides: sides, close: closeAll, json: *asJSON, tmo: cf.timeout, rollout: ro}, nil
}

// serving says which side of a rollout serves id, with rollout's own
// hashing (rollout.Bucket, rollout.Split.Side); nil for a single backend.
// --group-id and --percent are usage errors without --old and --new.
func serving(id string, specs []sideSpec, groupID string, percent int, fs *flag.FlagSet) (*rolloutDoc, error) {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if len(specs) != 2 {
		if given["group-id"] || given["percent"] {
			return nil, usagef("--group-id and --percent describe a rollout: give --old and --new")
		}
		return nil, nil
	}
	bucket := rollout.Bucket(groupID, id)
	ro := &rolloutDoc{GroupID: groupID, Bucket: bucket, NewFrom: bucket}
	if given["percent"] {
		split, err := rollout.NewSplit(percent, groupID)
		if err != nil {
			return nil, usagef("--percent %d: want 0 to 100", percent)
		}
		ro.Percent, ro.Serving = &percent, split.Side(id).String()
	}
	return ro, nil
}

// throttlerFor returns a quiet Throttler over one side, failing closed so
// that no failure reads as a figure.
func (t *target) throttlerFor(s *side) (*throttler.Throttler, error) {
	return throttler.New(s.backend, throttler.WithLogger(nil), throttler.WithCallTimeout(t.tmo),
		throttler.WithFailureMode(throttler.FailClosed))
}

func (t *target) sideDoc(s *side) sideDoc {
	return sideDoc{Side: s.name, Backend: s.kind, Target: s.target, Prefix: s.prefix, Group: s.ownerGroup(t.id)}
}

func runInspect(ctx context.Context, a *app, args []string) error {
	t, err := setupTarget(a, "inspect", inspectDescription, args)
	if err != nil {
		return err
	}
	defer t.close()
	now := time.Now()
	doc := &inspectDoc{Command: "inspect", Identifier: t.id, At: jsonTime(now),
		Policy: describePolicy(t.policy), Rollout: t.rollout}
	failed := false
	// stored counts, per limit name, the sides that answered with state
	// for it.
	stored := map[string]int{}
	for _, s := range t.sides {
		sd := t.sideDoc(s)
		r, err := t.peek(ctx, s)
		if err != nil {
			sd.Error = err.Error()
			failed = true
		} else {
			sd.OK = true
			for _, l := range r.Limits() {
				sd.Limits = append(sd.Limits, limitDoc{Name: l.Name, Algorithm: l.Algorithm.String(),
					WindowMs: l.Window.Milliseconds(), Limit: l.Limit, Used: l.Used, Remaining: l.Remaining,
					ResetAt: jsonTime(l.ResetAt), ResetInMs: max(l.ResetAt.Sub(r.At), 0).Milliseconds()})
				if l.Used > 0 {
					doc.Found = true
					stored[l.Name]++
				}
			}
		}
		doc.Sides = append(doc.Sides, sd)
	}
	if doc.Found {
		for _, l := range t.policy.Limits() {
			if stored[l.Name] == 0 {
				doc.LimitsWithoutState = append(doc.LimitsWithoutState, l.Name)
			}
		}
	}
	if t.json {
		if err := writeJSON(a.stdout, doc); err != nil {
			return err
		}
	} else {
		printInspect(a, doc)
	}
	if len(doc.LimitsWithoutState) > 0 {
		keys := limitKeyByName(t.policy)
		for _, name := range doc.LimitsWithoutState {
			fmt.Fprintf(a.stderr, "throttlekit inspect: warning: no state stored for limit %s (key %q) on any side, though other limits hold state: "+
				"its window may have closed, or its notation (name, algorithm, window, GCRA burst) is not the application's; 'throttlekit explain' shows the keys\n",
				name, keys[name])
		}
	}
	switch {
	case ctx.Err() != nil:
		return errInterrupted
	case failed:
		return errReported
	case !doc.Found:
		return errNotFound
	}
	return nil
}

// peek reads one side's figures; a degraded result is the side's failure.
func (t *target) peek(ctx context.Context, s *side) (throttler.Result, error) {
	th, err := t.throttlerFor(s)
	if err != nil {
		return throttler.Result{}, err
	}
	r, err := th.Peek(ctx, t.policy, t.id)
	if err != nil {
		return r, err
	}
	if r.Degraded {
		if r.Err != nil {
			return r, r.Err
		}
		return r, errors.New("backend failed")
	}
	return r, nil
}

func printInspect(a *app, doc *inspectDoc) {
	w := a.stdout
	fmt.Fprintf(w, "Identifier %q, policy %s, at %s\n\n", doc.Identifier, doc.Policy.Notation, doc.At)
	tw := newTable(w)
	row(tw, "SIDE", "BACKEND", "LIMIT", "USED", "REMAINING", "OF", "RESETS AT", "RESETS IN")
	var failed []string
	for _, s := range doc.Sides {
		backend := s.Backend + " " + s.Target
		if s.Group != "" {
			backend += " (group " + s.Group + ")"
		}
		if !s.OK {
			// A whole row of empty cells keeps the columns of the sides
			// that answered aligned; the error follows the table.
			row(tw, s.Side, backend, "(failed, see below)", "", "", "", "", "")
			failed = append(failed, fmt.Sprintf("%s side, %s: %s", s.Side, backend, s.Error))
			continue
		}
		for _, l := range s.Limits {
			row(tw, s.Side, backend, l.Name, l.Used, l.Remaining, l.Limit, l.ResetAt,
				roundDuration(time.Duration(l.ResetInMs)*time.Millisecond))
		}
	}
	tw.Flush()
	for _, f := range failed {
		fmt.Fprintln(w, "\nError on the "+f)
	}
	if ro := doc.Rollout; ro != nil {
		fmt.Fprintf(w, "\nRollout: %q is in bucket %d of group %q: the new side serves it at %d%% and above, the old side below.\n",
			doc.Identifier, ro.Bucket, ro.GroupID, ro.NewFrom)
		if ro.Percent != nil {
			fmt.Fprintf(w, "At %d%%, the %s side serves it.\n", *ro.Percent, ro.Serving)
		}
	}
	switch {
	case doc.Found:
	case len(failed) == 0:
		fmt.Fprintln(w, "\nNo state stored on any side: every limit is at its full quota, or the policy's name or limits\n"+
			"are not the application's ('throttlekit explain' shows the keys they are stored under).")
	case len(failed) < len(doc.Sides):
		fmt.Fprintln(w, "\nNo state stored on the sides that answered.")
	}
}

// limitKeyByName maps each limit's name to its key in layout 2, for messages.
func limitKeyByName(p *throttler.Policy) map[string]string {
	keys := map[string]string{}
	dp, err := compiled(p)
	if err != nil {
		return keys
	}
	for i, l := range p.Limits() {
		if i < len(dp.Limits) {
			keys[l.Name] = dp.Limits[i].Key
		}
	}
	return keys
}

// resetDoc is the JSON document of reset (schema in doc.go).
type resetDoc struct {
	Command    string    `json:"command"`
	Identifier string    `json:"identifier"`
	Policy     policyDoc `json:"policy"`
	Sides      []sideDoc `json:"sides"`
}

func runReset(ctx context.Context, a *app, args []string) error {
	t, err := setupTarget(a, "reset", resetDescription, args)
	if err != nil {
		return err
	}
	defer t.close()
	doc := &resetDoc{Command: "reset", Identifier: t.id, Policy: describePolicy(t.policy)}
	failed := false
	for _, s := range t.sides {
		sd := t.sideDoc(s)
		th, err := t.throttlerFor(s)
		if err == nil {
			err = th.Reset(ctx, t.policy, t.id)
		}
		if err != nil {
			sd.Error, failed = err.Error(), true
		} else {
			sd.OK = true
		}
		doc.Sides = append(doc.Sides, sd)
	}
	if t.json {
		if err := writeJSON(a.stdout, doc); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(a.stdout, "Identifier %q, policy %s\n\n", doc.Identifier, doc.Policy.Notation)
		tw := newTable(a.stdout)
		row(tw, "SIDE", "BACKEND", "RESULT")
		for _, s := range doc.Sides {
			result := "reset"
			if !s.OK {
				result = "error: " + s.Error
			}
			row(tw, s.Side, s.Backend+" "+s.Target, result)
		}
		tw.Flush()
	}
	switch {
	case ctx.Err() != nil:
		return errInterrupted
	case failed:
		return errReported
	}
	return nil
}
