package examples_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/throttlekit/throttlekit/internal/localserver"
)

// example is one program under examples/: the environment it needs (which
// may start servers) and lines its output must contain.
type example struct {
	dir  string
	env  func(t *testing.T) []string
	want []string
}

var examples = []example{
	{dir: "quickstart", want: []string{
		"direct: true 2 3/min",
		"http: 200 remaining 2",
		"http: 200 remaining 1",
		"http: 200 remaining 0",
		"http: 429 remaining 0",
	}},
	{dir: "concurrency", want: []string{
		"direct: true false 1",
		"http: 429 retry after 60",
		"http: 200 retry after \n",
	}},
	{dir: "redis", env: redisEnv, want: []string{
		"allowed=true remaining=2 binding=3/min",
		"allowed=true remaining=0 binding=3/min",
		"allowed=false remaining=0 binding=3/min",
	}},
	{dir: "redis-cluster", env: clusterEnv, want: []string{
		"user:1 allowed=true remaining=2", "user:1 allowed=false remaining=0",
		"user:2 allowed=true remaining=0", "user:3 allowed=false remaining=0",
	}},
	{dir: "redis-sentinel", env: sentinelEnv, want: []string{
		"allowed=true remaining=2", "allowed=true remaining=0", "allowed=false remaining=0",
	}},
	{dir: "memcached", env: memcachedEnv, want: []string{
		"allowed=true remaining=2", "allowed=true remaining=0", "allowed=false remaining=0",
	}},
	{dir: "redis-groups", env: groupsEnv, want: []string{
		"user:1 allowed=true remaining=2", "user:1 allowed=false remaining=0",
		"user:3 allowed=false remaining=0", "user:1 lives on group ",
	}},
	{dir: "observability", want: []string{
		`level=INFO msg="throttlekit: denied" policy=api identifier=alice outcome=denied limit=3/min quota=3 remaining=0 backend=memory`,
		`throttlekit_decisions_total{limit="3/min",outcome="allowed",policy="api"} 4`,
		`throttlekit_decisions_total{limit="3/min",outcome="denied",policy="api"} 1`,
		`throttlekit_near_limit_total{limit="3/min",policy="api"} 1`,
		"debug page names alice: true",
	}},
	{dir: "per-user-redis", env: redisEnv, want: []string{
		`alice: 200 resource="users" remaining="2"`,
		`alice: 200 resource="users" remaining="0"`,
		`alice: 429 resource="users" remaining="0"`,
		`anonymous: 200 resource="anonymous" remaining="1"`,
		`anonymous: 429 resource="anonymous" remaining="0"`,
		`anonymous, per-user rule alone: 200 resource="" remaining=""`,
	}},
	{dir: "partner-quota", env: redisEnv, want: []string{
		"granted: ", "calls; ",
		"        300/min   300      300          0",
		"        15750/h   300    15750      15450",
	}},
	{dir: "rollout-static", env: rolloutEnv, want: []string{
		"user:1 served by the", "user:4 served by the",
		"user:1 now on the new store: allowed=true remaining=1",
		"user:4 now on the new store: allowed=true remaining=1",
	}},
	{dir: "legacy-migration", env: legacyEnv, want: []string{
		"clients: 44, windows mirrored into Redis at 0 %: 44",
		"requests granted after the deploy: 210",
		"window restarts: 0, double grants: 0",
	}},
	{dir: "rollout-unleash", env: unleashEnv, want: []string{
		"rollout: 100%", "user:1 served by the new store: allowed=true remaining=2",
	}},
}

func redisEnv(t *testing.T) []string {
	return []string{"REDIS_ADDR=" + localserver.RedisT(t, localserver.RedisOptions{}).Addr()}
}

func clusterEnv(t *testing.T) []string {
	c := localserver.RedisClusterT(t, 3, 0)
	return []string{"REDIS_CLUSTER_ADDRS=" + strings.Join(c.Addrs(), ",")}
}

func sentinelEnv(t *testing.T) []string {
	primary := localserver.RedisT(t, localserver.RedisOptions{})
	s := localserver.RedisSentinelT(t, primary, "examples", localserver.RedisOptions{})
	return []string{"SENTINEL_ADDRS=" + s.Addr(), "SENTINEL_MASTER=examples"}
}

func memcachedEnv(t *testing.T) []string {
	return []string{"MEMCACHED_ADDRS=" + localserver.MemcachedT(t, localserver.MemcachedOptions{}).Addr()}
}

func groupsEnv(t *testing.T) []string {
	var groups []string
	for _, name := range []string{"a", "b"} {
		primary := localserver.RedisT(t, localserver.RedisOptions{})
		replica := localserver.RedisReplicaT(t, primary, localserver.RedisOptions{})
		groups = append(groups, fmt.Sprintf("%s=redis://%s?replica=redis://%s", name, primary.Addr(), replica.Addr()))
	}
	return []string{"REDIS_GROUPS=" + strings.Join(groups, ",")}
}

func rolloutEnv(t *testing.T) []string {
	return append(memcachedEnv(t), redisEnv(t)...)
}

func legacyEnv(t *testing.T) []string {
	return append(memcachedEnv(t), groupsEnv(t)...)
}

// unleashEnv serves the toggle the example follows at 100%, the way an
// Unleash server's client API does. A real Unleash server needs Node and
// PostgreSQL; the rollout/unleashflag tests cover the client's behaviour.
func unleashEnv(t *testing.T) []string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet || r.URL.Path != "/api/client/features" {
			w.WriteHeader(http.StatusAccepted) // registration and metrics
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"version": 2, "features": []any{map[string]any{
			"name": "ratelimit-redis", "enabled": true, "strategies": []any{map[string]any{
				"name": "flexibleRollout", "constraints": []any{},
				"parameters": map[string]any{"rollout": "100", "stickiness": "default", "groupId": "ratelimit-redis"},
			}},
		}}})
	}))
	t.Cleanup(srv.Close)
	return append(rolloutEnv(t), "UNLEASH_URL="+srv.URL+"/api/", "UNLEASH_TOKEN=example")
}

// TestExamples builds every program and runs it.
func TestExamples(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to build the examples with")
	}
	bin := t.TempDir()
	for _, ex := range examples {
		t.Run(ex.dir, func(t *testing.T) {
			if ex.env != nil && testing.Short() {
				t.Skip("needs real servers")
			}
			exe := filepath.Join(bin, ex.dir)
			build := exec.Command(goTool, "build", "-o", exe, "./"+ex.dir)
			if _, err := os.Stat(filepath.Join(ex.dir, "go.mod")); err == nil {
				// A module of its own (it needs an integration's
				// dependencies), built with the core at this commit
				// through its replace directives.
				build = exec.Command(goTool, "build", "-o", exe, ".")
				build.Dir = ex.dir
			}
			if out, err := build.CombinedOutput(); err != nil {
				t.Fatalf("go build ./%s: %v\n%s", ex.dir, err, out)
			}
			var env []string
			if ex.env != nil {
				env = ex.env(t)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, exe)
			cmd.Env = append(os.Environ(), env...)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Run(); err != nil {
				t.Fatalf("%s: %v\n%s", ex.dir, err, out.String())
			}
			for _, w := range ex.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("%s: output lacks %q:\n%s", ex.dir, w, out.String())
				}
			}
		})
	}
}

// TestEveryExampleIsShownOrLinked: every program is either shown verbatim
// in a go block of README.md or a guide under docs/, or linked from one of
// them (a Markdown link to examples/<name>/), so that a reader finds every
// program CI compiles and runs.
func TestEveryExampleIsShownOrLinked(t *testing.T) {
	pages := markdownPages(t)
	dirs, err := filepath.Glob("*/main.go")
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) != len(examples) {
		t.Errorf("%d programs under examples/, %d in the test table", len(dirs), len(examples))
	}
	for _, path := range dirs {
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Dir(path)
		link := regexp.MustCompile(`\]\((\.\./)?examples/` + regexp.QuoteMeta(name) + `/(main\.go)?\)`)
		found := false
		for _, page := range pages {
			if link.MatchString(page.text) {
				found = true
			}
			for _, b := range goBlocks(page.text) {
				if strings.TrimSpace(b) == strings.TrimSpace(string(src)) {
					found = true
				}
			}
		}
		if !found {
			t.Errorf("examples/%s is neither shown verbatim in a go block nor linked as examples/%s/ from README.md or docs/*.md", path, name)
		}
	}
}

// TestDocsShowProgramsAsTheyAre: a go block that claims to be an example,
// by starting with the "// Command <name>" comment of examples/<name>, is
// that file verbatim, in README.md and in every guide under docs/. Every go
// block of README.md moreover is a file of the repository, compiled and run
// by make test (guides may also show fragments).
func TestDocsShowProgramsAsTheyAre(t *testing.T) {
	claim := regexp.MustCompile(`^// Command ([a-z0-9-]+) `)
	for _, page := range markdownPages(t) {
		for _, b := range goBlocks(page.text) {
			m := claim.FindStringSubmatch(strings.TrimSpace(b))
			if m == nil {
				if page.path == "../README.md" && !sameAsFile(t, b, "../backend/memory/conformance_test.go") {
					t.Errorf("README.md has a go block that is no file of the repository, so nothing compiles it:\n%.200s", b)
				}
				continue
			}
			path := filepath.Join(m[1], "main.go")
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s shows a program that claims to be examples/%s, which does not exist", page.path, path)
				continue
			}
			if !sameAsFile(t, b, path) {
				t.Errorf("%s shows examples/%s, but not as the file is: copy the file into the page again", page.path, path)
			}
		}
	}
}

// page is a Markdown file: README.md or a guide under docs/.
type page struct{ path, text string }

func markdownPages(t *testing.T) []page {
	t.Helper()
	paths, err := filepath.Glob("../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	var pages []page
	for _, p := range append([]string{"../README.md"}, paths...) {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		pages = append(pages, page{p, string(b)})
	}
	return pages
}

func sameAsFile(t *testing.T, block, path string) bool {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(block) == strings.TrimSpace(string(src))
}

func goBlocks(md string) []string {
	var blocks []string
	for {
		i := strings.Index(md, "```go\n")
		if i < 0 {
			return blocks
		}
		md = md[i+len("```go\n"):]
		j := strings.Index(md, "```")
		if j < 0 {
			return blocks
		}
		blocks = append(blocks, md[:j])
		md = md[j+3:]
	}
}
