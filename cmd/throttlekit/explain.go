package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	goredis "github.com/redis/go-redis/v9"

	memcachedbackend "github.com/throttlekit/throttlekit/backend/memcached"
	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	redisgroups "github.com/throttlekit/throttlekit/backend/redis/groups"
	shardedbackend "github.com/throttlekit/throttlekit/backend/sharded"
	"github.com/throttlekit/throttlekit/internal/keyslot"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

const explainDescription = `Explain parses a policy as the library does and prints each limit (name,
max, window, algorithm, burst, GCRA emission interval, storage key) and the
keys the Redis and memcached backends store for an example identifier. It
contacts no server. The policy comes as the argument or from --policy, in
the notation Policy.String prints and throttler.ParsePolicy reads:

  throttlekit explain "api: 10/s, 5000/h gcra burst=20"
  throttlekit explain --policy-name core --id user:42 "10/s name=per-sec, 5000/h"
  throttlekit explain "core: 10/s, 60/min aligned"

The policy's name is required ("NAME: " in front, or --policy-name):
stored keys hold it. Limit notation (throttler.ParseLimit): MAX/WINDOW,
window units ms, s, min (m), h, d, w with plurals and a count (100/2h);
then options: "aligned" (windows on multiples of the window since the
epoch), "sliding", "gcra" (smooth rate, burst = max), "gcra burst=N",
"name=NAME" (name="..." when it holds a space or a comma). An unnamed limit
is shown by its notation and stored under its algorithm and window only
(key ":fixed:1000"), never its max. With --redis-groups, the group that
owns the identifier is shown too.
`

// explainDoc is the JSON document of explain (schema in doc.go).
type explainDoc struct {
	Command    string         `json:"command"`
	Policy     policyDoc      `json:"policy"`
	Identifier string         `json:"identifier"`
	Limits     []explainLimit `json:"limits"`
	Redis      explainRedis   `json:"redis"`
	Memcached  explainMemc    `json:"memcached"`
}

type policyDoc struct {
	Name     string `json:"name"`
	Notation string `json:"notation"`
	Capacity int64  `json:"capacity"`
}

type explainLimit struct {
	Name               string            `json:"name"`
	Notation           string            `json:"notation"`
	Algorithm          string            `json:"algorithm"`
	Max                int64             `json:"max"`
	Window             string            `json:"window"`
	WindowMs           int64             `json:"window_ms"`
	Burst              int64             `json:"burst"`
	Capacity           int64             `json:"capacity"`
	EmissionIntervalUs int64             `json:"emission_interval_us"`
	Key                string            `json:"key"`
	RedisKey           string            `json:"redis_key"`
	RedisFields        []string          `json:"redis_fields"`
	MemcachedKeys      map[string]string `json:"memcached_keys"`
}

type explainRedis struct {
	Prefix  string `json:"prefix"`
	HashTag string `json:"hash_tag"`
	Slot    int    `json:"slot"`
	Group   string `json:"group,omitempty"`
}

type explainMemc struct {
	Prefix string `json:"prefix"`
	Route  string `json:"route"`
}

func runExplain(_ context.Context, a *app, args []string) error {
	fs := newFlagSet("explain", "explain [flags] POLICY", explainDescription)
	pf := addPolicyFlags(fs, true)
	id := fs.String("id", "user:42", "example `identifier` whose keys are shown")
	prefix := fs.String("prefix", "", "key `prefix` (default: the backend's own, \""+redisbackend.DefaultPrefix+"\" for Redis, \""+memcachedbackend.DefaultPrefix+"\" for memcached) (env "+envPrefix+")")
	groups := fs.String(kindRedisGroups, "", "redisgroups `CONFIG`; shows the group that owns the identifier (env "+envRedisGroups+")")
	asJSON := fs.Bool("json", false, "print a JSON document (schema in the package documentation)")
	pos, err := parseFlags(fs, a, args)
	if err != nil {
		return err
	}
	pf.resolve(fs, a.getenv)
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["prefix"] {
		*prefix = a.getenv(envPrefix)
	}
	if !set[kindRedisGroups] {
		*groups = a.getenv(envRedisGroups)
	}
	switch {
	case len(pos) > 1:
		return usagef("want one POLICY argument, got %d (quote the policy: \"10/s, 5000/h\")", len(pos))
	case len(pos) == 1 && set["policy"]:
		return usagef("give the policy as the argument or as --policy, not both")
	case len(pos) == 1:
		pf.spec = pos[0]
	}
	if err := checkIdentifier(*id); err != nil {
		return err
	}
	p, err := parsePolicy(pf.name, pf.spec)
	if err != nil {
		return err
	}
	doc, err := explain(p, *id, *prefix, *groups)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(a.stdout, doc)
	}
	printExplain(a, doc)
	return nil
}

// explain builds the explanation of p for identifier id.
func explain(p *throttler.Policy, id, prefix, groups string) (*explainDoc, error) {
	dp, err := compiled(p)
	if err != nil {
		return nil, usagef("%v", err)
	}
	redisPrefix := firstNonEmpty(prefix, redisbackend.DefaultPrefix)
	memcPrefix := firstNonEmpty(prefix, memcachedbackend.DefaultPrefix)

	// The Redis keys come from the backend itself; building one contacts
	// no server.
	client := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:0"})
	defer client.Close()
	rb, err := redisbackend.New(client, redisbackend.WithPrefix(redisPrefix))
	if err != nil {
		return nil, usagef("--prefix: %v", err)
	}
	items, err := memcachedbackend.ItemKeys(memcPrefix, dp, id)
	if err != nil {
		return nil, usagef("--prefix: %v", err)
	}
	redisKey := rb.Key(dp, id)
	route := items.Route

	doc := &explainDoc{
		Command:    "explain",
		Policy:     policyDoc{Name: dp.Name, Notation: p.String(), Capacity: dp.Capacity},
		Identifier: id,
		Redis: explainRedis{Prefix: redisPrefix, HashTag: "{" + driver.EscapeKey(id) + "}",
			Slot: keyslot.Of(redisKey)},
		Memcached: explainMemc{Prefix: memcPrefix, Route: route},
	}
	if groups != "" {
		cfg, err := redisgroups.Parse(groups)
		if err != nil {
			return nil, usagef("--redis-groups: %v", err)
		}
		names := make([]string, len(cfg))
		for i, g := range cfg {
			names[i] = g.Name
		}
		doc.Redis.Group = shardedbackend.Owner(names, id)
	}
	userLimits := p.Limits()
	for i, l := range dp.Limits {
		el := explainLimit{
			Name: l.Name, Notation: userLimits[i].String(), Algorithm: l.Algorithm.String(),
			Max: l.Max, Window: formatWindow(l.Window), WindowMs: l.WindowMillis,
			Burst: userLimits[i].Burst, Capacity: l.Capacity,
			Key: l.Key, RedisKey: redisKey, RedisFields: redisbackend.Fields(&dp.Limits[i]), MemcachedKeys: map[string]string{},
		}
		if l.Algorithm == driver.GCRA {
			el.EmissionIntervalUs = l.EmissionMicros // 0 for the window algorithms, which have none
		}
		switch it := items.Limits[i]; l.Algorithm {
		case driver.GCRA:
			el.MemcachedKeys["gcra"] = it.State
		case driver.SlidingWindow:
			el.MemcachedKeys["sliding"] = it.State
		default:
			el.MemcachedKeys["window"] = it.Window
			el.MemcachedKeys["counter"] = it.CounterStem + ":<end>:<token>"
		}
		doc.Limits = append(doc.Limits, el)
	}
	return doc, nil
}

func printExplain(a *app, doc *explainDoc) {
	w := a.stdout
	fmt.Fprintf(w, "Policy %s\n", doc.Policy.Notation)
	fmt.Fprintf(w, "Largest cost a request can be allowed: %d\n\n", doc.Policy.Capacity)
	tw := newTable(w)
	row(tw, "LIMIT", "MAX", "WINDOW", "ALGORITHM", "BURST", "EMISSION", "STORAGE KEY")
	for _, l := range doc.Limits {
		burst, emission := "-", "-"
		if l.Algorithm == driver.GCRA.String() {
			burst = fmt.Sprint(l.Capacity)
			emission = roundDuration(time.Duration(l.EmissionIntervalUs) * time.Microsecond).String()
		}
		row(tw, l.Name, l.Max, l.Window, l.Algorithm, burst, emission, l.Key)
	}
	tw.Flush()

	fmt.Fprintf(w, "\nRedis key for identifier %q (prefix %q, hash tag %s, cluster slot %d",
		doc.Identifier, doc.Redis.Prefix, doc.Redis.HashTag, doc.Redis.Slot)
	if doc.Redis.Group != "" {
		fmt.Fprintf(w, ", group %s", doc.Redis.Group)
	}
	fmt.Fprintln(w, "):")
	tw = newTable(w)
	row(tw, "LIMIT", "KEY", "FIELDS")
	for _, l := range doc.Limits {
		row(tw, l.Name, l.RedisKey, strings.Join(l.RedisFields, " "))
	}
	tw.Flush()
	fmt.Fprintln(w, `The key is one hash for the whole policy (layout 3): per limit, e holds the window's end (the TAT for gcra), u the count, p the previous window's count (sliding); x is the expiry last set.`)

	fmt.Fprintf(w, "\nmemcached keys (prefix %q; the route %q picks the server):\n", doc.Memcached.Prefix, doc.Memcached.Route)
	tw = newTable(w)
	row(tw, "LIMIT", "ITEM", "KEY")
	for _, l := range doc.Limits {
		name := l.Name
		for _, kind := range []string{"window", "counter", "gcra", "sliding"} {
			if k, ok := l.MemcachedKeys[kind]; ok {
				row(tw, name, kind, k)
				name = ""
			}
		}
	}
	tw.Flush()
	fmt.Fprintln(w, `A window item holds "end token"; its counter is named after both. A gcra item holds the arrival time in µs; a sliding item "used:end:prev".`)
}
