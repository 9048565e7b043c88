package doccheck

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// snippetKind says how a piece of documented Go code is compiled.
type snippetKind int

const (
	// program: a whole file starting with a package clause, compiled as it
	// is.
	program snippetKind = iota
	// fragment: statements (compiled as the body of a function) or
	// declarations (compiled as a file), with imports added for the
	// packages it names.
	fragment
	// call: an inline code span of Markdown that calls a function of one
	// of the module's packages, compiled as a statement.
	call
)

// snippet is Go code found in documentation.
type snippet struct {
	where string // file:line
	code  string
	kind  snippetKind
}

// compiled is a snippet as the compiler sees it.
type compiled struct {
	snippet
	src        string
	lineOffset int // lines the wrapping adds before the snippet's first
}

// markdownSnippets returns every ```go block of README.md and docs/*.md,
// and every inline code span there that calls a function of one of the
// module's packages.
func markdownSnippets(t *testing.T, m *module) []snippet {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join(m.root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append([]string{filepath.Join(m.root, "README.md")}, pages...)
	span := regexp.MustCompile("`([^`]+)`")
	var out []snippet
	for _, p := range pages {
		src, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(m.root, p)
		rel = filepath.ToSlash(rel)
		lines := strings.Split(string(src), "\n")
		for i := 0; i < len(lines); i++ {
			line := strings.TrimSpace(lines[i])
			if strings.HasPrefix(line, "```") {
				start := i
				lang := strings.TrimPrefix(line, "```")
				for i++; i < len(lines) && !strings.HasPrefix(strings.TrimSpace(lines[i]), "```"); i++ {
				}
				if lang == "go" {
					code := strings.Join(lines[start+1:min(i, len(lines))], "\n")
					out = append(out, snippet{fmt.Sprintf("%s:%d", rel, start+2), code, kindOf(code)})
				}
				continue
			}
			for _, sm := range span.FindAllStringSubmatch(lines[i], -1) {
				if m.callsModule(sm[1]) {
					out = append(out, snippet{fmt.Sprintf("%s:%d", rel, i+1), sm[1], call})
				}
			}
		}
	}
	return out
}

// kindOf tells a whole program from a fragment.
func kindOf(code string) snippetKind {
	for _, line := range strings.Split(code, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "//") {
			continue
		}
		if strings.HasPrefix(line, "package ") {
			return program
		}
		break
	}
	return fragment
}

// callsModule reports whether text is one Go call expression of a
// function of the module's packages, such as
// memcachedbackend.New(client).
func (m *module) callsModule(text string) bool {
	e, err := parser.ParseExpr(text)
	if err != nil {
		return false
	}
	c, ok := e.(*ast.CallExpr)
	if !ok {
		return false
	}
	sel, ok := c.Fun.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	x, ok := sel.X.(*ast.Ident)
	return ok && m.byName[x.Name] != nil
}

// commentSnippets returns the code blocks of comments outside package
// docs (doc.go files and package clauses are left out) that read as Go and
// call something of a package: a tab-indented block of a gofmt'd comment
// that parses as statements or declarations and holds a call pkg.F(...) or
// x.M(...).
func commentSnippets(t *testing.T, m *module) []snippet {
	t.Helper()
	var out []snippet
	err := filepath.WalkDir(m.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			base := d.Name()
			if p != m.root && (strings.HasPrefix(base, ".") || strings.HasPrefix(base, "_") || base == "testdata" || base == "vendor") {
				return filepath.SkipDir
			}
			if m.foreignModule(p) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") || d.Name() == "doc.go" {
			return nil
		}
		src, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, p, src, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			return nil // not this test's business
		}
		rel, _ := filepath.Rel(m.root, p)
		for _, cg := range f.Comments {
			if cg == f.Doc {
				continue
			}
			var block []string
			blockLine := 0
			flush := func() {
				if len(block) > 0 {
					code := strings.Join(block, "\n")
					if looksLikeGo(code) {
						out = append(out, snippet{fmt.Sprintf("%s:%d", filepath.ToSlash(rel), blockLine), code, fragment})
					}
				}
				block = nil
			}
			for _, c := range cg.List {
				text, ok := strings.CutPrefix(c.Text, "//")
				if ok && strings.HasPrefix(text, "\t") {
					if block == nil {
						blockLine = fset.Position(c.Pos()).Line
					}
					block = append(block, text[1:])
					continue
				}
				if ok && strings.TrimSpace(text) == "" && block != nil {
					block = append(block, "")
					continue
				}
				flush()
			}
			flush()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// looksLikeGo reports whether code parses as Go statements or
// declarations and holds a call of a selector (pkg.F(...), x.M(...)):
// notation examples ("10/s gcra") and tables do not.
func looksLikeGo(code string) bool {
	f, _, ok := parseFragment(code)
	if !ok {
		return false
	}
	found := false
	ast.Inspect(f, func(n ast.Node) bool {
		if c, ok := n.(*ast.CallExpr); ok {
			if _, ok := c.Fun.(*ast.SelectorExpr); ok {
				found = true
			}
		}
		return !found
	})
	return found
}

// parseFragment parses code as declarations, else as the statements of a
// function body. It returns the file and the wrapping's parts.
func parseFragment(code string) (f *ast.File, asStatements, ok bool) {
	fset := token.NewFileSet()
	if f, err := parser.ParseFile(fset, "", "package fragment\n"+code, parser.SkipObjectResolution); err == nil {
		return f, false, true
	}
	if f, err := parser.ParseFile(fset, "", "package fragment\nfunc _() {\n"+code+"\n}\n", parser.SkipObjectResolution); err == nil {
		return f, true, true
	}
	return nil, false, false
}

// knownImports maps a package name, as the module's own files write it,
// to its import path: the module's packages, and every import spec of the
// module's files (the standard library and the dependencies), so that a
// fragment that writes redis.NewClient gets go-redis.
func (m *module) knownImports(t *testing.T) map[string]string {
	t.Helper()
	known := map[string]string{}
	for name, p := range m.byName {
		known[name] = m.modPath + "/" + p.dir
	}
	err := filepath.WalkDir(m.root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && m.foreignModule(p) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.ImportsOnly)
		if err != nil {
			return nil
		}
		for _, spec := range f.Imports {
			ip, _ := strconv.Unquote(spec.Path.Value)
			name := path.Base(ip)
			if regexp.MustCompile(`^v[0-9]+$`).MatchString(name) {
				name = strings.TrimPrefix(path.Base(path.Dir(ip)), "go-")
			}
			if spec.Name != nil {
				name = spec.Name.Name
			}
			if name == "_" || name == "." {
				continue
			}
			if _, seen := known[name]; !seen {
				known[name] = ip
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return known
}

// wrap makes a snippet a file the compiler takes.
func wrap(s snippet, known map[string]string) compiled {
	if s.kind == program {
		return compiled{snippet: s, src: s.code}
	}
	body := s.code
	f, asStatements, ok := parseFragment(body)
	if !ok {
		// Compile it anyway, so that the error says what does not parse.
		asStatements = true
	}
	var imports []string
	if f != nil {
		declared := map[string]bool{}
		for _, imp := range f.Imports {
			ip, _ := strconv.Unquote(imp.Path.Value)
			declared[path.Base(ip)] = true
			if imp.Name != nil {
				declared[imp.Name.Name] = true
			}
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.AssignStmt:
				for _, l := range n.Lhs {
					if id, ok := l.(*ast.Ident); ok {
						declared[id.Name] = true
					}
				}
			case *ast.ValueSpec:
				for _, id := range n.Names {
					declared[id.Name] = true
				}
			case *ast.Field:
				for _, id := range n.Names {
					declared[id.Name] = true
				}
			}
			return true
		})
		seen := map[string]bool{}
		ast.Inspect(f, func(n ast.Node) bool {
			sel, ok := n.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			x, ok := sel.X.(*ast.Ident)
			if !ok || declared[x.Name] || seen[x.Name] {
				return true
			}
			if ip, ok := known[x.Name]; ok {
				seen[x.Name] = true
				imports = append(imports, fmt.Sprintf("%s %q", x.Name, ip))
			}
			return true
		})
		sort.Strings(imports)
	}
	var b strings.Builder
	b.WriteString("package fragment\n\n")
	if len(imports) > 0 {
		b.WriteString("import (\n\t" + strings.Join(imports, "\n\t") + "\n)\n\n")
	}
	if asStatements {
		b.WriteString("func _() {\n")
	}
	offset := strings.Count(b.String(), "\n")
	b.WriteString(body)
	if asStatements {
		b.WriteString("\n}\n")
	}
	return compiled{snippet: s, src: b.String(), lineOffset: offset}
}

// loose are the compiler's complaints a fragment or a call is allowed: the
// names it takes from its surroundings (an unqualified undefined name:
// client, opts, th), variables it declares to show them, a return
// statement of the function it stands in, and an import the wrapping
// added for a name the fragment also uses as a variable.
var loose = regexp.MustCompile(`: (undefined: [A-Za-z_][A-Za-z0-9_]*$|declared and not used|"[^"]*" imported (as \w+ )?and not used|too many return values|not enough return values|missing return)`)

// foreignModule reports whether dir holds a module that is neither the
// core nor one of its integration modules (bench/).
func (m *module) foreignModule(dir string) bool {
	rel, _ := filepath.Rel(m.root, dir)
	rel = filepath.ToSlash(rel)
	if rel == "." || m.nested[rel] != "" {
		return false
	}
	_, err := os.Stat(filepath.Join(dir, "go.mod"))
	return err == nil
}

// moduleFor returns the directory, relative to the root, of the module a
// snippet compiles in: the integration module that provides a package it
// imports (observe/prometheus for promobserver), else the core ("."). A
// snippet that imports from two integration modules compiles in the first.
func (m *module) moduleFor(src string) string {
	f, err := parser.ParseFile(token.NewFileSet(), "", src, parser.ImportsOnly)
	if err != nil {
		return "."
	}
	best, bestLen := ".", 0
	for _, imp := range f.Imports {
		ip, _ := strconv.Unquote(imp.Path.Value)
		for dir, modPath := range m.nested {
			if (ip == modPath || strings.HasPrefix(ip, modPath+"/")) && len(modPath) > bestLen {
				best, bestLen = dir, len(modPath)
			}
		}
	}
	return best
}

// compileSnippets compiles every snippet in a package of its own, through
// an overlay (nothing is written into the repository), in the module that
// provides what it imports, and returns each snippet's errors, keyed by
// index.
func compileSnippets(t *testing.T, m *module, snippets []snippet) map[int][]string {
	t.Helper()
	known := m.knownImports(t)
	dir := t.TempDir()
	overlay := map[string]string{}
	pkgs := map[string][]string{} // by module directory
	units := make([]compiled, len(snippets))
	for i, s := range snippets {
		units[i] = wrap(s, known)
		file := filepath.Join(dir, fmt.Sprintf("snippet%03d.go", i))
		if err := os.WriteFile(file, []byte(units[i].src), 0o644); err != nil {
			t.Fatal(err)
		}
		mod := m.moduleFor(units[i].src)
		rel := fmt.Sprintf("internal/doccheck/compiled/s%03d", i)
		if mod != "." {
			rel = fmt.Sprintf("doccheckcompiled/s%03d", i)
		}
		overlay[filepath.Join(m.root, mod, rel, "snippet.go")] = file
		pkgs[mod] = append(pkgs[mod], "./"+rel)
	}
	ov, err := json.Marshal(map[string]any{"Replace": overlay})
	if err != nil {
		t.Fatal(err)
	}
	ovPath := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(ovPath, ov, 0o644); err != nil {
		t.Fatal(err)
	}
	// The go command that runs the tests puts its own GOROOT/bin first on
	// PATH, so this is the same toolchain.
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("no go command on PATH: %v", err)
	}
	var out []byte
	failed := false
	for mod, list := range pkgs {
		args := []string{"build", "-overlay", ovPath, "-gcflags=-e"}
		if len(list) == 1 {
			// A lone main package would leave its binary in the
			// module's directory; several are compiled and discarded.
			args = append(args, "-o", os.DevNull)
		}
		cmd := exec.Command(gobin, append(args, list...)...)
		cmd.Dir = filepath.Join(m.root, mod)
		o, err := cmd.CombinedOutput()
		out = append(out, o...)
		failed = failed || err != nil
	}
	errs := map[int][]string{}
	where := regexp.MustCompile(`snippet(\d{3})\.go:(\d+):(\d+): (.*)$`)
	for _, line := range strings.Split(string(out), "\n") {
		sm := where.FindStringSubmatch(line)
		if sm == nil {
			if strings.TrimSpace(line) != "" && !strings.HasPrefix(line, "#") {
				t.Logf("go build: %s", line)
			}
			continue
		}
		i, _ := strconv.Atoi(sm[1])
		u := units[i]
		if u.kind != program && loose.MatchString(line) {
			continue
		}
		n, _ := strconv.Atoi(sm[2])
		errs[i] = append(errs[i], fmt.Sprintf("line %d: %s", n-u.lineOffset, sm[4]))
	}
	if len(errs) == 0 && failed {
		// Every complaint was allowed, or the build failed for another
		// reason: rebuild nothing, but say so when nothing was parsed.
		for _, line := range strings.Split(string(out), "\n") {
			if strings.Contains(line, "snippet") || strings.HasPrefix(line, "#") || strings.TrimSpace(line) == "" {
				continue
			}
			t.Errorf("go build failed outside the snippets: %s", line)
		}
	}
	return errs
}

// TestDocumentedGoCompiles compiles every piece of Go the documentation
// shows (see the package doc for what counts and how each is wrapped).
func TestDocumentedGoCompiles(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the compiler over every snippet")
	}
	m := loadModule(t)
	snippets := append(markdownSnippets(t, m), commentSnippets(t, m)...)
	counts := map[snippetKind]int{}
	for _, s := range snippets {
		counts[s.kind]++
		if s.kind != call {
			t.Logf("compiling %s", s.where)
		}
	}
	t.Logf("%d programs, %d fragments, %d calls in inline code", counts[program], counts[fragment], counts[call])
	if counts[program] == 0 || counts[call] == 0 {
		t.Fatalf("found %v: the collection is broken", counts)
	}
	errs := compileSnippets(t, m, snippets)
	var idx []int
	for i := range errs {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	for _, i := range idx {
		t.Errorf("%s does not compile:\n\t%s\n%s", snippets[i].where, strings.Join(errs[i], "\n\t"), indent(snippets[i].code))
	}
}

// TestTheCompileCheckCatches keeps the check honest: a call of a wrong
// arity, a multi-value call passed on, and a name the module lacks fail,
// while a fragment that takes its variables from around it passes.
func TestTheCompileCheckCatches(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the compiler")
	}
	m := loadModule(t)
	cases := []struct {
		s   snippet
		bad bool
	}{
		{snippet{"ok call", `memorybackend.New()`, call}, false},
		{snippet{"ok call with free names", `redisbackend.New(redis.NewClient(opts))`, call}, false},
		{snippet{"two values passed on", `memcachedbackend.New(memcachedbackend.NewClient(timeout, servers...))`, call}, true},
		{snippet{"missing function", `throttler.NoSuchThing(1)`, call}, true},
		{snippet{"ok fragment", "policy, err := throttler.ParsePolicy(\"api\", \"10/s\")\nr, err := th.Allow(ctx, policy, \"user:42\")", fragment}, false},
		{snippet{"a free variable's method goes unchecked", "r, err := th.Allow(ctx, throttler.PerSecond(1), \"user:42\")", fragment}, false},
		{snippet{"wrong type", "var p *throttler.Policy = throttler.PerSecond(1)", fragment}, true},
		{snippet{"program", "package main\n\nfunc main() { undefinedThing() }\n", program}, true},
	}
	var snippets []snippet
	for _, c := range cases {
		snippets = append(snippets, c.s)
	}
	errs := compileSnippets(t, m, snippets)
	for i, c := range cases {
		if got := len(errs[i]) > 0; got != c.bad {
			t.Errorf("%s: errors %v, want failing=%v", c.s.where, errs[i], c.bad)
		}
	}
}

func indent(s string) string {
	return "\t\t" + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n\t\t")
}
