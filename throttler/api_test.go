package throttler_test

import (
	"go/ast"
	"go/doc"
	"go/parser"
	"go/token"
	"io/fs"
	"sort"
	"strings"
	"testing"
)

// maxUserAPI bounds the exported identifiers of package throttler, methods
// and each constant and variable included. The package is what an API
// developer reads; what only a backend author needs belongs in
// throttler/driver, and HTTP in middleware. Raise the bound only on purpose.
//
// 67: Event.HasResult, since events carry results by value.
// 76: the concurrency API (issue 15): ConcurrencyLimit, NewConcurrencyLimit,
// ConcurrencyLimit.Name, .Max and .LeaseTTL, Lease, Lease.Release,
// Lease.Renew and Throttler.Acquire.
// 82: the rest of issue 15: SlidingWindow, AllowUpTo, Wait, WaitN,
// ErrWaitExceedsDeadline and ManualClock.After.
// 86: Result.Limits, NumLimits, LimitAt and SetLimits (issue 21): the
// per-limit figures are computed on demand, so that a decision allocates
// nothing.
// 87: Throttler.Logger (issue 22), so that the middleware packages log
// where WithLogger says rather than to slog.Default().
const maxUserAPI = 87

func TestUserAPIFitsOnOneScreen(t *testing.T) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi fs.FileInfo) bool {
		return !strings.HasSuffix(fi.Name(), "_test.go")
	}, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, f := range pkgs["throttler"].Files {
		files = append(files, f)
	}
	d, err := doc.NewFromFiles(fset, files, "github.com/throttlekit/throttlekit/throttler")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	values := func(vs []*doc.Value) {
		for _, v := range vs {
			names = append(names, v.Names...)
		}
	}
	values(d.Consts)
	values(d.Vars)
	for _, f := range d.Funcs {
		names = append(names, f.Name)
	}
	for _, typ := range d.Types {
		names = append(names, typ.Name)
		values(typ.Consts)
		values(typ.Vars)
		for _, f := range typ.Funcs {
			names = append(names, f.Name)
		}
		for _, m := range typ.Methods {
			names = append(names, typ.Name+"."+m.Name)
		}
	}
	sort.Strings(names)
	t.Logf("%d exported identifiers", len(names))
	if len(names) > maxUserAPI {
		t.Errorf("package throttler exports %d identifiers, more than %d:\n%s", len(names), maxUserAPI, strings.Join(names, "\n"))
	}
	for _, typ := range d.Types {
		if typ.Doc == "" {
			t.Errorf("type %s has no doc comment", typ.Name)
		}
	}
}
