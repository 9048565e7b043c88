package throttler

import (
	"hash/maphash"
	"sync"
	"time"

	"github.com/throttlekit/throttlekit/throttler/driver"
)

// denyCache remembers recent denials, so that a request that would be
// denied again is answered without a backend call. It is exact, because no
// process can reopen a fixed window before its stored end or move a GCRA
// state back, with one exception: a refund or reset made by another
// process, which the cache misses for at most its staleness bound. A local
// Refund or Reset forgets the identifier's entry.
type denyCache struct {
	seed     maphash.Seed
	perShard int
	maxStale time.Duration
	shards   [denyShards]denyShard
}

const denyShards = 16

type denyShard struct {
	mu      sync.Mutex
	entries map[denyKey]*denial
}

// denyKey names an identifier under a policy name; the denial holds the
// definition it was made under.
type denyKey struct {
	policy, id string
}

// denial is a remembered denied result: requests of at least cost under the
// same policy definition at a clock reading before until are denied too.
type denial struct {
	policy *driver.Policy
	result Result
	cost   int64
	until  time.Time
}

func newDenyCache(entries int, maxStale time.Duration) *denyCache {
	c := &denyCache{seed: maphash.MakeSeed(), perShard: max(1, (entries+denyShards-1)/denyShards), maxStale: maxStale}
	for i := range c.shards {
		c.shards[i].entries = make(map[denyKey]*denial)
	}
	return c
}

func (c *denyCache) shard(id string) *denyShard {
	return &c.shards[maphash.String(c.seed, id)%denyShards]
}

// lookup returns the cached denial of a request of cost at now, with its
// figures moved to now, and whether there was one.
func (c *denyCache) lookup(p *Policy, id string, cost int64, now time.Time) (Result, bool) {
	sh := c.shard(id)
	key := denyKey{p.compiled.Name, id}
	sh.mu.Lock()
	d := sh.entries[key]
	if d == nil || d.policy != p.compiled {
		sh.mu.Unlock()
		return Result{}, false
	}
	if !now.Before(d.until) || now.Before(d.result.At) {
		// Expired, or a clock that stepped back before the denial: ask
		// the store.
		delete(sh.entries, key)
		sh.mu.Unlock()
		return Result{}, false
	}
	if cost < d.cost {
		sh.mu.Unlock()
		return Result{}, false
	}
	r := d.result
	sh.mu.Unlock()
	elapsed := now.Sub(r.At)
	// The per-limit figures stay those of the denial, every denying
	// limit's RetryAfter counted down by the time since.
	r.limits.shifted, r.limits.shift = true, elapsed
	r.RetryAfter = max(r.RetryAfter-elapsed, time.Millisecond)
	r.At = now
	r.Cached = true
	return r, true
}

// remember stores a denial of a request of cost.
func (c *denyCache) remember(p *Policy, r *Result, cost int64) {
	if r.Allowed || r.Degraded || r.NeverAllowed || r.RetryAfter <= 0 || cost <= 0 {
		return
	}
	until := r.At.Add(min(r.RetryAfter, c.maxStale))
	sh := c.shard(r.Identifier)
	key := denyKey{p.compiled.Name, r.Identifier}
	stored := *r
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if _, ok := sh.entries[key]; !ok && len(sh.entries) >= c.perShard {
		c.evictLocked(sh, r.At)
	}
	sh.entries[key] = &denial{policy: p.compiled, result: stored, cost: cost, until: until}
}

// evictLocked makes room in a full shard: every expired entry goes, and if
// none had expired, one entry chosen by map order, which is random.
func (c *denyCache) evictLocked(sh *denyShard, now time.Time) {
	evicted := false
	for k, d := range sh.entries {
		if !now.Before(d.until) {
			delete(sh.entries, k)
			evicted = true
		}
	}
	if evicted {
		return
	}
	for k := range sh.entries {
		delete(sh.entries, k)
		return
	}
}

// forget drops the cached denial of id under p's name, whatever the
// definition it was made under.
func (c *denyCache) forget(p *Policy, id string) {
	sh := c.shard(id)
	sh.mu.Lock()
	delete(sh.entries, denyKey{p.compiled.Name, id})
	sh.mu.Unlock()
}
