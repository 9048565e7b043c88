package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/bits"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/throttlekit/throttlekit/internal/keyslot"
	"github.com/throttlekit/throttlekit/throttler"
)

// cli runs the command in process and returns its exit status and output.
type cli struct {
	env        map[string]string
	afterBatch func(int64)
}

func (c cli) run(ctx context.Context, args ...string) (int, string, string) {
	var stdout, stderr bytes.Buffer
	a := &app{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr,
		getenv: func(k string) string { return c.env[k] }, afterBatch: c.afterBatch}
	code := execute(ctx, a, args)
	return code, stdout.String(), stderr.String()
}

// runCLI runs args with an empty environment and a generous deadline.
func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	return cli{}.run(ctx, args...)
}

func decode[T any](t *testing.T, out string) T {
	t.Helper()
	var v T
	require.NoError(t, json.Unmarshal([]byte(out), &v), "output:\n%s", out)
	return v
}

// binary builds the command once per test run, into a directory removed
// when the tests end.
var binary = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "throttlekit-test-")
	if err != nil {
		return "", err
	}
	buildDir = dir
	path := filepath.Join(dir, "throttlekit")
	cmd := exec.Command("go", "build", "-o", path, ".")
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return path, nil
})

var buildDir string

func TestMain(m *testing.M) {
	goredis.SetLogger(quietRedisLogger{})
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

func buildBinary(t *testing.T) string {
	t.Helper()
	path, err := binary()
	require.NoError(t, err)
	return path
}

func TestHelpForEveryCommand(t *testing.T) {
	for _, c := range commands() {
		for _, flag := range []string{"--help", "-h", "-help"} {
			code, out, errOut := runCLI(t, c.name, flag)
			assert.Equal(t, exitOK, code, "%s %s", c.name, flag)
			assert.Contains(t, out, "Usage:\n  throttlekit "+c.name)
			assert.Contains(t, out, "Exit status")
			assert.Empty(t, errOut)
		}
		// Help wins even after other flags and arguments.
		code, out, _ := runCLI(t, c.name, "--json", "x", "--help")
		assert.Equal(t, exitOK, code)
		assert.Contains(t, out, "Usage:")

		code, out, _ = runCLI(t, "help", c.name)
		assert.Equal(t, exitOK, code)
		assert.Contains(t, out, "Usage:\n  throttlekit "+c.name)
	}
	for _, args := range [][]string{{"help"}, {"--help"}, {"-h"}} {
		code, out, _ := runCLI(t, args...)
		assert.Equal(t, exitOK, code, "%v", args)
		for _, c := range commands() {
			assert.Contains(t, out, "  "+c.name)
		}
		assert.Contains(t, out, "3  interrupted")
	}
	code, out, _ := runCLI(t, "inspect", "--help")
	require.Equal(t, exitOK, code)
	for _, want := range []string{"--redis URL", "--redis-cluster URL", "--redis-groups CONFIG", "--memcached servers",
		"--old KIND=VALUE", "--new KIND=VALUE", "--prefix prefix", "--policy string", "--policy-name name",
		"THROTTLEKIT_REDIS", "--json", "--percent percentage", "--group-id ID"} {
		assert.Contains(t, out, want)
	}
	code, out, _ = runCLI(t, "cleanup", "--help")
	require.Equal(t, exitOK, code)
	for _, want := range []string{"--dry-run", "--rate keys/s", "--count", "--keep prefix", "--force", "SCAN", "UNLINK"} {
		assert.Contains(t, out, want)
	}
	// cleanup refuses memcached, so its help does not offer it.
	assert.NotContains(t, out, "--memcached")
	assert.NotContains(t, out, "THROTTLEKIT_MEMCACHED")
}

func TestUsageErrorsExitTwo(t *testing.T) {
	p := []string{"--policy", "api: 10/s"}
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"no arguments", nil, "Usage:"},
		{"unknown command", []string{"frobnicate"}, `unknown command "frobnicate"`},
		{"help for unknown command", []string{"help", "frobnicate"}, `unknown command "frobnicate"`},
		{"unknown flag", []string{"inspect", "--frob", "x"}, "flag provided but not defined: -frob"},
		{"bad duration", []string{"inspect", "--timeout", "soon", "x"}, "invalid value"},
		{"inspect bare address", append([]string{"inspect", "--redis", "127.0.0.1:6379", "a"}, p...), "a URL is expected, such as redis://127.0.0.1:6379"},
		{"inspect without identifier", append([]string{"inspect", "--redis", "redis://127.0.0.1:1"}, p...), "want one identifier, got 0"},
		{"inspect with two identifiers", append([]string{"inspect", "--redis", "redis://127.0.0.1:1", "a", "b"}, p...), "want one identifier, got 2"},
		{"inspect with empty identifier", append([]string{"inspect", "--redis", "redis://127.0.0.1:1", ""}, p...), "identifier must be 1 to 1024 bytes"},
		{"inspect without backend", append([]string{"inspect", "x"}, p...), "no backend"},
		{"inspect without policy", []string{"inspect", "--redis", "redis://127.0.0.1:1", "x"}, "a policy is required"},
		{"bad policy", []string{"inspect", "--redis", "redis://127.0.0.1:1", "--policy", "api: 10/fortnight", "x"}, "unknown window unit"},
		{"policy names disagree", []string{"inspect", "--redis", "redis://127.0.0.1:1", "--policy", "core: 10/s", "--policy-name", "api", "x"}, `named "api", and "core"`},
		{"policy without a name", []string{"inspect", "--redis", "redis://127.0.0.1:1", "--policy", "10/s", "x"}, "has no name"},
		{"explain without a name", []string{"explain", "10/s"}, "has no name"},
		{"a name written before the limit", []string{"explain", "api: burst=5/min"}, `write "5/min name=burst"`},
		{"two backends", append([]string{"reset", "--redis", "redis://127.0.0.1:1", "--memcached", "127.0.0.1:1", "x"}, p...), "give one backend"},
		{"old without new", append([]string{"reset", "--old", "redis=redis://127.0.0.1:1", "x"}, p...), "needs both --old and --new"},
		{"bad side spec", append([]string{"reset", "--old", "redis://127.0.0.1:1", "--new", "memcached=127.0.0.1:1", "x"}, p...), "want KIND=VALUE"},
		{"unknown side kind", append([]string{"reset", "--old", "mongo=x", "--new", "memcached=127.0.0.1:1", "x"}, p...), "want KIND=VALUE"},
		{"sides and single", append([]string{"reset", "--old", "memcached=127.0.0.1:1", "--new", "redis=redis://127.0.0.1:1", "--redis", "redis://127.0.0.1:1", "x"}, p...), "not both"},
		{"side prefixes without sides", append([]string{"reset", "--redis", "redis://127.0.0.1:1", "--old-prefix", "a", "x"}, p...), "apply to --old and --new"},
		{"bad redis URL", append([]string{"inspect", "--redis", "http://127.0.0.1:1", "x"}, p...), "--redis"},
		{"bad cluster URL", append([]string{"inspect", "--redis-cluster", "redis://127.0.0.1:1?addr=", "x"}, p...), "--redis-cluster"},
		{"bad groups config", append([]string{"inspect", "--redis-groups", "a=redis://127.0.0.1:1,a=redis://127.0.0.1:2", "x"}, p...), "--redis-groups"},
		{"brace in redis prefix", append([]string{"inspect", "--redis", "redis://127.0.0.1:1", "--prefix", "{x}", "x"}, p...), "brace"},
		{"bad timeout", append([]string{"inspect", "--redis", "redis://127.0.0.1:1", "--timeout", "0s", "x"}, p...), "--timeout must be positive"},
		{"cleanup without prefix", []string{"cleanup", "--redis", "redis://127.0.0.1:1"}, "refusing an empty --prefix"},
		{"cleanup of the default prefix", []string{"cleanup", "--redis", "redis://127.0.0.1:1", "--prefix", "throttle"}, `live prefix "throttlekit:"`},
		{"cleanup of a kept prefix", []string{"cleanup", "--redis", "redis://127.0.0.1:1", "--prefix", "app", "--keep", "x:,app-v2:"}, `live prefix "app-v2:"`},
		{"cleanup of some of the live keys", []string{"cleanup", "--redis", "redis://127.0.0.1:1", "--prefix", "throttlekit:{user"}, `live prefix "throttlekit:"`},
		{"cleanup of some of a kept prefix's keys", []string{"cleanup", "--redis", "redis://127.0.0.1:1", "--prefix", "app-v2:{", "--keep", "app-v2:"}, `live prefix "app-v2:"`},
		{"cleanup on memcached", []string{"cleanup", "--memcached", "127.0.0.1:1", "--prefix", "old:"}, "Redis only"},
		{"cleanup without backend", []string{"cleanup", "--prefix", "old:"}, "no Redis"},
		{"cleanup with two backends", []string{"cleanup", "--redis", "redis://127.0.0.1:1", "--redis-groups", "a=redis://127.0.0.1:2", "--prefix", "old:"}, "give one Redis"},
		{"cleanup count zero", []string{"cleanup", "--redis", "redis://127.0.0.1:1", "--prefix", "old:", "--count", "0"}, "--count must be"},
		{"cleanup count too large", []string{"cleanup", "--redis", "redis://127.0.0.1:1", "--prefix", "old:", "--count", "100000"}, "--count must be"},
		{"cleanup negative rate", []string{"cleanup", "--redis", "redis://127.0.0.1:1", "--prefix", "old:", "--rate", "-1"}, "--rate"},
		{"cleanup NaN rate", []string{"cleanup", "--redis", "redis://127.0.0.1:1", "--prefix", "old:", "--rate", "NaN"}, "--rate"},
		{"cleanup bad progress", []string{"cleanup", "--redis", "redis://127.0.0.1:1", "--prefix", "old:", "--progress", "fancy"}, "--progress"},
		{"cleanup argument", []string{"cleanup", "--redis", "redis://127.0.0.1:1", "--prefix", "old:", "now"}, "takes no arguments"},
		{"explain without policy", []string{"explain"}, "a policy is required"},
		{"explain two policies", []string{"explain", "10/s", "20/s"}, "want one POLICY"},
		{"explain policy twice", []string{"explain", "--policy", "10/s", "20/s"}, "not both"},
		{"explain bad option", []string{"explain", "api: 10/s gcra burst=0"}, `burst "0" must be a positive`},
		{"explain burst without gcra", []string{"explain", "api: 10/s burst=5"}, "burst applies only to gcra"},
		{"explain two algorithms", []string{"explain", "api: 10/s aligned gcra"}, "conflict"},
		{"explain duplicate limit", []string{"explain", "api: 10/s, 10/s"}, "two limits named"},
		{"explain two unnamed limits of one window", []string{"explain", "api: 10/s, 20/s"}, "count the same window with the same algorithm"},
		{"explain a name before the limit", []string{"explain", "api: a=10/s name=b"}, `to name this one "a", write "10/s name=a"`},
		{"explain name option twice", []string{"explain", "api: 10/s name=a name=b"}, `option "name" given twice`},
		{"explain empty name option", []string{"explain", "api: 10/s name="}, "name must not be empty"},
		{"explain notation as a name", []string{"explain", "api: 10/s name=5/s"}, "is a limit notation"},
		{"explain notation before the limit", []string{"explain", "api: 5/s=10/s"}, "want MAX/WINDOW first"},
		{"explain empty name before the limit", []string{"explain", "api: =10/s"}, "want MAX/WINDOW first"},
		{"explain empty policy name", []string{"explain", ": 10/s"}, "has no name"},
		{"explain long identifier", []string{"explain", "--id", strings.Repeat("x", 1025), "api: 10/s"}, "identifier must be"},
		{"explain brace prefix", []string{"explain", "--prefix", "a{", "api: 10/s"}, "brace"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, tc.args...)
			assert.Equal(t, exitUsage, code, "stdout:\n%s\nstderr:\n%s", out, errOut)
			assert.Contains(t, errOut, tc.want)
			assert.Empty(t, out)
			assert.NotContains(t, errOut, "panic")
		})
	}
}

func TestUnreachableBackendExitsOne(t *testing.T) {
	for _, args := range [][]string{
		{"inspect", "--redis", "redis://127.0.0.1:1?dial_timeout=200ms&max_retries=-1", "--policy", "api: 10/s", "user:1"},
		{"reset", "--redis", "redis://127.0.0.1:1?dial_timeout=200ms&max_retries=-1", "--policy", "api: 10/s", "user:1"},
		{"inspect", "--memcached", "127.0.0.1:1", "--timeout", "200ms", "--policy", "api: 10/s", "user:1", "--json"},
		{"cleanup", "--redis", "redis://127.0.0.1:1?dial_timeout=200ms&max_retries=-1", "--prefix", "old:", "--json"},
	} {
		code, out, errOut := runCLI(t, args...)
		assert.Equal(t, exitFailed, code, "%v\nstdout:\n%s\nstderr:\n%s", args, out, errOut)
		assert.Regexp(t, `(?i)error`, out, "%v", args)
	}
	code, out, _ := runCLI(t, "inspect", "--memcached", "127.0.0.1:1", "--timeout", "200ms", "--policy", "api: 10/s", "user:1", "--json")
	require.Equal(t, exitFailed, code)
	doc := decode[inspectDoc](t, out)
	require.Len(t, doc.Sides, 1)
	assert.False(t, doc.Sides[0].OK)
	assert.NotEmpty(t, doc.Sides[0].Error)
	assert.Equal(t, "memcached", doc.Sides[0].Backend)
}

func TestEnvironmentSuppliesDefaults(t *testing.T) {
	ctx := context.Background()
	env := map[string]string{
		envRedis:  "redis://127.0.0.1:1?dial_timeout=200ms&max_retries=-1",
		envPolicy: "core: 10/s",
	}
	// The environment's backend and policy: the command runs (and fails to
	// connect), rather than reporting missing flags.
	code, out, errOut := cli{env: env}.run(ctx, "inspect", "--json", "user:1")
	require.Equal(t, exitFailed, code, "stderr: %s", errOut)
	doc := decode[inspectDoc](t, out)
	assert.Equal(t, "core", doc.Policy.Name)
	assert.Equal(t, "redis", doc.Sides[0].Backend)
	// A backend flag replaces the environment's backend instead of adding
	// a second one.
	code, out, errOut = cli{env: env}.run(ctx, "inspect", "--json", "--memcached", "127.0.0.1:1", "--timeout", "200ms", "user:1")
	require.Equal(t, exitFailed, code, "stderr: %s", errOut)
	doc = decode[inspectDoc](t, out)
	assert.Equal(t, "memcached", doc.Sides[0].Backend)
	// Cleanup never takes its prefix from the environment.
	env[envPrefix] = "old:"
	code, _, errOut = cli{env: env}.run(ctx, "cleanup")
	assert.Equal(t, exitUsage, code)
	assert.Contains(t, errOut, "refusing an empty --prefix")
	// Sides from the environment.
	env = map[string]string{envOld: "memcached=127.0.0.1:1", envNew: "redis=redis://127.0.0.1:1?dial_timeout=200ms&max_retries=-1",
		envNewPrefix: "v2:", envPolicy: "10/s", envPolicyName: "api"}
	code, out, _ = cli{env: env}.run(ctx, "inspect", "--json", "--timeout", "200ms", "user:1")
	require.Equal(t, exitFailed, code)
	doc = decode[inspectDoc](t, out)
	require.Len(t, doc.Sides, 2)
	assert.Equal(t, "old", doc.Sides[0].Side)
	assert.Equal(t, "tk", doc.Sides[0].Prefix)
	assert.Equal(t, "new", doc.Sides[1].Side)
	assert.Equal(t, "v2:", doc.Sides[1].Prefix)
}

func TestExplainTable(t *testing.T) {
	code, out, errOut := runCLI(t, "explain", "api: 10/s, 5000/h gcra burst=20")
	require.Equal(t, exitOK, code, errOut)
	for _, want := range []string{
		"Policy api: 10/s, 5000/h gcra burst=20",
		"LIMIT                 MAX   WINDOW  ALGORITHM  BURST  EMISSION  STORAGE KEY",
		"10/s                  10    1s      fixed      -      -         :fixed:1000",
		"5000/h gcra burst=20  5000  1h      gcra       20     720ms     :gcra:3600000:20",
		"throttlekit:v3:{user%3A42}:api",
		"e:fixed:1000 u:fixed:1000",
		"e:gcra:3600000:20",
		"tk:api:user%3A42|w::fixed:1000",
		"tk:api:user%3A42|c::fixed:1000:<end>:<token>",
		"tk:api:user%3A42|g::gcra:3600000:20",
		"cluster slot 2308",
	} {
		assert.Contains(t, out, want)
	}
	// Flags after the argument, named limits, a policy name in the notation.
	code, out, errOut = runCLI(t, "explain", "core: 10/s name=per-sec, 60/min aligned", "--id", "ip:10.0.0.1", "--prefix", "app:",
		"--redis-groups", "a=redis://127.0.0.1:1,b=redis://127.0.0.1:2")
	require.Equal(t, exitOK, code, errOut)
	assert.Contains(t, out, "Policy core: 10/s name=per-sec, 60/min aligned")
	assert.Contains(t, out, "app:v3:{ip%3A10.0.0.1}:core")
	assert.Contains(t, out, "eper-sec:fixed:1000 uper-sec:fixed:1000")
	assert.Contains(t, out, "e:aligned:60000 u:aligned:60000")
	assert.Contains(t, out, "app%3A:core:ip%3A10.0.0.1|w:per-sec:fixed:1000")
	assert.Regexp(t, `group [ab]\)`, out)
}

func TestExplainJSON(t *testing.T) {
	code, out, errOut := runCLI(t, "explain", "--json", "--policy", "10/s, 5000/h gcra burst=20", "--policy-name", "core", "--id", "u1")
	require.Equal(t, exitOK, code, errOut)
	doc := decode[explainDoc](t, out)
	assert.Equal(t, "explain", doc.Command)
	assert.Equal(t, "core", doc.Policy.Name)
	assert.Equal(t, int64(10), doc.Policy.Capacity)
	assert.Equal(t, "u1", doc.Identifier)
	assert.Equal(t, "throttlekit:", doc.Redis.Prefix)
	assert.Equal(t, "{u1}", doc.Redis.HashTag)
	assert.Equal(t, "tk", doc.Memcached.Prefix)
	require.Len(t, doc.Limits, 2)
	fixed, gcra := doc.Limits[0], doc.Limits[1]
	assert.Equal(t, explainLimit{Name: "10/s", Notation: "10/s", Algorithm: "fixed", Max: 10, Window: "1s", WindowMs: 1000,
		Capacity: 10, Key: ":fixed:1000", RedisKey: "throttlekit:v3:{u1}:core", RedisFields: []string{"e:fixed:1000", "u:fixed:1000"},
		MemcachedKeys: map[string]string{"window": "tk:core:u1|w::fixed:1000", "counter": "tk:core:u1|c::fixed:1000:<end>:<token>"}}, fixed)
	assert.Equal(t, "gcra", gcra.Algorithm)
	assert.Equal(t, int64(5000), gcra.Max)
	assert.Equal(t, int64(20), gcra.Burst)
	assert.Equal(t, int64(20), gcra.Capacity)
	assert.Equal(t, int64(3600000), gcra.WindowMs)
	assert.Equal(t, int64(720000), gcra.EmissionIntervalUs)
	assert.Equal(t, ":gcra:3600000:20", gcra.Key)
	assert.Equal(t, map[string]string{"gcra": "tk:core:u1|g::gcra:3600000:20"}, gcra.MemcachedKeys)
	assert.Equal(t, keyslot.Of("{u1}"), doc.Redis.Slot)
}

func TestExplainLongIdentifierHashesMemcachedRoute(t *testing.T) {
	code, out, errOut := runCLI(t, "explain", "--json", "--id", strings.Repeat("é", 100), "api: 10/s")
	require.Equal(t, exitOK, code, errOut)
	doc := decode[explainDoc](t, out)
	assert.Regexp(t, `^#[0-9a-f]{64}$`, doc.Memcached.Route)
	assert.LessOrEqual(t, len(doc.Limits[0].MemcachedKeys["counter"]), 250-38)
}

func TestParseFlagsInterspersed(t *testing.T) {
	fs := newFlagSet("x", "x", "")
	b := fs.Bool("b", false, "")
	s := fs.String("s", "", "")
	pos, err := parseFlags(fs, &app{stdout: &bytes.Buffer{}}, []string{"one", "-b", "two", "--s", "v", "three", "--", "-b", "four"})
	require.NoError(t, err)
	assert.Equal(t, []string{"one", "two", "three", "-b", "four"}, pos)
	assert.True(t, *b)
	assert.Equal(t, "v", *s)
}

func TestMatchPatternEscapesGlobs(t *testing.T) {
	assert.Equal(t, "old:*", matchPattern("old:"))
	assert.Equal(t, `a\*b\?c\[d\]e\\f*`, matchPattern(`a*b?c[d]e\f`))
}

func TestCursorFraction(t *testing.T) {
	// A table of 8 buckets scanned in reverse binary order: 0, 4, 2, 6, 1,
	// 5, 3, 7. The cursor SCAN returns after visiting bucket b is the next
	// one, whose reversed bits count the buckets visited.
	order := []uint64{0, 4, 2, 6, 1, 5, 3, 7}
	ns := &nodeScan{}
	for i := 1; i < len(order); i++ {
		assert.InDelta(t, float64(i)/8, ns.fraction(order[i]), 1e-12, "after %d buckets", i)
	}
	// One table per slot: the slot's rank among the node's slots first.
	ns = &nodeScan{slotCursor: true, owned: []int{100, 101, 102, 103}}
	// Halfway through slot 102's table: the table's cursor is 1, whose
	// reversed bits are one half.
	require.Equal(t, uint64(1)<<63, bits.Reverse64(1))
	assert.InDelta(t, (2+0.5)/4, ns.fraction(1<<14|102), 1e-9)
	assert.InDelta(t, 0.25, ns.fraction(101), 1e-9)
}

func TestVersionSelectsCursorLayout(t *testing.T) {
	assert.False(t, slotCursorVersion("# Server\r\nredis_version:7.0.15\r\n"))
	assert.False(t, slotCursorVersion("redis_version:7.2.4\r\n"))
	assert.True(t, slotCursorVersion("redis_version:7.4.0\r\n"))
	assert.True(t, slotCursorVersion("redis_version:8.0.2\r\n"))
	assert.True(t, slotCursorVersion("redis_version:7.2.4\r\nvalkey_version:8.1.0\r\n"))
	assert.False(t, slotCursorVersion("redis_version:7.2.4\r\nvalkey_version:7.2.5\r\n"))
	assert.False(t, slotCursorVersion("garbage"))
}

func TestPacerHoldsRate(t *testing.T) {
	p := &pacer{rate: 10000}
	start := time.Now()
	for range 6 {
		require.NoError(t, p.wait(context.Background(), 500))
	}
	// Five batches of 500 keys had to wait for their predecessors: 250 ms.
	assert.GreaterOrEqual(t, time.Since(start), 240*time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	assert.Error(t, p.wait(ctx, 500))
	assert.NoError(t, (&pacer{}).wait(context.Background(), 1<<30), "rate 0 is unpaced")
}

func TestFormatting(t *testing.T) {
	assert.Equal(t, "1,000,000", formatCount(1000000))
	assert.Equal(t, "999", formatCount(999))
	assert.Equal(t, "-1,234", formatCount(-1234))
	assert.Equal(t, "0", formatCount(0))
	assert.Equal(t, "250ms", formatWindow(250*time.Millisecond))
	assert.Equal(t, "2h", formatWindow(2*time.Hour))
	assert.Equal(t, "90s", formatWindow(90*time.Second))
}

// The command reads and prints the library's one notation: what it prints
// as a policy's notation reads back, through the command and through
// throttler.ParsePolicy, as the same policy with the same stored keys.
func TestParsePolicyOneNotation(t *testing.T) {
	for _, c := range []struct{ flagName, spec, name, notation string }{
		{"api", "10/s name=per:sec", "api", "api: 10/s name=per:sec"},
		{"", "core: 10/s name=a, 20/s name=b:x", "core", "core: 10/s name=a, 20/s name=b:x"},
		{"", "api:v2: 10/s, 5000/h gcra burst=20", "api:v2", "api:v2: 10/s, 5000/h gcra burst=20"},
		{"", "core:\t10/s", "core", "core: 10/s"},
		{"api", "10/s name=per-sec, 5000/h", "api", "api: 10/s name=per-sec, 5000/h"},
		{"core", "core: 10/s NAME=Burst, 20/s", "core", "core: 10/s name=Burst, 20/s"},
		{"", `"GET /v1: list": 10/s name="per user, per second"`, "GET /v1: list", `"GET /v1: list": 10/s name="per user, per second"`},
	} {
		p, err := parsePolicy(c.flagName, c.spec)
		require.NoError(t, err, c.spec)
		assert.Equal(t, c.name, p.Name(), c.spec)
		assert.Equal(t, c.notation, describePolicy(p).Notation, c.spec)
		again, err := parsePolicy("", describePolicy(p).Notation)
		require.NoError(t, err, c.spec)
		lib, err := throttler.ParsePolicy("", describePolicy(p).Notation)
		require.NoError(t, err, c.spec)
		for _, q := range []*throttler.Policy{again, lib} {
			assert.Equal(t, p.Limits(), q.Limits(), c.spec)
			assert.Equal(t, mustCompiled(t, p).Limits, mustCompiled(t, q).Limits, "the same stored keys: %s", c.spec)
		}
	}
	for _, spec := range []string{": 10/s", "10/s", "api: per-sec=10/s", `"api 10/s`} {
		_, err := parsePolicy("", spec)
		var ue *usageError
		assert.ErrorAs(t, err, &ue, spec)
	}
}

// The keys explain shows are those of key layout 2: an unnamed limit's
// holds no name and no max, so raising max keeps them; a name given either
// way gives the same key.
func TestCompiledKeysFollowLayoutTwo(t *testing.T) {
	keys := func(spec string) []string {
		t.Helper()
		p, err := parsePolicy("api", spec)
		require.NoError(t, err, spec)
		dp, err := compiled(p)
		require.NoError(t, err, spec)
		var ks []string
		for _, l := range dp.Limits {
			ks = append(ks, l.Key)
		}
		return ks
	}
	assert.Equal(t, []string{":fixed:1000", ":gcra:3600000", ":sliding:60000", ":aligned:60000"},
		keys("10/s, 5000/h gcra, 100/min sliding, 60/min aligned"))
	assert.Equal(t, keys("10/s, 5000/h gcra"), keys("20/s, 6000/h gcra"), "max is not part of a key")
	assert.Equal(t, []string{":gcra:3600000:20"}, keys("5000/h gcra burst=20"))
	assert.Equal(t, []string{"per-sec:fixed:1000"}, keys("10/s name=per-sec"))
	assert.Equal(t, keys("10/s name=per-sec"), keys("10/s name=per-sec"))
	assert.Equal(t, keys("10/s name=per-sec"), keys("20/s name=per-sec"))
}
