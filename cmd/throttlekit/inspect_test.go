package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	memcachedbackend "github.com/throttlekit/throttlekit/backend/memcached"
	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	redisgroups "github.com/throttlekit/throttlekit/backend/redis/groups"
	"github.com/throttlekit/throttlekit/internal/localserver"
	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// mirrorRollout is a rollout in mirror mode from memcached to two Redis
// groups (a primary and a replica each), on real servers.
type mirrorRollout struct {
	memcached         string
	groups            string
	replicas          []*localserver.Redis
	oldPrefix, newPre string
	th                *throttler.Throttler
	rb                *rollout.Backend
}

func startMirrorRollout(t *testing.T) *mirrorRollout {
	t.Helper()
	localserver.SkipIfShort(t)
	m := &mirrorRollout{oldPrefix: "tk-old", newPre: "app-v2:"}
	m.memcached = localserver.MemcachedT(t, localserver.MemcachedOptions{}).Addr()
	var groups []string
	for _, name := range []string{"a", "b"} {
		primary := localserver.RedisT(t, localserver.RedisOptions{})
		replica := localserver.RedisReplicaT(t, primary, localserver.RedisOptions{})
		m.replicas = append(m.replicas, replica)
		groups = append(groups, fmt.Sprintf("%s=redis://%s?replica=redis://%s", name, primary.Addr(), replica.Addr()))
	}
	m.groups = groups[0] + "," + groups[1]

	mc, err := memcachedbackend.NewClient(2*time.Second, m.memcached)
	require.NoError(t, err)
	t.Cleanup(func() { _ = mc.Close() })
	oldBackend, err := memcachedbackend.New(mc, memcachedbackend.WithPrefix(m.oldPrefix))
	require.NoError(t, err)
	newBackend, err := redisgroups.Open(m.groups, redisgroups.WithBackendOptions(redisbackend.WithPrefix(m.newPre)))
	require.NoError(t, err)
	t.Cleanup(func() { _ = newBackend.Close() })
	source, err := rollout.NewStaticSource(50)
	require.NoError(t, err)
	m.rb, err = rollout.New(oldBackend, newBackend, source, rollout.WithMode(rollout.MirrorMode))
	require.NoError(t, err)
	m.th, err = throttler.New(m.rb, throttler.WithLogger(nil), throttler.WithCallTimeout(5*time.Second))
	require.NoError(t, err)
	return m
}

// sync waits until the replicas have what the primaries were sent: peeks
// on redis-groups read replicas.
func (m *mirrorRollout) sync(t *testing.T) {
	t.Helper()
	for _, r := range m.replicas {
		require.NoError(t, r.WaitReplicaSynced(10*time.Second))
	}
}

func (m *mirrorRollout) sides() []string {
	return []string{"--old", "memcached=" + m.memcached, "--old-prefix", m.oldPrefix,
		"--new", "redis-groups=" + m.groups, "--new-prefix", m.newPre}
}

func TestInspectAndResetAcrossMirrorRollout(t *testing.T) {
	m := startMirrorRollout(t)
	ctx := context.Background()
	const spec = "core: 100/min, 1000/d gcra burst=50"
	policy, err := throttler.ParsePolicy("core", "100/min, 1000/d gcra burst=50")
	require.NoError(t, err)

	// Traffic: identifier i spends i+1 units. Both sides of the split serve
	// some of them; mirror mode records every allowed unit on both.
	ids := make([]string, 8)
	sidesSeen := map[rollout.Side]bool{}
	for i := range ids {
		ids[i] = fmt.Sprintf("user:%d", i)
		sidesSeen[m.rb.Side(ids[i])] = true
		for range i + 1 {
			r, err := m.th.Allow(ctx, policy, ids[i])
			require.NoError(t, err)
			require.True(t, r.Allowed)
			require.False(t, r.Degraded, "%v", r.Err)
		}
	}
	require.Len(t, sidesSeen, 2, "the identifiers should be split over both backends")
	require.Zero(t, m.rb.Stats().SecondaryErrors)
	m.sync(t)

	args := append([]string{"inspect", "--json", "--policy", spec}, m.sides()...)
	for i, id := range ids {
		code, out, errOut := runCLI(t, append(args, id)...)
		require.Equal(t, exitOK, code, "stderr: %s\nstdout: %s", errOut, out)
		doc := decode[inspectDoc](t, out)
		assert.Equal(t, "inspect", doc.Command)
		assert.Equal(t, id, doc.Identifier)
		assert.Equal(t, "core", doc.Policy.Name)
		assert.True(t, doc.Found)
		require.Len(t, doc.Sides, 2)
		assert.Equal(t, []string{"old", "new"}, []string{doc.Sides[0].Side, doc.Sides[1].Side})
		assert.Equal(t, "memcached", doc.Sides[0].Backend)
		assert.Equal(t, m.oldPrefix, doc.Sides[0].Prefix)
		assert.Equal(t, "redis-groups", doc.Sides[1].Backend)
		assert.Equal(t, m.newPre, doc.Sides[1].Prefix)
		assert.Contains(t, []string{"a", "b"}, doc.Sides[1].Group)
		spent := int64(i + 1)
		for _, s := range doc.Sides {
			require.True(t, s.OK, "%s: %s", s.Side, s.Error)
			require.Len(t, s.Limits, 2)
			fixed, gcra := s.Limits[0], s.Limits[1]
			assert.Equal(t, limitDoc{Name: "100/min", Algorithm: "fixed", WindowMs: 60000, Limit: 100, Used: spent,
				Remaining: 100 - spent, ResetAt: fixed.ResetAt, ResetInMs: fixed.ResetInMs}, fixed, "%s %s", id, s.Side)
			assert.Greater(t, fixed.ResetInMs, int64(50_000))
			assert.Equal(t, int64(50), gcra.Limit)
			assert.Equal(t, spent, gcra.Used, "%s %s gcra", id, s.Side)
			assert.Equal(t, 50-spent, gcra.Remaining)
		}
		// Mirror mode records the serving side's decisions on the other at
		// the same now: the same window end on both.
		assert.Equal(t, doc.Sides[0].Limits[0].ResetAt, doc.Sides[1].Limits[0].ResetAt, id)
	}

	// Which side serves each identifier: rollout's own hashing, at the
	// source's 50 %, as the rollout itself routes it.
	for _, id := range ids {
		code, out, errOut := runCLI(t, append(args, "--percent", "50", id)...)
		require.Equal(t, exitOK, code, errOut)
		ro := decode[inspectDoc](t, out).Rollout
		require.NotNil(t, ro, id)
		assert.Equal(t, rollout.DefaultStaticGroupID, ro.GroupID)
		assert.Equal(t, rollout.Bucket(rollout.DefaultStaticGroupID, id), ro.Bucket)
		require.NotNil(t, ro.Percent)
		assert.Equal(t, m.rb.Side(id).String(), ro.Serving, id)
	}
	code, out, _ := runCLI(t, append([]string{"inspect", "--policy", spec, "--percent", "100"}, append(m.sides(), ids[0])...)...)
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, "At 100%, the new side serves it.")
	assert.Regexp(t, `Rollout: "user:0" is in bucket \d+ of group "throttlekit-rollout": the new side serves it at \d+% and above`, out)

	// Inspect consumed nothing.
	code, out, _ = runCLI(t, append(args, ids[3])...)
	require.Equal(t, exitOK, code)
	assert.Equal(t, int64(4), decode[inspectDoc](t, out).Sides[1].Limits[0].Used)

	// The table for people.
	code, out, _ = runCLI(t, append([]string{"inspect", "--policy", spec}, append(m.sides(), ids[2])...)...)
	require.Equal(t, exitOK, code)
	assert.Contains(t, out, `Identifier "user:2", policy core: 100/min, 1000/day gcra burst=50`)
	assert.Regexp(t, `old\s+memcached 127\.0\.0\.1:\d+\s+100/min\s+3\s+97\s+100\s+`, out)
	assert.Regexp(t, `new\s+redis-groups groups a,b \(group [ab]\)\s+100/min\s+3\s+97\s+100\s+`, out)

	// Reset one identifier on both sides.
	code, out, errOut := runCLI(t, append([]string{"reset", "--json", "--policy", spec}, append(m.sides(), ids[5])...)...)
	require.Equal(t, exitOK, code, errOut)
	reset := decode[resetDoc](t, out)
	assert.Equal(t, "reset", reset.Command)
	require.Len(t, reset.Sides, 2)
	for _, s := range reset.Sides {
		assert.True(t, s.OK, "%s: %s", s.Side, s.Error)
	}
	m.sync(t)
	code, out, errOut = runCLI(t, append(args, ids[5])...)
	require.Equal(t, exitNotFound, code, "after reset every limit is whole: %s", errOut)
	doc := decode[inspectDoc](t, out)
	assert.False(t, doc.Found)
	for _, s := range doc.Sides {
		require.True(t, s.OK, s.Error)
		assert.Equal(t, int64(0), s.Limits[0].Used, s.Side)
		assert.Equal(t, int64(100), s.Limits[0].Remaining, s.Side)
		assert.Equal(t, int64(0), s.Limits[1].Used, s.Side)
		assert.Equal(t, int64(50), s.Limits[1].Remaining, s.Side)
	}
	code, out, _ = runCLI(t, append([]string{"inspect", "--policy", spec}, append(m.sides(), ids[5])...)...)
	assert.Equal(t, exitNotFound, code)
	assert.Contains(t, out, "No state stored on any side")

	// The others keep their counts.
	code, out, _ = runCLI(t, append(args, ids[6])...)
	require.Equal(t, exitOK, code)
	for _, s := range decode[inspectDoc](t, out).Sides {
		assert.Equal(t, int64(7), s.Limits[0].Used, s.Side)
	}

	// The table form of reset, and a full quota for the application too.
	code, out, _ = runCLI(t, append([]string{"reset", "--policy", spec}, append(m.sides(), ids[6])...)...)
	require.Equal(t, exitOK, code)
	assert.Regexp(t, `old\s+memcached 127\.0\.0\.1:\d+\s+reset`, out)
	assert.Regexp(t, `new\s+redis-groups groups a,b\s+reset`, out)
	r, err := m.th.Peek(ctx, policy, ids[6])
	require.NoError(t, err)
	assert.Equal(t, int64(0), r.Limits()[0].Used)

	// A wrong policy name finds nothing: the name is part of every key.
	code, _, _ = runCLI(t, append([]string{"inspect", "--json", "--policy", "api: 100/min, 1000/d gcra burst=50"}, append(m.sides(), ids[7])...)...)
	assert.Equal(t, exitNotFound, code)
}

func TestInspectSingleBackends(t *testing.T) {
	localserver.SkipIfShort(t)
	ctx := context.Background()
	policy, err := throttler.ParsePolicy("api", "10/min")
	require.NoError(t, err)

	r := localserver.RedisT(t, localserver.RedisOptions{})
	client := goredis.NewClient(&goredis.Options{Addr: r.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	rb, err := redisbackend.New(client)
	require.NoError(t, err)
	th, err := throttler.New(rb, throttler.WithLogger(nil), throttler.WithCallTimeout(5*time.Second))
	require.NoError(t, err)
	for range 3 {
		_, err := th.Allow(ctx, policy, "user:42")
		require.NoError(t, err)
	}
	code, out, errOut := runCLI(t, "inspect", "user:42", "--redis", "redis://"+r.Addr(), "--policy", "api: 10/min", "--json")
	require.Equal(t, exitOK, code, errOut)
	doc := decode[inspectDoc](t, out)
	require.Len(t, doc.Sides, 1)
	assert.Equal(t, "main", doc.Sides[0].Side)
	assert.Equal(t, redisbackend.DefaultPrefix, doc.Sides[0].Prefix)
	assert.Equal(t, int64(3), doc.Sides[0].Limits[0].Used)

	code, _, errOut = runCLI(t, "reset", "user:42", "--redis", "redis://"+r.Addr(), "--policy", "api: 10/min")
	require.Equal(t, exitOK, code, errOut)
	code, _, _ = runCLI(t, "inspect", "user:42", "--redis", "redis://"+r.Addr(), "--policy", "api: 10/min")
	assert.Equal(t, exitNotFound, code)

	// A key of another type is a backend failure, exit 1, not a figure.
	key := rb.Key(mustCompiled(t, policy), "user:7")
	require.NoError(t, client.RPush(ctx, key, "x").Err())
	code, out, _ = runCLI(t, "inspect", "user:7", "--redis", "redis://"+r.Addr(), "--policy", "api: 10/min")
	assert.Equal(t, exitFailed, code)
	assert.Contains(t, out, "Error on the main side, redis "+r.Addr()+": ")
	assert.NotContains(t, out, "No state stored", "a side that failed was not read")
}

func mustCompiled(t *testing.T, p *throttler.Policy) *driver.Policy {
	t.Helper()
	dp, err := compiled(p)
	require.NoError(t, err)
	return dp
}

func TestExplainKeysExistOnServers(t *testing.T) {
	localserver.SkipIfShort(t)
	ctx := context.Background()
	const spec = "10/s name=per-sec, 100/min aligned, 5000/h gcra burst=20, 300/10min sliding"
	policy, err := parsePolicy("core", spec)
	require.NoError(t, err)
	id := "tenant 7/user:42"

	r := localserver.RedisT(t, localserver.RedisOptions{})
	client := goredis.NewClient(&goredis.Options{Addr: r.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	rb, err := redisbackend.New(client, redisbackend.WithPrefix("app:"))
	require.NoError(t, err)
	mcAddr := localserver.MemcachedT(t, localserver.MemcachedOptions{}).Addr()
	mc, err := memcachedbackend.NewClient(time.Second, mcAddr) // at most the call timeout below
	require.NoError(t, err)
	t.Cleanup(func() { _ = mc.Close() })
	mb, err := memcachedbackend.New(mc, memcachedbackend.WithPrefix("app:"))
	require.NoError(t, err)
	for _, b := range []driver.Backend{rb, mb} {
		th, err := throttler.New(b, throttler.WithLogger(nil), throttler.WithCallTimeout(5*time.Second))
		require.NoError(t, err)
		res, err := th.Allow(ctx, policy, id)
		require.NoError(t, err)
		require.False(t, res.Degraded, "%v", res.Err)
	}

	code, out, errOut := runCLI(t, "explain", "--json", "--prefix", "app:", "--policy-name", "core", "--id", id, spec)
	require.Equal(t, exitOK, code, errOut)
	doc := decode[explainDoc](t, out)
	require.Len(t, doc.Limits, 4)
	assert.Contains(t, doc.Limits[3].MemcachedKeys, "sliding")
	for _, l := range doc.Limits {
		n, err := client.Exists(ctx, l.RedisKey).Result()
		require.NoError(t, err)
		assert.Equal(t, int64(1), n, "Redis key %s", l.RedisKey)
		for kind, key := range l.MemcachedKeys {
			if kind == "counter" {
				continue // named after the window's end and a random token
			}
			_, err := mc.Get(key)
			assert.NoError(t, err, "memcached %s key %s", kind, key)
		}
	}
	// A window item names its counter: route|c:limit:end:token.
	item, err := mc.Get(doc.Limits[0].MemcachedKeys["window"])
	require.NoError(t, err)
	var end int64
	var token string
	_, err = fmt.Sscanf(string(item.Value), "%d %s", &end, &token)
	require.NoError(t, err)
	counter := doc.Limits[0].MemcachedKeys["counter"]
	counter = counter[:len(counter)-len("<end>:<token>")] + fmt.Sprintf("%d:%s", end, token)
	_, err = mc.Get(counter)
	assert.NoError(t, err, "counter %s", counter)
}

// TestInspectWrongNotationForOneLimit: a policy whose notation differs from
// the application's for one limit finds that limit's key empty. inspect
// names it in a warning; when no limit matches at all, it exits 4.
func TestInspectWrongNotationForOneLimit(t *testing.T) {
	localserver.SkipIfShort(t)
	ctx := context.Background()
	r := localserver.RedisT(t, localserver.RedisOptions{})
	client := goredis.NewClient(&goredis.Options{Addr: r.Addr()})
	t.Cleanup(func() { _ = client.Close() })
	backend, err := redisbackend.New(client)
	require.NoError(t, err)
	th, err := throttler.New(backend, throttler.WithLogger(nil), throttler.WithCallTimeout(5*time.Second))
	require.NoError(t, err)
	// Windows of an hour and a day: none closes while the test runs.
	policy, err := throttler.ParsePolicy("api", "100/h, 1000/d")
	require.NoError(t, err)
	for range 3 {
		res, err := th.Allow(ctx, policy, "user:7")
		require.NoError(t, err)
		require.False(t, res.Degraded, "%v", res.Err)
	}
	url := "redis://" + r.Addr()

	// The application's notation: no warning.
	code, out, errOut := runCLI(t, "inspect", "--json", "--redis", url, "--policy", "api: 100/h, 1000/d", "user:7")
	require.Equal(t, exitOK, code, errOut)
	assert.Empty(t, decode[inspectDoc](t, out).LimitsWithoutState)
	assert.NotContains(t, errOut, "warning")

	// The day limit written as a sliding window: another key.
	code, out, errOut = runCLI(t, "inspect", "--json", "--redis", url, "--policy", "api: 100/h, 1000/d sliding", "user:7")
	require.Equal(t, exitOK, code, errOut)
	doc := decode[inspectDoc](t, out)
	assert.True(t, doc.Found)
	assert.Equal(t, []string{"1000/day sliding"}, doc.LimitsWithoutState)
	assert.Contains(t, errOut, `warning: no state stored for limit 1000/day sliding (key ":sliding:86400000")`)
	assert.Equal(t, int64(3), doc.Sides[0].Limits[0].Used)

	// Every limit wrong: nothing matched, exit 4, with the hint.
	code, out, _ = runCLI(t, "inspect", "--redis", url, "--policy", "api: 100/h gcra, 1000/d sliding", "user:7")
	assert.Equal(t, exitNotFound, code)
	assert.Contains(t, out, "or the policy's name or limits\nare not the application's")

	// --percent and --group-id describe a rollout; 101 is no percentage.
	code, _, errOut = runCLI(t, "inspect", "--redis", url, "--policy", "api: 100/h", "--percent", "50", "user:7")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "give --old and --new")
	code, _, errOut = runCLI(t, "inspect", "--old", "redis="+url, "--new", "redis="+url, "--new-prefix", "x:", "--policy", "api: 100/h", "--percent", "101", "user:7")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "want 0 to 100")
}
