package redisgroups

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	shardedbackend "github.com/throttlekit/throttlekit/backend/sharded"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	redisbackend "github.com/throttlekit/throttlekit/backend/redis"
	"github.com/throttlekit/throttlekit/conformance"
	"github.com/throttlekit/throttlekit/internal/localserver"
	"github.com/throttlekit/throttlekit/internal/testkit"
	"github.com/throttlekit/throttlekit/rollout"
	"github.com/throttlekit/throttlekit/throttler"
	"github.com/throttlekit/throttlekit/throttler/driver"
	"github.com/throttlekit/throttlekit/throttler/throttlertest"
)

// TestConformance runs the conformance suite through the sharded backend
// over the three real shards: decisions on the primaries, peeks on the
// replicas, with the default options (batching on) and with
// WithoutBatching.
//
// Replication is asynchronous: a replica may answer a peek before it has
// applied the decision just made on its primary, and the suite checks that
// a peek sees every earlier decision. The harness therefore lets each
// replica catch up with its primary's replication offset before it peeks
// (caughtUpReplica). The peek itself still runs on the replica, through the
// Redis backend's read-only script; TestReplicaPeekAfterWindowClosed shows
// what a lagging replica's stale windows become.
func TestConformance(t *testing.T) {
	ts := servers(t)
	for _, variant := range []struct {
		name string
		opts []redisbackend.Option
	}{
		{"batched", nil},
		{"unbatched", []redisbackend.Option{redisbackend.WithoutBatching()}},
	} {
		t.Run(variant.name, func(t *testing.T) {
			conformance.Run(t, func(ctx context.Context, tb testing.TB) (conformance.Harness, error) {
				return &harness{ts: ts, prefix: newPrefix(), opts: variant.opts}, nil
			})
		})
	}
}

// BenchmarkConformance measures the sharded backend over the three real
// shards, opened from a configuration string; peeks go to the replicas as
// they come (no catching up).
func BenchmarkConformance(b *testing.B) {
	ts := servers(b)
	conformance.RunBenchmarks(b, func(ctx context.Context, tb testing.TB) (conformance.Harness, error) {
		return &openedHarness{config: ts.config(""), prefix: newPrefix()}, nil
	})
}

// openedHarness opens a shardedbackend.Backend per MakeBackend with OpenRedis, and closes
// them all.
type openedHarness struct {
	config, prefix string
	opened         []*shardedbackend.Backend
}

func (h *openedHarness) MakeBackend(ctx context.Context) (driver.Backend, error) {
	b, err := Open(h.config, WithBackendOptions(redisbackend.WithPrefix(h.prefix)))
	if err != nil {
		return nil, err
	}
	h.opened = append(h.opened, b)
	return b, nil
}

func (h *openedHarness) Close() {
	for _, b := range h.opened {
		_ = b.Close()
	}
}

// harness makes sharded backends over the shared servers' clients, all with
// one key prefix, so that they share state as processes would.
type harness struct {
	ts     *testShards
	prefix string
	opts   []redisbackend.Option // besides the prefix
}

func (h *harness) MakeBackend(ctx context.Context) (driver.Backend, error) {
	shards := make([]shardedbackend.Shard, len(shardNames))
	for i, name := range shardNames {
		primary, err := redisbackend.New(h.ts.primaryClients[i], append([]redisbackend.Option{redisbackend.WithPrefix(h.prefix)}, h.opts...)...)
		if err != nil {
			return nil, err
		}
		replica, err := redisbackend.New(h.ts.replicaClients[i], append([]redisbackend.Option{redisbackend.WithPrefix(h.prefix)}, h.opts...)...)
		if err != nil {
			return nil, err
		}
		shards[i] = shardedbackend.Shard{Name: name, Primary: primary, Replicas: []driver.Peeker{&caughtUpReplica{
			primary: h.ts.primaryClients[i], replica: h.ts.replicaClients[i], peeker: replica,
		}}}
	}
	return shardedbackend.New(shards)
}

func (h *harness) Close() {}

// caughtUpReplica peeks on a replica once it has applied everything its
// primary had written when the peek began.
type caughtUpReplica struct {
	primary, replica *goredis.Client
	peeker           driver.Peeker
}

func (c *caughtUpReplica) Peek(ctx context.Context, req driver.Request) (driver.Outcome, error) {
	target, err := replicationOffset(ctx, c.primary, "master_repl_offset")
	if err != nil {
		return driver.Outcome{}, err
	}
	for {
		applied, err := replicationOffset(ctx, c.replica, "slave_repl_offset")
		if err != nil {
			return driver.Outcome{}, err
		}
		if applied >= target {
			return c.peeker.Peek(ctx, req)
		}
		select {
		case <-ctx.Done():
			return driver.Outcome{}, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

func replicationOffset(ctx context.Context, c *goredis.Client, field string) (int64, error) {
	fields, err := info(ctx, c, "replication")
	if err != nil {
		return 0, err
	}
	var off int64
	if _, err := fmt.Sscan(fields[field], &off); err != nil {
		return 0, fmt.Errorf("INFO replication %s = %q: %w", field, fields[field], err)
	}
	return off, nil
}

// openFailFast opens the shared shards with clients that give up at once on
// a stopped server: the layout is read from the string and then tuned in
// code, with no command retries (max_retries=-1) and one dial attempt, so
// that calls to a stopped server fail at once instead of spending the call
// timeout.
func openFailFast(t *testing.T, ts *testShards, opts ...Option) *shardedbackend.Backend {
	t.Helper()
	layout, err := Parse(ts.config("max_retries=-1&dial_timeout=1s"))
	require.NoError(t, err)
	for _, sc := range layout {
		for _, o := range append([]*goredis.Options{sc.Primary}, sc.Replicas...) {
			o.DialerRetries = 1
		}
	}
	opts = append(opts, WithBackendOptions(redisbackend.WithPrefix(newPrefix())))
	b, err := New(layout, opts...)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, b.Close()) })
	return b
}

// TestStoppedShardDegradesOnlyItsIdentifiers stops one shard's primary:
// the identifiers it owns get the policy's failure mode (fail closed here),
// with an error naming the shard; every other identifier keeps exact
// counts; peeks of the stopped shard's identifiers are still answered by
// its replica. After a restart the shard serves again: its identifiers
// start afresh (the restarted server kept nothing, as it persists nothing)
// and the others go on counting.
func TestStoppedShardDegradesOnlyItsIdentifiers(t *testing.T) {
	ts := servers(t)
	ctx := context.Background()
	b := openFailFast(t, ts)
	clock := throttlertest.NewManualClock(t0)
	// A generous timeout: live shards must never time out under -race.
	th := testkit.Throttler(t, b, throttler.WithClock(clock), throttler.WithCallTimeout(5*time.Second),
		throttler.WithLogger(nil))
	p := mustPolicy(t, "api", "10/min", throttler.WithFailureMode(throttler.FailClosed))
	const stopped = "b"
	stoppedServer := ts.primaries[ts.index(t, stopped)]

	ids := identifiers(300)
	owned := 0
	for _, id := range ids {
		if b.ShardFor(id) == stopped {
			owned++
		}
		r, err := th.AllowN(ctx, p, id, 2)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		require.EqualValues(t, 2, r.Used)
	}
	ts.waitReplicas(t)

	require.NoError(t, stoppedServer.Stop())
	restarted := false
	defer func() {
		if !restarted {
			_ = stoppedServer.Start()
		}
	}()

	clock.Advance(10 * time.Second)
	degraded, exact, peekedFromReplica := 0, 0, 0
	for _, id := range ids {
		r, err := th.Allow(ctx, p, id)
		require.NoError(t, err)
		if b.ShardFor(id) != stopped {
			require.Falsef(t, r.Degraded, "%s on a live shard: %v", id, r.Err)
			require.True(t, r.Allowed)
			require.EqualValues(t, 3, r.Used, id)
			exact++
			continue
		}
		require.True(t, r.Degraded, id)
		require.False(t, r.Allowed, "fail closed")
		var se *shardedbackend.ShardError
		require.ErrorAs(t, r.Err, &se)
		require.Equal(t, stopped, se.Shard)
		require.ErrorIs(t, r.Err, throttler.ErrBackend)
		degraded++

		pr, err := th.Peek(ctx, p, id)
		require.NoError(t, err)
		require.Falsef(t, pr.Degraded, "peek of %s should be served by the replica: %v", id, pr.Err)
		require.EqualValues(t, 2, pr.Used, "the replica holds the counts from before the outage")
		peekedFromReplica++
	}
	t.Logf("shard %q down: %d of %d identifiers degraded, %d exact, %d peeks answered by its replica",
		stopped, degraded, len(ids), exact, peekedFromReplica)
	assert.Equal(t, owned, degraded)
	assert.Equal(t, len(ids)-owned, exact)
	assert.Equal(t, len(ids), degraded+exact)
	assert.Positive(t, degraded)
	assert.Positive(t, exact)

	err := b.Ping(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), fmt.Sprintf("shard %q: ping: primary", stopped))
	for _, live := range shardNames {
		if live != stopped {
			assert.NotContains(t, err.Error(), fmt.Sprintf("shard %q", live))
		}
	}

	require.NoError(t, stoppedServer.Start())
	restarted = true
	// The client redials in the background once its dials have failed;
	// wait (bounded) until every server answers again.
	require.Eventually(t, func() bool { return b.Ping(ctx) == nil }, 30*time.Second, 50*time.Millisecond)
	ts.waitReplicas(t)

	clock.Advance(10 * time.Second)
	recovered := 0
	for _, id := range ids {
		r, err := th.Allow(ctx, p, id)
		require.NoError(t, err)
		require.Falsef(t, r.Degraded, "%s after the restart: %v", id, r.Err)
		require.True(t, r.Allowed)
		if b.ShardFor(id) == stopped {
			require.EqualValues(t, 1, r.Used, "the restarted primary starts empty")
			recovered++
		} else {
			require.EqualValues(t, 4, r.Used, id)
		}
	}
	assert.Equal(t, owned, recovered)
}

// TestStoppedReplicaFallsBackToPrimary stops one shard's replica: peeks of
// its identifiers are answered by the primary, exactly, and the replica's
// failures are reported to the handler and by Ping.
func TestStoppedReplicaFallsBackToPrimary(t *testing.T) {
	ts := servers(t)
	ctx := context.Background()
	var replicaFailures atomic.Int64
	b := openFailFast(t, ts, WithShardedOptions(shardedbackend.WithReplicaErrorHandler(func(err error) {
		var se *shardedbackend.ShardError
		if errors.As(err, &se) && se.Shard == "c" {
			replicaFailures.Add(1)
		}
	})))
	clock := throttlertest.NewManualClock(t0)
	th := testkit.Throttler(t, b, throttler.WithClock(clock), throttler.WithCallTimeout(5*time.Second))
	p := mustPolicy(t, "api", "10/min")
	ids := identifiers(60)
	for _, id := range ids {
		_, err := th.AllowN(ctx, p, id, 3)
		require.NoError(t, err)
	}
	ts.waitReplicas(t)

	replica := ts.replicas[ts.index(t, "c")]
	require.NoError(t, replica.Stop())
	restarted := false
	defer func() {
		if !restarted {
			_ = replica.Start()
		}
	}()
	// One more unit for one identifier of shard c, written while its
	// replica is down: only the primary can show it.
	var extra string
	for _, id := range ids {
		if b.ShardFor(id) == "c" {
			extra = id
			break
		}
	}
	require.NotEmpty(t, extra)
	_, err := th.Allow(ctx, p, extra)
	require.NoError(t, err)
	owned := 0
	for _, id := range ids {
		r, err := th.Peek(ctx, p, id)
		require.NoError(t, err)
		require.Falsef(t, r.Degraded, "%s: %v", id, r.Err)
		if b.ShardFor(id) == "c" {
			owned++
		}
		want := int64(3)
		if id == extra {
			want = 4
		}
		require.EqualValues(t, want, r.Used, id)
	}
	assert.EqualValues(t, owned, replicaFailures.Load(), "one replica failure per peek on shard c")
	err = b.Ping(ctx)
	require.Error(t, err)
	assert.Contains(t, err.Error(), `shard "c": ping: replica 0`)

	require.NoError(t, replica.Start())
	restarted = true
	require.NoError(t, replica.WaitReplicaSynced(15*time.Second))
	require.Eventually(t, func() bool { return b.Ping(ctx) == nil }, 30*time.Second, 50*time.Millisecond)
}

// TestReplicaPeekAfterWindowClosed is GitHub's stale-replica scenario through
// the sharded backend: a replica still holds a window that has closed (its
// keys have not expired, because real time has not passed), and a peek it
// serves must report a fresh window, not the old counts.
func TestReplicaPeekAfterWindowClosed(t *testing.T) {
	ts := servers(t)
	ctx := context.Background()
	b, prefix := openShared(t, ts, "")
	clock := throttlertest.NewManualClock(t0)
	th := testkit.Throttler(t, b, throttler.WithClock(clock), throttler.WithCallTimeout(5*time.Second))
	p := mustPolicy(t, "api", "5/min")
	const id = "user:github"
	i := ts.index(t, b.ShardFor(id))
	primary, replica := ts.primaryClients[i], ts.replicaClients[i]

	r, err := th.AllowN(ctx, p, id, 3)
	require.NoError(t, err)
	require.EqualValues(t, 3, r.Used)
	windowEnd := r.ResetAt
	require.NoError(t, ts.replicas[i].WaitReplicaSynced(15*time.Second))

	replicaRO, _ := scriptCalls(t, replica)
	primaryRO, primaryRW := scriptCalls(t, primary)

	clock.Set(t0.Add(30 * time.Second))
	r, err = th.Peek(ctx, p, id)
	require.NoError(t, err)
	require.False(t, r.Degraded)
	assert.EqualValues(t, 3, r.Used, "the replica has the open window")
	assert.Equal(t, windowEnd, r.ResetAt)

	now := clock.Advance(31 * time.Second)
	require.True(t, now.After(windowEnd))
	keys := mustKeys(t, prefix, p, id)
	for name, c := range map[string]*goredis.Client{"primary": primary, "replica": replica} {
		n, err := c.Exists(ctx, keys...).Result()
		require.NoError(t, err)
		require.EqualValuesf(t, len(keys), n, "the closed window's keys still exist on the %s", name)
	}
	r, err = th.Peek(ctx, p, id)
	require.NoError(t, err)
	require.False(t, r.Degraded)
	assert.EqualValues(t, 0, r.Used, "a closed window counts as absent")
	assert.EqualValues(t, 5, r.Remaining)
	assert.Equal(t, now.Add(time.Minute), r.ResetAt, "the window a request would open now")

	afterReplicaRO, _ := scriptCalls(t, replica)
	afterPrimaryRO, afterPrimaryRW := scriptCalls(t, primary)
	assert.GreaterOrEqual(t, afterReplicaRO-replicaRO, int64(2), "both peeks ran a read-only script on the replica")
	assert.Equal(t, primaryRO, afterPrimaryRO, "no peek reached the primary")
	assert.Equal(t, primaryRW, afterPrimaryRW, "no decision reached the primary")

	// The next decision, on the primary, opens the fresh window the peek
	// announced.
	r, err = th.Allow(ctx, p, id)
	require.NoError(t, err)
	assert.EqualValues(t, 1, r.Used)
	assert.Equal(t, now.Add(time.Minute), r.ResetAt)
}

func mustKeys(tb testing.TB, prefix string, p *throttler.Policy, id string) []string {
	tb.Helper()
	// Keys only computes names: the client is never called.
	kb, err := redisbackend.New(servers(tb).primaryClients[0], redisbackend.WithPrefix(prefix))
	require.NoError(tb, err)
	return []string{kb.Key(compile(tb, p), id)}
}

// fourthShard starts a Redis for a shard "d" joining the shared three, and
// returns the configuration string of all four.
func fourthShard(t *testing.T, ts *testShards) string {
	d := localserver.RedisT(t, localserver.RedisOptions{})
	return ts.config("") + ",d=redis://" + d.Addr()
}

// TestReshardingStartsMovedIdentifiersAfresh documents what adding a shard
// does to open windows: the identifiers that move (about a quarter, all to
// the new shard) start a fresh window there, while their old counts stay
// stranded on the old shard until their TTL expires. Identifiers that stay
// keep counting.
func TestReshardingStartsMovedIdentifiersAfresh(t *testing.T) {
	ts := servers(t)
	ctx := context.Background()
	prefix := newPrefix()
	oldLayout, err := Open(ts.config(""), WithBackendOptions(redisbackend.WithPrefix(prefix)))
	require.NoError(t, err)
	defer oldLayout.Close()
	newLayout, err := Open(fourthShard(t, ts), WithBackendOptions(redisbackend.WithPrefix(prefix)))
	require.NoError(t, err)
	defer newLayout.Close()

	clock := throttlertest.NewManualClock(t0)
	before := testkit.Throttler(t, oldLayout, throttler.WithClock(clock), throttler.WithCallTimeout(5*time.Second))
	after := testkit.Throttler(t, newLayout, throttler.WithClock(clock), throttler.WithCallTimeout(5*time.Second))
	p := mustPolicy(t, "api", "5/min")
	ids := identifiers(400)
	for _, id := range ids {
		r, err := before.AllowN(ctx, p, id, 3)
		require.NoError(t, err)
		require.True(t, r.Allowed)
	}
	ts.waitReplicas(t)

	clock.Advance(10 * time.Second)
	moved := 0
	for _, id := range ids {
		r, err := after.Allow(ctx, p, id)
		require.NoError(t, err)
		require.False(t, r.Degraded)
		if oldLayout.ShardFor(id) == newLayout.ShardFor(id) {
			require.EqualValues(t, 4, r.Used, "%s stays on shard %s", id, newLayout.ShardFor(id))
			continue
		}
		moved++
		require.Equal(t, "d", newLayout.ShardFor(id), "identifiers move only to the new shard")
		require.EqualValues(t, 1, r.Used, "%s moved: a fresh window on the new shard", id)
		stranded, err := before.Peek(ctx, p, id)
		require.NoError(t, err)
		require.EqualValues(t, 3, stranded.Used, "%s: the old counts stay on the old shard", id)
	}
	t.Logf("a fourth shard moved %d of %d identifiers (%.3f)", moved, len(ids), float64(moved)/float64(len(ids)))
	assert.InDelta(t, 0.25, float64(moved)/float64(len(ids)), 0.08)
}

// TestMirrorModeCarriesWindowsAcrossReshard shows the remedy: the new
// layout gets a key prefix of its own, and a rollout.Backend in mirror mode
// serves every identifier from the old layout while recording every unit
// on the new one too. Once the mirror has run for the longest window, the
// flag moves everyone to the new layout (and later the rollout is dropped):
// no identifier's window resets and none gets its quota twice.
func TestMirrorModeCarriesWindowsAcrossReshard(t *testing.T) {
	ts := servers(t)
	ctx := context.Background()
	oldLayout, err := Open(ts.config(""), WithBackendOptions(redisbackend.WithPrefix(newPrefix())))
	require.NoError(t, err)
	defer oldLayout.Close()
	newLayout, err := Open(fourthShard(t, ts), WithBackendOptions(redisbackend.WithPrefix(newPrefix())))
	require.NoError(t, err)
	defer newLayout.Close()

	flag, err := rollout.NewStaticSource(0)
	require.NoError(t, err)
	var secondaryErrors []error
	migration, err := rollout.New(oldLayout, newLayout, flag, rollout.WithMode(rollout.MirrorMode),
		rollout.WithSecondaryErrorHandler(func(err error) { secondaryErrors = append(secondaryErrors, err) }))
	require.NoError(t, err)

	clock := throttlertest.NewManualClock(t0)
	th := testkit.Throttler(t, migration, throttler.WithClock(clock), throttler.WithCallTimeout(5*time.Second))
	p := mustPolicy(t, "api", "5/min")
	ids := identifiers(200)
	moving := 0
	for _, id := range ids {
		if oldLayout.ShardFor(id) != newLayout.ShardFor(id) {
			moving++
		}
		r, err := th.AllowN(ctx, p, id, 3)
		require.NoError(t, err)
		require.True(t, r.Allowed)
	}
	require.Positive(t, moving)

	// Everyone moves to the new layout.
	require.NoError(t, flag.Set(100))
	clock.Advance(10 * time.Second)
	for _, id := range ids {
		r, err := th.Allow(ctx, p, id)
		require.NoError(t, err)
		require.False(t, r.Degraded)
		require.EqualValues(t, 4, r.Used, "%s keeps its window across the move", id)
	}

	// The rollout is dropped: the new layout alone holds the right counts.
	direct := testkit.Throttler(t, newLayout, throttler.WithClock(clock), throttler.WithCallTimeout(5*time.Second))
	clock.Advance(10 * time.Second)
	for _, id := range ids {
		r, err := direct.Allow(ctx, p, id)
		require.NoError(t, err)
		require.True(t, r.Allowed)
		require.EqualValues(t, 5, r.Used, id)
		r, err = direct.Allow(ctx, p, id)
		require.NoError(t, err)
		require.False(t, r.Allowed, "%s: no second quota after the move", id)
	}
	assert.Empty(t, secondaryErrors)
	t.Logf("%d of %d identifiers moved shard without losing their window", moving, len(ids))
}

// TestMirrorOverOneSharedPrefixCountsOnce: where both layouts route an
// identifier to the same server under one prefix, the mirror writes the
// state the decision just wrote into the very same keys; a merge of a state
// with itself changes nothing, so the request counts once.
func TestMirrorOverOneSharedPrefixCountsOnce(t *testing.T) {
	ts := servers(t)
	ctx := context.Background()
	prefix := newPrefix()
	oldLayout, err := Open(ts.config(""), WithBackendOptions(redisbackend.WithPrefix(prefix)))
	require.NoError(t, err)
	defer oldLayout.Close()
	newLayout, err := Open(fourthShard(t, ts), WithBackendOptions(redisbackend.WithPrefix(prefix)))
	require.NoError(t, err)
	defer newLayout.Close()
	flag, err := rollout.NewStaticSource(0)
	require.NoError(t, err)
	migration, err := rollout.New(oldLayout, newLayout, flag, rollout.WithMode(rollout.MirrorMode))
	require.NoError(t, err)
	th := testkit.Throttler(t, migration, throttler.WithClock(throttlertest.NewManualClock(t0)), throttler.WithCallTimeout(5*time.Second))
	p := mustPolicy(t, "api", "5/min")

	id := ""
	for _, candidate := range identifiers(100) {
		if oldLayout.ShardFor(candidate) == newLayout.ShardFor(candidate) {
			id = candidate
			break
		}
	}
	require.NotEmpty(t, id)
	_, err = th.Allow(ctx, p, id)
	require.NoError(t, err)
	ts.waitReplicas(t)
	r, err := th.Peek(ctx, p, id)
	require.NoError(t, err)
	assert.EqualValues(t, 1, r.Used, "one request, counted once")
	assert.Zero(t, migration.Stats().SecondaryErrors)
}

// TestOpenRedisServesFromTheConfigString checks the whole path from an
// environment-style string: ping, routing to the right server, refund,
// reset, and Close.
func TestOpenRedisServesFromTheConfigString(t *testing.T) {
	ts := servers(t)
	ctx := context.Background()
	b, prefix := openShared(t, ts, "")
	require.NoError(t, b.Ping(ctx))
	assert.Equal(t, shardNames, b.Shards())
	th := testkit.Throttler(t, b, throttler.WithClock(throttlertest.NewManualClock(t0)), throttler.WithCallTimeout(5*time.Second))
	p := mustPolicy(t, "api", "5/min")
	for _, id := range identifiers(30) {
		_, err := th.AllowN(ctx, p, id, 4)
		require.NoError(t, err)
		keys := mustKeys(t, prefix, p, id)
		owner := ts.index(t, b.ShardFor(id))
		for i, c := range ts.primaryClients {
			n, err := c.Exists(ctx, keys...).Result()
			require.NoError(t, err)
			if i == owner {
				require.EqualValues(t, 1, n, "%s is stored on its shard", id)
			} else {
				require.Zero(t, n, "%s is stored on shard %s", id, shardNames[i])
			}
		}
		r, err := th.Refund(ctx, p, id, 3)
		require.NoError(t, err)
		require.EqualValues(t, 1, r.Used)
		require.NoError(t, th.Reset(ctx, p, id))
		n, err := ts.primaryClients[owner].Exists(ctx, keys...).Result()
		require.NoError(t, err)
		require.Zero(t, n)
	}
}

// timeoutBound is a generous bound on a call under the default per-call
// timeout (100 ms) to a hung shard: ten times that timeout, yet a fifth of
// the 5 s that go-redis's default ReadTimeout would cost a call that
// nothing cut short.
const timeoutBound = time.Second

// pause holds every command of every client of server for d (CLIENT PAUSE
// ALL), as a hung server would. The pause cannot be lifted from another
// connection while it lasts, so only servers of the test's own are paused:
// the test's cleanup stops them.
func pause(t *testing.T, server *localserver.Redis, d time.Duration) {
	t.Helper()
	admin := goredis.NewClient(&goredis.Options{Addr: server.Addr()})
	defer admin.Close()
	require.NoError(t, admin.Do(context.Background(), "CLIENT", "PAUSE", d.Milliseconds(), "ALL").Err())
}

// TestTimeoutBoundsAHungShard: a shard from the configuration string whose
// server hangs (CLIENT PAUSE) costs a decision the per-call timeout, not
// go-redis's 5 s ReadTimeout, whether or not the URL names
// context_timeout_enabled.
func TestTimeoutBoundsAHungShard(t *testing.T) {
	for _, params := range []string{"", "?context_timeout_enabled=true"} {
		t.Run("params="+params, func(t *testing.T) {
			ctx := context.Background()
			server := localserver.RedisT(t, localserver.RedisOptions{})
			b, err := Open("a=redis://" + server.Addr() + params)
			require.NoError(t, err)
			t.Cleanup(func() { _ = b.Close() })
			th := testkit.Throttler(t, b, throttler.WithClock(throttlertest.NewManualClock(t0)), throttler.WithLogger(nil))
			p := mustPolicy(t, "api", "10/min", throttler.WithFailureMode(throttler.FailClosed))
			// The healthy decision proves the layout works, not a
			// latency: a timeout load cannot reach, on p's keys.
			healthy := mustPolicy(t, "api", "10/min", throttler.WithFailureMode(throttler.FailClosed), throttler.WithCallTimeout(testkit.CallTimeout))
			r, err := th.Allow(ctx, healthy, "user")
			require.NoError(t, err)
			require.False(t, r.Degraded, "%v", r.Err)

			pause(t, server, 2*time.Second)
			start := time.Now()
			r, err = th.Allow(ctx, p, "user")
			elapsed := time.Since(start)
			require.NoError(t, err)
			assert.True(t, r.Degraded)
			assert.False(t, r.Allowed)
			assert.ErrorIs(t, r.Err, context.DeadlineExceeded)
			var se *shardedbackend.ShardError
			require.ErrorAs(t, r.Err, &se)
			assert.Equal(t, "a", se.Shard)
			assert.Less(t, elapsed, timeoutBound, "the decision waited for the hung shard")
			t.Logf("a decision on the hung shard took %v", elapsed)
			assert.ErrorIs(t, th.Ping(ctx), context.DeadlineExceeded)
		})
	}
}

// TestPeekGivesAHungReplicaHalfTheTime: a peek whose replica hangs gets its
// answer from the primary within the per-call timeout, because the replica
// is given at most half of it. Had the replica's call run to go-redis's
// ReadTimeout, the whole timeout would have gone and the peek would be
// degraded.
func TestPeekGivesAHungReplicaHalfTheTime(t *testing.T) {
	ctx := context.Background()
	primary := localserver.RedisT(t, localserver.RedisOptions{})
	replica := localserver.RedisReplicaT(t, primary, localserver.RedisOptions{})
	var replicaErrs []error
	var mu sync.Mutex
	b, err := Open("a=redis://"+primary.Addr()+"?replica=redis://"+replica.Addr(),
		WithShardedOptions(shardedbackend.WithReplicaErrorHandler(func(err error) { mu.Lock(); replicaErrs = append(replicaErrs, err); mu.Unlock() })))
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	// The timeout is generous so that the primary answers in its half even
	// under -race; the replica hangs far longer than the whole of it.
	const timeout = 2 * time.Second
	th := testkit.Throttler(t, b, throttler.WithClock(throttlertest.NewManualClock(t0)), throttler.WithLogger(nil),
		throttler.WithCallTimeout(timeout))
	p := mustPolicy(t, "api", "10/min")
	_, err = th.AllowN(ctx, p, "user", 3)
	require.NoError(t, err)
	r, err := th.Peek(ctx, p, "user")
	require.NoError(t, err)
	require.False(t, r.Degraded, "%v", r.Err)
	require.Empty(t, replicaErrs, "the replica answers before it hangs")

	pause(t, replica, 3*timeout)
	start := time.Now()
	r, err = th.Peek(ctx, p, "user")
	elapsed := time.Since(start)
	require.NoError(t, err)
	require.False(t, r.Degraded, "the replica took the primary's time: %v", r.Err)
	assert.EqualValues(t, 3, r.Used, "the primary's count")
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, replicaErrs, 1)
	assert.ErrorIs(t, replicaErrs[0], context.DeadlineExceeded)
	assert.Contains(t, replicaErrs[0].Error(), "replica 0")
	t.Logf("peek with a hung replica answered by the primary in %v (timeout %v)", elapsed, timeout)
}
