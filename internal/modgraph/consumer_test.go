package modgraph

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// heavy matches the modules a core user must not inherit.
var heavy = regexp.MustCompile(`^(google\.golang\.org/grpc|google\.golang\.org/genproto|go\.opentelemetry\.io/|github\.com/prometheus/|golang\.org/x/net) `)

const core = "github.com/throttlekit/throttlekit"

func goTool(t *testing.T) string {
	t.Helper()
	// The go command that runs the tests puts its own GOROOT/bin first on
	// PATH, so this is the same toolchain.
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("no go command on PATH: %v", err)
	}
	return gobin
}

// run runs the go command in dir and returns its output.
func run(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command(goTool(t), args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// corePackages lists every package of the core module a program can
// import: not internal, not a command, not testdata.
func corePackages(t *testing.T, root string) []string {
	t.Helper()
	out := run(t, root, "list", "-f", "{{if ne .Name \"main\"}}{{.ImportPath}}{{end}}", "./...")
	var pkgs []string
	for _, p := range strings.Fields(out) {
		if strings.Contains(p, "/internal/") || strings.Contains(p, "/testdata/") || strings.HasPrefix(p, core+"/examples/") {
			continue
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// consumer writes a module that imports pkgs, with replace directives to
// the modules of this checkout, and returns its directory.
func consumer(t *testing.T, root string, pkgs []string, replaces map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	var gomod strings.Builder
	gomod.WriteString("module example.com/monolith\n\ngo 1.24.0\n\nrequire (\n")
	for mod := range replaces {
		fmt.Fprintf(&gomod, "\t%s v0.0.0-00010101000000-000000000000\n", mod)
	}
	gomod.WriteString(")\n\nreplace (\n")
	for mod, path := range replaces {
		fmt.Fprintf(&gomod, "\t%s => %s\n", mod, path)
	}
	gomod.WriteString(")\n")
	var src strings.Builder
	src.WriteString("package main\n\nimport (\n")
	for _, p := range pkgs {
		fmt.Fprintf(&src, "\t_ %q\n", p)
	}
	src.WriteString(")\n\nfunc main() {}\n")
	sum, err := os.ReadFile(filepath.Join(root, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	for path, content := range map[string]string{"go.mod": gomod.String(), "main.go": src.String(), "go.sum": string(sum)} {
		if err := os.WriteFile(filepath.Join(dir, path), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	run(t, dir, "mod", "tidy")
	run(t, dir, "build", "./...")
	return dir
}

// TestCoreConsumerInheritsNoIntegrationDependencies is the check the
// package doc describes.
func TestCoreConsumerInheritsNoIntegrationDependencies(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module in a temporary directory")
	}
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	pkgs := corePackages(t, root)
	for _, want := range []string{"/throttler", "/backend/redis", "/backend/memcached", "/rollout", "/middleware"} {
		found := false
		for _, p := range pkgs {
			found = found || p == core+want
		}
		if !found {
			t.Fatalf("the consumer does not import %s%s: %v", core, want, pkgs)
		}
	}
	dir := consumer(t, root, pkgs, map[string]string{core: root})
	graph := run(t, dir, "list", "-m", "all")
	t.Logf("a consumer of %d core packages: go list -m all\n%s", len(pkgs), graph)
	for _, line := range strings.Split(graph, "\n") {
		if heavy.MatchString(line + " ") {
			t.Errorf("the core's consumer inherits %s", line)
		}
	}

	// The control: a consumer of the Prometheus collector does inherit
	// Prometheus, so the check above would see it.
	prom := core + "/observe/prometheus"
	dir = consumer(t, root, []string{core + "/throttler", prom},
		map[string]string{core: root, prom: filepath.Join(root, "observe", "prometheus")})
	graph = run(t, dir, "list", "-m", "all")
	if !strings.Contains(graph, "github.com/prometheus/client_golang ") {
		t.Errorf("a consumer of %s has no Prometheus client in its graph:\n%s", prom, graph)
	}
}
