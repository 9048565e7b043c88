package examples_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
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

// TestREADMEShowsEveryExample: every program appears verbatim in README.md,
// inside a go code block, so that every snippet a user pastes is a program
// CI compiles and runs.
func TestREADMEShowsEveryExample(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := goBlocks(string(readme))
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
		found := false
		for _, b := range blocks {
			if strings.TrimSpace(b) == strings.TrimSpace(string(src)) {
				found = true
			}
		}
		if !found {
			t.Errorf("README.md does not show examples/%s verbatim in a go block", path)
		}
	}
	for _, b := range blocks {
		if strings.HasPrefix(strings.TrimSpace(b), "package main") || strings.HasPrefix(strings.TrimSpace(b), "// Command") {
			continue
		}
		t.Logf("README go block that is not a program (allowed only in the backend author section):\n%.80s", b)
	}
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

var _ = localserver.Available
