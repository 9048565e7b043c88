package main

import (
	"context"
	"fmt"
	"math"
	"math/bits"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	goredis "github.com/redis/go-redis/v9"

	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	redisgroups "github.com/throttlekit/throttlekit/backend/redis/groups"
	"github.com/throttlekit/throttlekit/internal/keyslot"
)

const cleanupDescription = `Cleanup deletes from Redis every key that starts with --prefix, whatever its
type: the keys of a layout that is no longer served, after a migration to a
new prefix or a new set of groups. It works the way operators do it by hand, so that the
server keeps serving while it runs:

  - SCAN with MATCH <prefix>* and COUNT --count walks the keyspace (never
    KEYS); on a Cluster every primary is scanned, --parallel of them at a
    time; with --redis-groups every group's primary (replicas follow by
    replication).
  - Each batch SCAN returns is deleted by a small Lua script (EVALSHA) that
    UNLINKs the batch's keys, checking again that each starts with the
    prefix. On a Cluster the keys are grouped by hash slot and each slot's
    keys get a script call of their own, pipelined, so no call spans slots.
  - Deletions are paced to --rate keys per second in all (0: unpaced).
  - On a terminal, a progress bar on stderr shows how much of the keyspace
    the scan has covered; otherwise a count line every second. A summary
    follows on stdout: keyspace, scanned, matched, deleted, elapsed.
  - SIGINT or SIGTERM stops it after the batch in flight; the summary is
    printed and the exit status is 3. Run the same command again to finish:
    it scans anew and finds only the keys left.

--dry-run scans and counts the keys that would be deleted and changes
nothing. --prefix is required and is never taken from the environment.
Cleanup refuses an empty prefix, and a prefix that would match the keys of a
live layout: the Redis backend's default prefix "` + redisbackend.DefaultPrefix + `" and every
--keep prefix, unless --force is given. Memcached needs no cleanup: its
items expire on their own, at most 33 s after their windows end.

  throttlekit cleanup --redis redis://127.0.0.1:6379 --prefix app-v1: --dry-run
  throttlekit cleanup --redis-cluster redis://10.0.0.1:7000 --prefix app-v1: --rate 20000

Counts: "keyspace" is the keys on the scanned nodes when the scan began
(DBSIZE), "scanned" the part of it the SCAN cursors have covered (exact once
a node is done, estimated from the cursor before), "matched" the keys SCAN
returned (a key can be returned twice if Redis resizes its table during the
scan), "deleted" the keys the scripts removed.
`

// Bounds on --count. SCAN's COUNT is the work per call; above 10,000 a
// call, or the script deleting its batch, could stall the server.
const (
	defaultScanCount = 1000
	maxScanCount     = 10000
	// maxScriptKeys bounds the keys one script call deletes, so that no
	// call runs for long.
	maxScriptKeys = 500
	// defaultRate is the default pace, in keys per second.
	defaultRate = 20000
)

// deleteScript deletes the keys in KEYS that start with ARGV[1] and returns
// how many existed. The prefix check repeats SCAN's MATCH on the server,
// so that a key that does not start with the prefix is never deleted,
// whatever the client sent.
var deleteScript = goredis.NewScript(`
local prefix = ARGV[1]
local n = 0
for i = 1, #KEYS do
  local k = KEYS[i]
  if string.sub(k, 1, #prefix) == prefix then
    n = n + redis.call('UNLINK', k)
  end
end
return n
`)

// listFlag is a repeatable, comma-separated string flag.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(s string) error {
	*l = append(*l, splitList(s)...)
	return nil
}

type cleanupOpts struct {
	prefix   string
	dryRun   bool
	rate     float64
	count    int64
	force    bool
	keep     listFlag
	progress string
	json     bool
	timeout  time.Duration
	parallel int
}

// cleanupTarget is the Redis deployment cleanup works on.
type cleanupTarget struct {
	kind    string
	target  string
	nodes   []*goredis.Client      // standalone server, or the groups' primaries
	cluster *goredis.ClusterClient // a Cluster; nodes is empty then
	close   func()
}

func runCleanup(ctx context.Context, a *app, args []string) error {
	fs := newFlagSet("cleanup", "cleanup --prefix PREFIX [flags]", cleanupDescription)
	cf := addConnFlags(fs, false, false, false)
	var o cleanupOpts
	fs.StringVar(&o.prefix, "prefix", "", "delete the keys that start with this `prefix` (required)")
	fs.BoolVar(&o.dryRun, "dry-run", false, "count the keys that would be deleted; change nothing")
	fs.Float64Var(&o.rate, "rate", defaultRate, "pace deletions to this many `keys/s` in all; 0 means unpaced")
	fs.Int64Var(&o.count, "count", defaultScanCount, "SCAN COUNT: keys examined per SCAN call (1 to 10000)")
	fs.BoolVar(&o.force, "force", false, "delete even when the prefix matches a protected live prefix")
	fs.Var(&o.keep, "keep", "`prefix` of a live layout to protect (repeatable or comma-separated); \""+redisbackend.DefaultPrefix+"\" always is, unless --force")
	fs.StringVar(&o.progress, "progress", "auto", "progress `display`: auto (a bar when stderr is a terminal, else count lines), bar, lines or none")
	fs.IntVar(&o.parallel, "parallel", 1, "`nodes` cleaned at the same time (Cluster primaries, groups' primaries)")
	fs.BoolVar(&o.json, "json", false, "print the summary as a JSON document (schema in the package documentation)")
	if memcachedFlagGiven(args) {
		return usagef(cleanupOnRedisOnly)
	}
	pos, err := parseFlags(fs, a, args)
	if err != nil {
		return err
	}
	cf.resolve(fs, a.getenv, false)
	o.timeout = cf.timeout
	if len(pos) > 0 {
		return usagef("cleanup takes no arguments, got %q", pos[0])
	}
	if err := o.check(); err != nil {
		return err
	}
	t, err := openCleanupTarget(cf)
	if err != nil {
		return err
	}
	defer t.close()
	c := &cleaner{a: a, opts: o, target: t, pacer: &pacer{rate: o.rate}}
	return c.run(ctx)
}

// check validates the options; errors are usageErrors.
func (o *cleanupOpts) check() error {
	switch {
	case o.prefix == "":
		return usagef("refusing an empty --prefix: it would delete every key on the server")
	case math.IsNaN(o.rate) || math.IsInf(o.rate, 0) || o.rate < 0:
		return usagef("--rate must be 0 (unpaced) or a positive number of keys per second")
	case o.count < 1 || o.count > maxScanCount:
		return usagef("--count must be 1 to %d", maxScanCount)
	case o.timeout <= 0:
		return usagef("--timeout must be positive")
	case o.parallel < 1:
		return usagef("--parallel must be at least 1")
	}
	switch o.progress {
	case "auto", "bar", "lines", "none":
	default:
		return usagef("--progress must be auto, bar, lines or none")
	}
	if !o.force {
		for _, live := range append([]string{redisbackend.DefaultPrefix}, o.keep...) {
			// Every key of a live layout is live + "{" + escaped identifier
			// + "}" ...: the prefix matches some of them when it starts the
			// live prefix, or when it starts with the live prefix and a brace.
			if strings.HasPrefix(live, o.prefix) || strings.HasPrefix(o.prefix, live+"{") {
				return usagef("refusing --prefix %q: it also matches the keys of the live prefix %q (give --force if those are to go too)", o.prefix, live)
			}
		}
	}
	return nil
}

func openCleanupTarget(cf *connFlags) (*cleanupTarget, error) {
	var given []spec
	for _, k := range kinds {
		if v := strings.TrimSpace(*cf.single[k]); v != "" {
			given = append(given, spec{k, v})
		}
	}
	switch {
	case len(given) == 0:
		return nil, usagef("no Redis: give --redis, --redis-cluster or --redis-groups")
	case len(given) > 1:
		return nil, usagef("give one Redis deployment: --%s and --%s were both given", given[0].kind, given[1].kind)
	}
	s := given[0]
	t := &cleanupTarget{kind: s.kind}
	switch s.kind {
	case kindRedis:
		opts, err := goredis.ParseURL(s.value)
		if err != nil {
			return nil, usagef("--redis: %v", redactedError(s.value, err))
		}
		opts.ContextTimeoutEnabled = true
		client := goredis.NewClient(opts)
		t.target, t.nodes, t.close = opts.Addr, []*goredis.Client{client}, func() { _ = client.Close() }
	case kindRedisCluster:
		opts, err := goredis.ParseClusterURL(s.value)
		if err != nil {
			return nil, usagef("--redis-cluster: %v", redactedError(s.value, err))
		}
		opts.ContextTimeoutEnabled = true
		client := goredis.NewClusterClient(opts)
		t.target, t.cluster, t.close = strings.Join(opts.Addrs, ","), client, func() { _ = client.Close() }
	case kindRedisGroups:
		groups, err := redisgroups.Parse(s.value)
		if err != nil {
			return nil, usagef("--redis-groups: %v", err)
		}
		var names []string
		for _, g := range groups {
			o := *g.Primary
			o.ContextTimeoutEnabled = true
			t.nodes = append(t.nodes, goredis.NewClient(&o))
			names = append(names, g.Name)
		}
		t.target = "groups " + strings.Join(names, ",")
		t.close = func() {
			for _, n := range t.nodes {
				_ = n.Close()
			}
		}
	case kindMemcached:
		return nil, usagef(cleanupOnRedisOnly)
	}
	return t, nil
}

// cleanupStats are a run's counters, updated by every node's goroutine.
type cleanupStats struct {
	nodes, keyspace, scanned, scanCalls, matched, deleted atomic.Int64
}

// cleaner runs one cleanup.
type cleaner struct {
	a       *app
	opts    cleanupOpts
	target  *cleanupTarget
	pacer   *pacer
	stats   cleanupStats
	batches atomic.Int64
	// completed counts the nodes scanned to the end.
	completed atomic.Int64

	mu   sync.Mutex
	errs []string
}

// cleanupDoc is the JSON document of cleanup (schema in doc.go).
type cleanupDoc struct {
	Command   string   `json:"command"`
	Backend   string   `json:"backend"`
	Target    string   `json:"target"`
	Prefix    string   `json:"prefix"`
	Pattern   string   `json:"pattern"`
	DryRun    bool     `json:"dry_run"`
	Status    string   `json:"status"`
	Nodes     int64    `json:"nodes"`
	Keyspace  int64    `json:"keyspace"`
	Scanned   int64    `json:"scanned"`
	ScanCalls int64    `json:"scan_calls"`
	Matched   int64    `json:"matched"`
	Deleted   int64    `json:"deleted"`
	ElapsedMs int64    `json:"elapsed_ms"`
	Errors    []string `json:"errors,omitempty"`
}

func (c *cleaner) run(ctx context.Context) error {
	start := time.Now()
	rep := newReporter(c)
	rep.start()
	// Commands run on a context that signals do not cancel, each bounded by
	// --timeout: a signal stops the loop between batches, never a batch
	// half sent.
	opCtx := context.WithoutCancel(ctx)
	// At most --parallel nodes at a time: ForEachMaster starts them all.
	turns := make(chan struct{}, c.opts.parallel)
	clean := func(node *goredis.Client) {
		turns <- struct{}{}
		defer func() { <-turns }()
		c.cleanNode(ctx, opCtx, node)
	}
	if c.target.cluster != nil {
		err := c.target.cluster.ForEachMaster(opCtx, func(_ context.Context, node *goredis.Client) error {
			clean(node)
			return nil
		})
		if err != nil {
			c.fail(fmt.Errorf("cluster: %w", err))
		}
	} else {
		var wg sync.WaitGroup
		for _, node := range c.target.nodes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				clean(node)
			}()
		}
		wg.Wait()
	}
	elapsed := time.Since(start)
	status := "done"
	switch {
	case len(c.errs) > 0:
		status = "failed"
	case c.completed.Load() < c.stats.nodes.Load():
		status = "interrupted"
	}
	rep.finish(status == "done")
	doc := cleanupDoc{Command: "cleanup", Backend: c.target.kind, Target: c.target.target,
		Prefix: c.opts.prefix, Pattern: matchPattern(c.opts.prefix), DryRun: c.opts.dryRun, Status: status,
		Nodes: c.stats.nodes.Load(), Keyspace: c.stats.keyspace.Load(), Scanned: c.stats.scanned.Load(),
		ScanCalls: c.stats.scanCalls.Load(), Matched: c.stats.matched.Load(), Deleted: c.stats.deleted.Load(),
		ElapsedMs: elapsed.Milliseconds(), Errors: c.errs}
	if c.opts.json {
		if err := writeJSON(c.a.stdout, doc); err != nil {
			return err
		}
	} else {
		printCleanup(c.a, &doc, elapsed)
	}
	switch status {
	case "interrupted":
		return errInterrupted
	case "failed":
		return errReported
	}
	return nil
}

func (c *cleaner) fail(err error) {
	c.mu.Lock()
	c.errs = append(c.errs, err.Error())
	c.mu.Unlock()
}

// cleanNode scans one server to the end, or until ctx is done, deleting
// each batch (unless dry-run). Failures are recorded, not returned: the
// other nodes go on, and a rerun retries.
func (c *cleaner) cleanNode(ctx, opCtx context.Context, node *goredis.Client) {
	addr := node.Options().Addr
	fail := func(what string, err error) { c.fail(fmt.Errorf("%s: %s: %w", addr, what, err)) }
	ns, err := c.inspectNode(opCtx, node)
	if err != nil {
		fail("DBSIZE", err)
		return
	}
	c.stats.nodes.Add(1)
	c.stats.keyspace.Add(ns.dbsize)
	if !c.opts.dryRun {
		cctx, cancel := context.WithTimeout(opCtx, c.opts.timeout)
		err := deleteScript.Load(cctx, node).Err()
		cancel()
		if err != nil {
			fail("SCRIPT LOAD", err)
			return
		}
	}
	pattern := matchPattern(c.opts.prefix)
	var cursor uint64
	var covered int64 // this node's share of stats.scanned
	for ctx.Err() == nil {
		cctx, cancel := context.WithTimeout(opCtx, c.opts.timeout)
		keys, next, err := node.Scan(cctx, cursor, pattern, c.opts.count).Result()
		cancel()
		if err != nil {
			fail("SCAN", err)
			return
		}
		c.stats.scanCalls.Add(1)
		keys = withPrefix(keys, c.opts.prefix)
		c.stats.matched.Add(int64(len(keys)))
		if !c.opts.dryRun && len(keys) > 0 {
			if c.pacer.wait(ctx, len(keys)) != nil {
				return // interrupted before this batch: the rerun finds it
			}
			n, err := c.deleteBatch(opCtx, node, keys)
			c.stats.deleted.Add(n)
			if err != nil {
				fail("delete", err)
				return
			}
		}
		reached := ns.dbsize
		if next != 0 {
			reached = min(int64(ns.fraction(next)*float64(ns.dbsize)), ns.dbsize)
		}
		if reached > covered {
			c.stats.scanned.Add(reached - covered)
			covered = reached
		}
		if hook := c.a.afterBatch; hook != nil {
			hook(c.batches.Add(1))
		}
		if next == 0 {
			c.completed.Add(1)
			return
		}
		cursor = next
	}
}

// deleteBatch deletes keys on node with the script, in calls of at most
// maxScriptKeys keys, all pipelined in one round trip. On a Cluster node
// each call holds the keys of one hash slot only.
func (c *cleaner) deleteBatch(ctx context.Context, node *goredis.Client, keys []string) (int64, error) {
	var groups [][]string
	if c.target.cluster != nil {
		bySlot := map[int][]string{}
		for _, k := range keys {
			s := keyslot.Of(k)
			bySlot[s] = append(bySlot[s], k)
		}
		slots := make([]int, 0, len(bySlot))
		for s := range bySlot {
			slots = append(slots, s)
		}
		sort.Ints(slots)
		for _, s := range slots {
			groups = append(groups, chunk(bySlot[s], maxScriptKeys)...)
		}
	} else {
		groups = chunk(keys, maxScriptKeys)
	}
	cctx, cancel := context.WithTimeout(ctx, c.opts.timeout)
	defer cancel()
	cmds := make([]*goredis.Cmd, len(groups))
	// The pipeline's own error is that of its first failed command; each
	// command is looked at below.
	_, _ = node.Pipelined(cctx, func(p goredis.Pipeliner) error {
		for i, g := range groups {
			cmds[i] = deleteScript.EvalSha(cctx, p, g, c.opts.prefix)
		}
		return nil
	})
	var deleted int64
	var errs []error
	for i, cmd := range cmds {
		n, err := cmd.Int64()
		if err != nil && retryable(err) {
			// NOSCRIPT: the script cache was flushed since SCRIPT LOAD; MOVED
			// or ASK: the slot moved. Run it alone, through the cluster client
			// when there is one, which follows redirects; Run loads the script
			// when the server lacks it.
			var via goredis.Scripter = node
			if c.target.cluster != nil {
				via = c.target.cluster
			}
			n, err = deleteScript.Run(cctx, via, groups[i], c.opts.prefix).Int64()
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		deleted += n
	}
	if len(errs) > 0 {
		return deleted, fmt.Errorf("%d of %d script calls failed, first: %w", len(errs), len(cmds), errs[0])
	}
	return deleted, nil
}

func retryable(err error) bool {
	return goredis.HasErrorPrefix(err, "NOSCRIPT") || goredis.HasErrorPrefix(err, "MOVED") ||
		goredis.HasErrorPrefix(err, "ASK") || goredis.HasErrorPrefix(err, "TRYAGAIN")
}

func chunk(keys []string, n int) [][]string {
	var out [][]string
	for len(keys) > n {
		out = append(out, keys[:n:n])
		keys = keys[n:]
	}
	if len(keys) > 0 {
		out = append(out, keys)
	}
	return out
}

// withPrefix returns the keys that start with prefix. SCAN's MATCH has
// already filtered them; this is a second, client-side check.
func withPrefix(keys []string, prefix string) []string {
	out := keys[:0]
	for _, k := range keys {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	return out
}

// matchPattern returns the SCAN MATCH pattern of the keys starting with
// prefix: the prefix with its glob characters escaped, then '*'.
func matchPattern(prefix string) string {
	var b strings.Builder
	for i := 0; i < len(prefix); i++ {
		switch ch := prefix[i]; ch {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
			b.WriteByte(ch)
		default:
			b.WriteByte(ch)
		}
	}
	b.WriteByte('*')
	return b.String()
}

// nodeScan is what the progress estimate needs to know about a node.
type nodeScan struct {
	dbsize int64
	// slotCursor reports a cursor whose low 14 bits hold a hash slot: a
	// Cluster node of Redis 7.4 or later (or Valkey 8 or later), which
	// keeps one table per slot and scans them in slot order.
	slotCursor bool
	owned      []int // sorted slots the node serves, when slotCursor
}

// inspectNode reads the node's key count and, on a Cluster node, how its
// SCAN cursor is laid out.
func (c *cleaner) inspectNode(ctx context.Context, node *goredis.Client) (*nodeScan, error) {
	cctx, cancel := context.WithTimeout(ctx, c.opts.timeout)
	defer cancel()
	n, err := node.DBSize(cctx).Result()
	if err != nil {
		return nil, err
	}
	ns := &nodeScan{dbsize: n}
	if c.target.cluster == nil {
		return ns, nil
	}
	info, err := node.Info(cctx, "server").Result()
	if err != nil || !slotCursorVersion(info) {
		return ns, nil // the estimate is only an estimate
	}
	ns.slotCursor = true
	ns.owned, _ = ownedSlots(cctx, node) // without them, the estimate spans all slots
	return ns, nil
}

// ownedSlots returns the hash slots a Cluster node serves, sorted.
func ownedSlots(ctx context.Context, node *goredis.Client) ([]int, error) {
	id, err := node.ClusterMyID(ctx).Result()
	if err != nil {
		return nil, err
	}
	shards, err := node.ClusterShards(ctx).Result()
	if err != nil {
		return nil, err
	}
	var owned []int
	for _, sh := range shards {
		for _, n := range sh.Nodes {
			if n.ID != id {
				continue
			}
			for _, r := range sh.Slots {
				for s := max(r.Start, 0); s <= r.End && s < 16384; s++ {
					owned = append(owned, int(s))
				}
			}
		}
	}
	sort.Ints(owned)
	return owned, nil
}

// slotCursorVersion reports whether INFO server describes a server whose
// Cluster SCAN cursor carries the slot in its low bits.
func slotCursorVersion(info string) bool {
	fields := map[string]string{}
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			fields[k] = v
		}
	}
	if v, ok := fields["valkey_version"]; ok {
		return versionAtLeast(v, 8, 0)
	}
	return versionAtLeast(fields["redis_version"], 7, 4)
}

func versionAtLeast(v string, major, minor int) bool {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return false
	}
	ma, err1 := strconv.Atoi(parts[0])
	mi, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return false
	}
	return ma > major || ma == major && mi >= minor
}

// fraction estimates the part of the node's keyspace a scan has covered
// when SCAN returned cursor. Redis scans a table in reverse binary order
// of its buckets, so the cursor's bits reversed, over 2^64, is the part of
// the table visited; that holds across resizes, which is what makes SCAN
// complete. With one table per slot, the slot's rank among the node's
// slots comes first.
func (ns *nodeScan) fraction(cursor uint64) float64 {
	if !ns.slotCursor {
		return reversedFraction(cursor)
	}
	slot := int(cursor & 16383)
	inner := reversedFraction(cursor >> 14)
	if len(ns.owned) == 0 {
		return (float64(slot) + inner) / 16384
	}
	rank := sort.SearchInts(ns.owned, slot)
	return min((float64(rank)+inner)/float64(len(ns.owned)), 1)
}

func reversedFraction(cursor uint64) float64 {
	return float64(bits.Reverse64(cursor)) / (1 << 64)
}

// pacer spaces batches so that deletions proceed at rate keys per second
// overall: each batch waits for the time its predecessors' keys take at
// that rate. Time not used (a slow server) is not caught up later.
type pacer struct {
	rate float64
	mu   sync.Mutex
	next time.Time
}

// wait blocks until a batch of n keys may go, or ctx is done (its error).
func (p *pacer) wait(ctx context.Context, n int) error {
	if p.rate <= 0 {
		return ctx.Err()
	}
	p.mu.Lock()
	now := time.Now()
	if p.next.Before(now) {
		p.next = now
	}
	at := p.next
	p.next = p.next.Add(time.Duration(float64(n) / p.rate * float64(time.Second)))
	p.mu.Unlock()
	d := time.Until(at)
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func printCleanup(a *app, doc *cleanupDoc, elapsed time.Duration) {
	w := a.stdout
	what := "Cleanup"
	if doc.DryRun {
		what = "Dry run"
	}
	fmt.Fprintf(w, "%s of prefix %q on %s %s: %s\n", what, doc.Prefix, doc.Backend, doc.Target, doc.Status)
	tw := newTable(w)
	row(tw, "  nodes", doc.Nodes)
	row(tw, "  keyspace", formatCount(doc.Keyspace)+" keys when the scan began")
	row(tw, "  scanned", fmt.Sprintf("%s keys (%s SCAN calls, MATCH %s)", formatCount(doc.Scanned), formatCount(doc.ScanCalls), doc.Pattern))
	if doc.DryRun {
		row(tw, "  matched", formatCount(doc.Matched)+" keys would be deleted")
	} else {
		row(tw, "  matched", formatCount(doc.Matched))
		row(tw, "  deleted", formatCount(doc.Deleted))
	}
	rate := ""
	if s := elapsed.Seconds(); s > 0 {
		n := doc.Deleted
		if doc.DryRun {
			n = doc.Matched
		}
		rate = fmt.Sprintf(" (%s keys/s)", formatCount(int64(float64(n)/s)))
	}
	row(tw, "  elapsed", roundDuration(elapsed).String()+rate)
	tw.Flush()
	for _, e := range doc.Errors {
		fmt.Fprintf(w, "  error: %s\n", e)
	}
	if doc.Status == "interrupted" {
		fmt.Fprintln(w, "Interrupted: run the same command again to finish; it scans anew and finds only the keys left.")
	}
}

// cleanupOnRedisOnly is cleanup's answer to a memcached backend.
const cleanupOnRedisOnly = "cleanup works on Redis only: memcached items expire on their own, at most 33 s after their windows end"

// memcachedFlagGiven reports whether args give --memcached, which cleanup
// does not register, before any "--": the refusal then says why instead of
// "flag provided but not defined".
func memcachedFlagGiven(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && name == kindMemcached {
			return true
		}
	}
	return false
}
