package doccheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// pkgInfo is what one package of the module exports.
type pkgInfo struct {
	name  string
	dir   string // relative to the module root
	names map[string]bool
	// types maps an exported type to its members (methods and fields,
	// promoted ones included once resolved).
	types map[string]*typeInfo
	// imports maps, per file, an import's local name to its path; used to
	// resolve embedded types of other packages.
	imports map[string]string
}

type typeInfo struct {
	members map[string]bool
	// embedded lists embedded types: "T" for one of the same package,
	// "pkg.T" for another.
	embedded []string
	// open is set when the type has members this test cannot list (an
	// alias, or an embedded type from outside the module).
	open bool
}

// module is every package of the module, by package name. A name that two
// packages share (main) is left out: a reference cannot say which it means.
type module struct {
	root    string
	byName  map[string]*pkgInfo
	byDir   map[string]*pkgInfo
	modPath string
	// nested maps the integration modules inside the repository (observe/otel,
	// middleware/grpc...), by directory relative to root, to their module
	// paths. Their packages are documented and checked as the core's are;
	// bench/, a module of benchmarks against other libraries, is not.
	nested map[string]string
}

// nestedModule returns the module path of dir's go.mod when dir is an
// integration module of the repository: one whose module path is the
// core's followed by its directory, outside bench/.
func (m *module) nestedModule(rel string) (string, bool) {
	src, err := os.ReadFile(filepath.Join(m.root, rel, "go.mod"))
	if err != nil {
		return "", false
	}
	for _, line := range strings.Split(string(src), "\n") {
		if p, ok := strings.CutPrefix(line, "module "); ok {
			p = strings.TrimSpace(p)
			rel = filepath.ToSlash(rel)
			return p, p == m.modPath+"/"+rel && rel != "bench" && !strings.HasPrefix(rel, "bench/")
		}
	}
	return "", false
}

func loadModule(t *testing.T) *module {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := &module{root: root, byName: map[string]*pkgInfo{}, byDir: map[string]*pkgInfo{}, nested: map[string]string{}}
	for _, line := range strings.Split(string(gomod), "\n") {
		if p, ok := strings.CutPrefix(line, "module "); ok {
			m.modPath = strings.TrimSpace(p)
		}
	}
	dupes := map[string]bool{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		base := d.Name()
		if path != root && (strings.HasPrefix(base, ".") || strings.HasPrefix(base, "_") || base == "testdata" || base == "vendor") {
			return filepath.SkipDir
		}
		if path != root {
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				rel, _ := filepath.Rel(root, path)
				modPath, ok := m.nestedModule(rel)
				if !ok {
					return filepath.SkipDir // another module (bench/)
				}
				m.nested[filepath.ToSlash(rel)] = modPath
			}
		}
		p, err := parseDir(root, path)
		if err != nil {
			return err
		}
		if p == nil {
			return nil
		}
		m.byDir[p.dir] = p
		if _, seen := m.byName[p.name]; seen || dupes[p.name] {
			dupes[p.name] = true
			delete(m.byName, p.name)
			return nil
		}
		m.byName[p.name] = p
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range m.byDir {
		for _, ti := range p.types {
			m.resolve(p, ti, 0)
		}
	}
	return m
}

// parseDir parses the non-test Go files of dir, or returns nil when it has
// none.
func parseDir(root, dir string) (*pkgInfo, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	rel, _ := filepath.Rel(root, dir)
	p := &pkgInfo{dir: filepath.ToSlash(rel), names: map[string]bool{}, types: map[string]*typeInfo{}, imports: map[string]string{}}
	fset := token.NewFileSet()
	found := false
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || !strings.HasSuffix(n, ".go") || strings.HasSuffix(n, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, n), nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		found = true
		p.name = f.Name.Name
		for _, imp := range f.Imports {
			path := strings.Trim(imp.Path.Value, `"`)
			local := path[strings.LastIndex(path, "/")+1:]
			if imp.Name != nil {
				local = imp.Name.Name
			}
			p.imports[local] = path
		}
		for _, decl := range f.Decls {
			p.addDecl(decl)
		}
	}
	if !found {
		return nil, nil
	}
	return p, nil
}

func (p *pkgInfo) typ(name string) *typeInfo {
	ti := p.types[name]
	if ti == nil {
		ti = &typeInfo{members: map[string]bool{}}
		p.types[name] = ti
	}
	return ti
}

func (p *pkgInfo) addDecl(decl ast.Decl) {
	switch d := decl.(type) {
	case *ast.FuncDecl:
		if d.Recv == nil {
			p.names[d.Name.Name] = true
			return
		}
		if recv := receiverType(d.Recv.List[0].Type); recv != "" {
			p.typ(recv).members[d.Name.Name] = true
		}
	case *ast.GenDecl:
		for _, spec := range d.Specs {
			switch s := spec.(type) {
			case *ast.ValueSpec:
				for _, n := range s.Names {
					p.names[n.Name] = true
				}
			case *ast.TypeSpec:
				p.names[s.Name.Name] = true
				ti := p.typ(s.Name.Name)
				if s.Assign.IsValid() {
					ti.open = true // an alias: its members live elsewhere
				}
				switch tt := s.Type.(type) {
				case *ast.StructType:
					for _, f := range tt.Fields.List {
						if len(f.Names) == 0 {
							ti.embedded = append(ti.embedded, typeName(f.Type))
							continue
						}
						for _, n := range f.Names {
							ti.members[n.Name] = true
						}
					}
				case *ast.InterfaceType:
					for _, f := range tt.Methods.List {
						if len(f.Names) == 0 {
							ti.embedded = append(ti.embedded, typeName(f.Type))
							continue
						}
						for _, n := range f.Names {
							ti.members[n.Name] = true
						}
					}
				}
			}
		}
	}
}

// receiverType returns the type name of a method's receiver.
func receiverType(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.StarExpr:
		return receiverType(x.X)
	case *ast.IndexExpr:
		return receiverType(x.X)
	case *ast.IndexListExpr:
		return receiverType(x.X)
	case *ast.Ident:
		return x.Name
	}
	return ""
}

// typeName writes an embedded type as "T" or "pkg.T".
func typeName(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.StarExpr:
		return typeName(x.X)
	case *ast.IndexExpr:
		return typeName(x.X)
	case *ast.IndexListExpr:
		return typeName(x.X)
	case *ast.Ident:
		return x.Name
	case *ast.SelectorExpr:
		if id, ok := x.X.(*ast.Ident); ok {
			return id.Name + "." + x.Sel.Name
		}
	}
	return "?"
}

// resolve adds the members of ti's embedded types to ti, or marks it open
// when one of them is not the module's.
func (m *module) resolve(p *pkgInfo, ti *typeInfo, depth int) {
	if depth > 10 {
		ti.open = true
		return
	}
	for _, e := range ti.embedded {
		owner, name := p, e
		if pkg, n, ok := strings.Cut(e, "."); ok {
			path := p.imports[pkg]
			rel, inModule := strings.CutPrefix(path, m.modPath+"/")
			if !inModule || m.byDir[rel] == nil {
				ti.open = true
				continue
			}
			owner, name = m.byDir[rel], n
		}
		et := owner.types[name]
		if et == nil {
			// A predeclared interface (error, comparable) or an unexported
			// type: its exported members cannot be listed here.
			if name == "error" {
				ti.members["Error"] = true
				continue
			}
			ti.open = true
			continue
		}
		m.resolve(owner, et, depth+1)
		for mem := range et.members {
			ti.members[mem] = true
		}
		ti.open = ti.open || et.open
	}
	ti.embedded = nil
}

// exists reports whether pkg exports name, or name.member.
func (p *pkgInfo) exists(name, member string) bool {
	if member == "" {
		return p.names[name]
	}
	ti := p.types[name]
	if ti == nil {
		return false
	}
	return ti.open || ti.members[member]
}

// A reference written pkg.Name or pkg.Type.Member. The character before it
// must not continue a word or a path, so that "example.com/x.Y" or
// "p.q.R" do not count.
var qualified = regexp.MustCompile(`(^|[^A-Za-z0-9_./\-])([a-z][a-z0-9]*)\.([A-Z][A-Za-z0-9_]*)(?:\.([A-Z][A-Za-z0-9_]*))?`)

// A Go doc link: [Name], [pkg.Name], [Type.Member], [pkg.Type.Member].
var docLink = regexp.MustCompile(`\[([a-z][a-z0-9]*\.)?([A-Z][A-Za-z0-9_]*)(?:\.([A-Z][A-Za-z0-9_]*))?\]`)

// An unqualified Type.Member.
var member = regexp.MustCompile(`(^|[^A-Za-z0-9_./\-])([A-Z][A-Za-z0-9_]*)\.([A-Z][A-Za-z0-9_]*)`)

// problem is one reference that names nothing.
type problem struct {
	where, ref string
}

func (m *module) checkQualified(text, where string, out *[]problem) {
	for _, sm := range qualified.FindAllStringSubmatch(text, -1) {
		p := m.byName[sm[2]]
		if p == nil {
			continue // not one of the module's packages (redis.NewClient, slog.Default)
		}
		if !p.exists(sm[3], sm[4]) {
			*out = append(*out, problem{where, strings.TrimSuffix(sm[2]+"."+sm[3]+"."+sm[4], ".")})
		}
	}
}

// TestDocsNameOnlyIdentifiersThatExist is the check the package doc
// describes.
func TestDocsNameOnlyIdentifiersThatExist(t *testing.T) {
	m := loadModule(t)
	var problems []problem

	for _, p := range m.byDir {
		path := filepath.Join(m.root, p.dir, "doc.go")
		src, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		fset := token.NewFileSet()
		f, err := parser.ParseFile(fset, path, src, parser.ParseComments|parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		where := filepath.ToSlash(filepath.Join(p.dir, "doc.go"))
		for _, cg := range f.Comments {
			text := cg.Text()
			m.checkQualified(text, where, &problems)
			for _, sm := range docLink.FindAllStringSubmatch(text, -1) {
				owner := p
				if sm[1] != "" {
					owner = m.byName[strings.TrimSuffix(sm[1], ".")]
					if owner == nil {
						continue
					}
				}
				if sm[1] == "" && sm[3] == "" && !owner.names[sm[2]] {
					// [Name] of the package itself; a Markdown-like
					// bracket in prose is rare in doc.go, so report it.
					problems = append(problems, problem{where, "[" + sm[2] + "]"})
					continue
				}
				if !owner.exists(sm[2], sm[3]) {
					problems = append(problems, problem{where, strings.Trim(sm[0], "[]")})
				}
			}
			for _, sm := range member.FindAllStringSubmatch(text, -1) {
				if p.types[sm[2]] == nil {
					continue // not a type of this package (Throttler.AllowN in middleware)
				}
				if !p.exists(sm[2], sm[3]) {
					problems = append(problems, problem{where, sm[2] + "." + sm[3]})
				}
			}
		}
	}

	pages, err := filepath.Glob(filepath.Join(m.root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	pages = append([]string{filepath.Join(m.root, "README.md")}, pages...)
	span := regexp.MustCompile("`([^`]+)`")
	for _, path := range pages {
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(m.root, path)
		for _, sm := range span.FindAllStringSubmatch(withoutFences(string(src)), -1) {
			m.checkQualified(sm[1], filepath.ToSlash(rel), &problems)
		}
	}

	sort.Slice(problems, func(i, j int) bool {
		if problems[i].where != problems[j].where {
			return problems[i].where < problems[j].where
		}
		return problems[i].ref < problems[j].ref
	})
	seen := map[problem]bool{}
	for _, pr := range problems {
		if !seen[pr] {
			seen[pr] = true
			t.Errorf("%s names %s, which does not exist", pr.where, pr.ref)
		}
	}
}

// withoutFences blanks the fenced code blocks of a Markdown page: the
// compiler and examples/examples_test.go check those.
func withoutFences(md string) string {
	var b strings.Builder
	fenced := false
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			b.WriteString("\n")
			continue
		}
		if !fenced {
			b.WriteString(line)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// TestTheCheckFindsWhatItShould keeps the check honest: references that
// exist pass, and made-up ones are caught.
func TestTheCheckFindsWhatItShould(t *testing.T) {
	m := loadModule(t)
	cases := []struct {
		text string
		bad  int
	}{
		{"throttler.New and throttler.Throttler.Peek and driver.Backend", 0},
		{"middleware.ClientIPOptions.TrustedProxies and rollout.Split.Side", 0},
		{"redis.NewClient and slog.Default are not ours", 0},
		{"see github.com/throttlekit/throttlekit/throttler.Nope in a path", 0},
		{"throttler.WithDegradedRetryAfter", 1},
		{"throttler.Result.WriteHeaders", 1},
		{"rollout.Backend.Sides and memorybackend.Nothing", 2},
	}
	for _, c := range cases {
		var problems []problem
		m.checkQualified(c.text, "case", &problems)
		if len(problems) != c.bad {
			t.Errorf("%q: %d problems %v, want %d", c.text, len(problems), problems, c.bad)
		}
	}
}
