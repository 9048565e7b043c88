package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/internal/keyslot"
	"github.com/throttlekit/throttlekit/internal/localserver"
)

// The keys the tests load look like the Redis backend's (key layout 2):
// two unnamed limits per identifier, "10/s, 5000/h", hash-tagged by
// identifier.
var limitKeys = []string{"api::fixed:1000", "api::fixed:3600000"}

func testKey(prefix string, id int, limit int) string {
	return fmt.Sprintf("%s{user%%3A%d}:%s", prefix, id, limitKeys[limit])
}

// loadScript writes the keys of identifiers ARGV[2] to ARGV[3] under the
// prefix ARGV[1], on a standalone server, without a round trip per key.
var loadScript = goredis.NewScript(`
for i = tonumber(ARGV[2]), tonumber(ARGV[3]) do
  redis.call('SET', ARGV[1] .. '{user%3A' .. i .. '}:api::fixed:1000', '1:4102444800000')
  redis.call('SET', ARGV[1] .. '{user%3A' .. i .. '}:api::fixed:3600000', '1:4102444800000')
end
return 1
`)

// loadStandalone writes 2*ids keys under prefix.
func loadStandalone(t *testing.T, c *goredis.Client, prefix string, ids int) {
	t.Helper()
	ctx := context.Background()
	const step = 5000
	for from := 0; from < ids; from += step {
		to := min(from+step, ids) - 1
		require.NoError(t, loadScript.Run(ctx, c, nil, prefix, from, to).Err())
	}
}

// loadCluster writes 2*ids keys under prefix through pipelines of 10,000
// commands, a few at a time.
func loadCluster(t *testing.T, c *goredis.ClusterClient, prefix string, ids int) {
	t.Helper()
	ctx := context.Background()
	const step = 5000
	work := make(chan int)
	errs := make(chan error, 4)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for from := range work {
				_, err := c.Pipelined(ctx, func(p goredis.Pipeliner) error {
					for id := from; id < min(from+step, ids); id++ {
						for l := range limitKeys {
							p.Set(ctx, testKey(prefix, id, l), "1:4102444800000", 0)
						}
					}
					return nil
				})
				if err != nil {
					select {
					case errs <- err:
					default:
					}
				}
			}
		}()
	}
	for from := 0; from < ids; from += step {
		work <- from
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatalf("loading the cluster: %v", err)
	default:
	}
}

// countKeys counts the distinct keys matching pattern on one server.
func countKeys(t *testing.T, c *goredis.Client, pattern string) int {
	t.Helper()
	ctx := context.Background()
	seen := map[string]struct{}{}
	var cursor uint64
	for {
		keys, next, err := c.Scan(ctx, cursor, pattern, 10000).Result()
		require.NoError(t, err)
		for _, k := range keys {
			seen[k] = struct{}{}
		}
		if next == 0 {
			return len(seen)
		}
		cursor = next
	}
}

func newClient(t *testing.T, addr string) *goredis.Client {
	t.Helper()
	c := goredis.NewClient(&goredis.Options{Addr: addr, ReadTimeout: 10 * time.Second})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// runBinary runs the built command with GOMAXPROCS=1 and returns its exit
// status and output. The big cleanups run this way: on a two-core machine
// a client using both cores (a test binary under -race, above all) takes
// the CPU from the Redis servers, whose commands then show in the slow log
// for time spent waiting to be scheduled. An operator runs the command
// beside the servers, not on their cores.
func runBinary(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	bin := buildBinary(t)
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "GOMAXPROCS=1")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, stdout.String(), stderr.String()
	case errors.As(err, &exit):
		return exit.ExitCode(), stdout.String(), stderr.String()
	}
	t.Fatalf("running %s: %v", bin, err)
	return 0, "", ""
}

// cleanupTestRate paces the big cleanups, in keys per second: 50,000
// unless THROTTLEKIT_TEST_CLEANUP_RATE says otherwise (0 measures the
// unpaced speed).
func cleanupTestRate() string {
	if v := os.Getenv("THROTTLEKIT_TEST_CLEANUP_RATE"); v != "" {
		return v
	}
	return "50000"
}

func TestCleanupStandaloneMillionKeys(t *testing.T) {
	localserver.SkipIfShort(t)
	r := localserver.RedisT(t, localserver.RedisOptions{})
	c := newClient(t, r.Addr())
	ctx := context.Background()
	start := time.Now()
	loadStandalone(t, c, "old:", 500_000)
	loadStandalone(t, c, "live:", 50_000)
	require.Equal(t, int64(1_100_000), c.DBSize(ctx).Val())
	t.Logf("loaded 1,000,000 old and 100,000 live keys in %v", time.Since(start).Round(time.Millisecond))
	url := "redis://" + r.Addr()

	code, out, errOut := runBinary(t, "cleanup", "--redis", url, "--prefix", "old:", "--dry-run", "--json")
	require.Equal(t, exitOK, code, errOut)
	dry := decode[cleanupDoc](t, out)
	assert.Equal(t, cleanupDoc{Command: "cleanup", Backend: "redis", Target: r.Addr(), Prefix: "old:", Pattern: "old:*",
		DryRun: true, Status: "done", Nodes: 1, Keyspace: 1_100_000, Scanned: 1_100_000, ScanCalls: dry.ScanCalls,
		Matched: 1_000_000, Deleted: 0, ElapsedMs: dry.ElapsedMs}, dry)
	assert.Equal(t, int64(1_100_000), c.DBSize(ctx).Val(), "a dry run deletes nothing")
	t.Logf("dry run over 1,100,000 keys: %d ms, %d SCAN calls", dry.ElapsedMs, dry.ScanCalls)

	watch := watchSlowlogs(t, c)
	code, out, errOut = runBinary(t, "cleanup", "--redis", url, "--prefix", "old:", "--rate", cleanupTestRate(), "--json")
	require.Equal(t, exitOK, code, errOut)
	doc := decode[cleanupDoc](t, out)
	assert.Equal(t, "done", doc.Status)
	assert.Equal(t, int64(1_000_000), doc.Deleted)
	assert.GreaterOrEqual(t, doc.Matched, int64(1_000_000))
	t.Logf("cleanup of 1,000,000 keys (of 1,100,000) on a standalone Redis: %v, %d SCAN calls, %.0f keys/s",
		time.Duration(doc.ElapsedMs)*time.Millisecond, doc.ScanCalls, float64(doc.Deleted)/(float64(doc.ElapsedMs)/1000))

	watch.check(t)
	assert.Equal(t, int64(100_000), c.DBSize(ctx).Val())
	assert.Equal(t, 0, countKeys(t, c, "old:*"))
	assert.Equal(t, 100_000, countKeys(t, c, "live:*"))
}

func TestCleanupCluster(t *testing.T) {
	localserver.SkipIfShort(t)
	cluster := localserver.RedisClusterT(t, 3, 0)
	addrs := cluster.Addrs()
	cc := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: addrs, ReadTimeout: 10 * time.Second})
	t.Cleanup(func() { _ = cc.Close() })
	ctx := context.Background()
	const oldIDs, liveIDs = 500_000, 50_000
	start := time.Now()
	loadCluster(t, cc, "old:", oldIDs)
	loadCluster(t, cc, "live:", liveIDs)
	t.Logf("loaded %d old and %d live keys in %v", 2*oldIDs, 2*liveIDs, time.Since(start).Round(time.Millisecond))

	var primaries []*goredis.Client
	for _, addr := range addrs {
		c := newClient(t, addr)
		role, err := c.Do(ctx, "ROLE").Slice()
		require.NoError(t, err)
		if role[0] == "master" {
			primaries = append(primaries, c)
		}
	}
	require.Len(t, primaries, 3)
	var total int64
	for _, p := range primaries {
		total += p.DBSize(ctx).Val()
	}
	require.Equal(t, int64(2*(oldIDs+liveIDs)), total)

	// Each primary knows its slots, for the progress estimate of servers
	// that scan slot by slot.
	slots := 0
	for _, p := range primaries {
		owned, err := ownedSlots(ctx, p)
		require.NoError(t, err)
		assert.NotEmpty(t, owned)
		slots += len(owned)
	}
	assert.Equal(t, 16384, slots)

	// The slot arithmetic the deletions are grouped by is the server's.
	for _, key := range []string{testKey("old:", 1, 0), testKey("live:", 123456, 1), "foo", "{}x", "a{b}c{d}"} {
		want, err := primaries[0].ClusterKeySlot(ctx, key).Result()
		require.NoError(t, err)
		assert.Equal(t, int(want), keyslot.Of(key), key)
	}

	url := "redis://" + addrs[0] + "?addr=" + strings.Join(addrs[1:], "&addr=")
	watch := watchSlowlogs(t, primaries...)
	code, out, errOut := runBinary(t, "cleanup", "--redis-cluster", url, "--prefix", "old:", "--rate", cleanupTestRate(), "--json")
	require.Equal(t, exitOK, code, errOut)
	doc := decode[cleanupDoc](t, out)
	assert.Equal(t, "done", doc.Status)
	assert.Equal(t, int64(3), doc.Nodes)
	assert.Equal(t, total, doc.Keyspace)
	assert.Equal(t, total, doc.Scanned)
	assert.Equal(t, int64(2*oldIDs), doc.Deleted)
	t.Logf("cleanup of %d keys (of %d) on a 3-primary Cluster: %v, %d SCAN calls, %.0f keys/s", doc.Deleted, total,
		time.Duration(doc.ElapsedMs)*time.Millisecond, doc.ScanCalls, float64(doc.Deleted)/(float64(doc.ElapsedMs)/1000))

	watch.check(t)
	var left int64
	for _, p := range primaries {
		left += p.DBSize(ctx).Val()
		assert.Equal(t, 0, countKeys(t, p, "old:*"), p.Options().Addr)
	}
	assert.Equal(t, int64(2*liveIDs), left)
	live := 0
	for _, p := range primaries {
		live += countKeys(t, p, "live:*")
	}
	assert.Equal(t, 2*liveIDs, live)
}

func TestCleanupDryRunChangesNothing(t *testing.T) {
	localserver.SkipIfShort(t)
	r := localserver.RedisT(t, localserver.RedisOptions{})
	c := newClient(t, r.Addr())
	ctx := context.Background()
	loadStandalone(t, c, "old:", 50_000)
	loadStandalone(t, c, "live:", 5_000)
	// Keys whose names hold glob characters: the prefix is matched
	// literally.
	require.NoError(t, c.Set(ctx, "old*x", "1", 0).Err())
	require.NoError(t, c.Set(ctx, "ol", "1", 0).Err())
	url := "redis://" + r.Addr()

	code, out, errOut := runCLI(t, "cleanup", "--redis", url, "--prefix", "old:", "--dry-run", "--json", "--count", "500")
	require.Equal(t, exitOK, code, errOut)
	doc := decode[cleanupDoc](t, out)
	assert.True(t, doc.DryRun)
	assert.Equal(t, "done", doc.Status)
	assert.Equal(t, int64(100_000), doc.Matched)
	assert.Equal(t, int64(0), doc.Deleted)
	assert.Equal(t, int64(110_002), doc.Keyspace)
	assert.Equal(t, int64(110_002), c.DBSize(ctx).Val())
	assert.Equal(t, 100_000, countKeys(t, c, "old:*"))

	code, out, errOut = runCLI(t, "cleanup", "--redis", url, "--prefix", "old*", "--dry-run", "--json")
	require.Equal(t, exitOK, code, errOut)
	assert.Equal(t, int64(1), decode[cleanupDoc](t, out).Matched, "a '*' in the prefix is literal")

	// The table form.
	code, out, errOut = runCLI(t, "cleanup", "--redis", url, "--prefix", "old:", "--dry-run")
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, `Dry run of prefix "old:" on redis `+r.Addr()+": done")
	assert.Regexp(t, `matched\s+100,000 keys would be deleted`, out)
	assert.Regexp(t, `keyspace\s+110,002 keys`, out)
	assert.NotContains(t, out, "deleted  ")

	// A protected prefix needs --force, which then matches it too.
	code, _, errOut = runCLI(t, "cleanup", "--redis", url, "--prefix", "li", "--keep", "live:", "--dry-run")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, `also matches the keys of the live prefix "live:"`)
	code, out, errOut = runCLI(t, "cleanup", "--redis", url, "--prefix", "li", "--keep", "live:", "--force", "--dry-run", "--json")
	require.Equal(t, exitOK, code, errOut)
	assert.Equal(t, int64(10_000), decode[cleanupDoc](t, out).Matched)
	assert.Equal(t, int64(110_002), c.DBSize(ctx).Val())

	// Deleting is paced: 20,000 keys at 10,000 keys/s take about 2 s.
	loadStandalone(t, c, "paced:", 10_000)
	code, out, errOut = runCLI(t, "cleanup", "--redis", url, "--prefix", "paced:", "--rate", "10000", "--json")
	require.Equal(t, exitOK, code, errOut)
	paced := decode[cleanupDoc](t, out)
	assert.Equal(t, int64(20_000), paced.Deleted)
	assert.GreaterOrEqual(t, paced.ElapsedMs, int64(1800), "20,000 keys at 10,000 keys/s")
	assert.Less(t, paced.ElapsedMs, int64(15000))
	assert.Equal(t, int64(110_002), c.DBSize(ctx).Val())
}

func TestCleanupInterruptedThenResumed(t *testing.T) {
	localserver.SkipIfShort(t)
	r := localserver.RedisT(t, localserver.RedisOptions{})
	c := newClient(t, r.Addr())
	ctx := context.Background()
	loadStandalone(t, c, "old:", 50_000)
	loadStandalone(t, c, "live:", 5_000)
	args := []string{"cleanup", "--redis", "redis://" + r.Addr(), "--prefix", "old:", "--rate", "0", "--json"}

	// A context cancelled after the tenth batch stands for SIGINT.
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	code, out, errOut := cli{afterBatch: func(n int64) {
		if n == 10 {
			cancel()
		}
	}}.run(runCtx, args...)
	require.Equal(t, exitInterrupted, code, errOut)
	first := decode[cleanupDoc](t, out)
	assert.Equal(t, "interrupted", first.Status)
	assert.Equal(t, int64(10), first.ScanCalls, "it stops after the batch in flight")
	assert.Greater(t, first.Deleted, int64(0))
	assert.Less(t, first.Deleted, int64(100_000))
	assert.Less(t, first.Scanned, first.Keyspace)
	assert.Equal(t, int64(110_000)-first.Deleted, c.DBSize(ctx).Val())

	// The table form says what to do.
	code, out, _ = cli{afterBatch: func(int64) { cancel() }}.run(runCtx, args[:len(args)-1]...)
	require.Equal(t, exitInterrupted, code)
	assert.Contains(t, out, ": interrupted\n")
	assert.Contains(t, out, "run the same command again to finish")

	code, out, errOut = runCLI(t, args...)
	require.Equal(t, exitOK, code, errOut)
	second := decode[cleanupDoc](t, out)
	assert.Equal(t, "done", second.Status)
	assert.Equal(t, int64(100_000), first.Deleted+second.Deleted)
	assert.Equal(t, int64(10_000), c.DBSize(ctx).Val())
	assert.Equal(t, 0, countKeys(t, c, "old:*"))

	// Once done, a rerun finds nothing.
	code, out, _ = runCLI(t, args...)
	require.Equal(t, exitOK, code)
	assert.Equal(t, int64(0), decode[cleanupDoc](t, out).Matched)
}

func TestCleanupSIGINTThenRerun(t *testing.T) {
	localserver.SkipIfShort(t)
	bin := buildBinary(t)
	r := localserver.RedisT(t, localserver.RedisOptions{})
	c := newClient(t, r.Addr())
	ctx := context.Background()
	loadStandalone(t, c, "old:", 50_000)
	loadStandalone(t, c, "live:", 5_000)
	args := []string{"cleanup", "--redis", "redis://" + r.Addr(), "--prefix", "old:", "--progress", "lines"}

	// At 20,000 keys/s the run would take 5 s; SIGINT arrives after the
	// first progress line, a second in.
	cmd := exec.Command(bin, append(args, "--rate", "20000")...)
	var stdout strings.Builder
	cmd.Stdout = &stdout
	stderr, err := cmd.StderrPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	lines := bufio.NewScanner(stderr)
	require.True(t, lines.Scan(), "no progress line")
	assert.Contains(t, lines.Text(), "cleanup old:*: scanned ")
	require.NoError(t, cmd.Process.Signal(syscall.SIGINT))
	_, _ = io.Copy(io.Discard, stderr)
	err = cmd.Wait()
	var exit *exec.ExitError
	require.True(t, errors.As(err, &exit), "exit: %v\nstdout:\n%s", err, stdout.String())
	assert.Equal(t, exitInterrupted, exit.ExitCode())
	assert.Contains(t, stdout.String(), `Cleanup of prefix "old:" on redis `+r.Addr()+": interrupted")
	left := c.DBSize(ctx).Val()
	assert.Greater(t, left, int64(10_000))
	assert.Less(t, left, int64(110_000))

	out, err := exec.Command(bin, append(args, "--rate", "0")...).Output()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), ": done\n")
	assert.Equal(t, int64(10_000), c.DBSize(ctx).Val())
	assert.Equal(t, 0, countKeys(t, c, "old:*"))
}

func TestCleanupProgressBarOnTerminal(t *testing.T) {
	localserver.SkipIfShort(t)
	bin := buildBinary(t)
	r := localserver.RedisT(t, localserver.RedisOptions{})
	c := newClient(t, r.Addr())
	loadStandalone(t, c, "old:", 100_000)
	loadStandalone(t, c, "live:", 10_000)

	cmd := exec.Command(bin, "cleanup", "--redis", "redis://"+r.Addr(), "--prefix", "old:", "--rate", "100000")
	tty, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 24, Cols: 100})
	require.NoError(t, err)
	defer tty.Close()
	var output strings.Builder
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Reading the pty ends with EIO once the command has exited.
		_, _ = io.Copy(&output, tty)
	}()
	waitErr := make(chan error, 1)
	go func() { waitErr <- cmd.Wait() }()
	select {
	case err := <-waitErr:
		require.NoError(t, err)
	case <-time.After(time.Minute):
		_ = cmd.Process.Kill()
		t.Fatal("cleanup on a terminal did not finish in a minute")
	}
	<-done
	out := output.String()
	assert.Contains(t, out, "cleanup old:*:")
	assert.Regexp(t, `\d+% \|█+ *\|`, out, "a progress bar")
	assert.Contains(t, out, "100% |"+strings.Repeat("█", 30)+"|")
	assert.Contains(t, out, "200,000 deleted")
	assert.Contains(t, out, `Cleanup of prefix "old:" on redis `+r.Addr()+": done")
	assert.Regexp(t, `deleted\s+200,000`, out)
	assert.Equal(t, int64(20_000), c.DBSize(context.Background()).Val())

	// A trimmed sample for the documentation: the first, a middle and the
	// last frame of the bar, and the summary.
	var frames, summary []string
	for _, f := range strings.FieldsFunc(out, func(r rune) bool { return r == '\r' || r == '\n' }) {
		switch f = strings.TrimRight(f, " "); {
		case strings.HasPrefix(f, "cleanup old:*:"):
			frames = append(frames, f)
		case strings.TrimSpace(f) != "":
			summary = append(summary, f)
		}
	}
	require.NotEmpty(t, frames)
	sample := []string{frames[0], frames[len(frames)/2], frames[len(frames)-1]}
	t.Logf("terminal output (%d frames of the bar), trimmed:\n%s", len(frames), strings.Join(append(sample, summary...), "\n"))
}
