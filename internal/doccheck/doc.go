// Package doccheck holds no code: its test fails when documentation names
// an identifier of this module that does not exist.
//
// The test parses every package of the module with go/parser (no build,
// no go/packages) and collects what each exports: functions, types,
// constants, variables, and each type's methods and fields, promoted ones
// included. It then reads
//
//   - every doc.go file: each reference written as a package name, a dot
//     and an exported name (throttler.New), or with a member after it
//     (throttler.Throttler.Peek), where the package is one of the module's;
//     each Go doc link, a name in square brackets; and each member of one
//     of the package's own exported types, written Type dot Member;
//   - README.md and docs/*.md: each such qualified reference inside an
//     inline code span (backticks). Fenced code blocks are left to the
//     compiler and to examples/examples_test.go.
//
// and reports every reference that names nothing. References to other
// modules' packages (redis.NewClient) are not checked. The integration
// modules inside the repository (observe/otel, observe/prometheus,
// middleware/grpc, each with a go.mod of its own) count as the module's:
// their packages are loaded and checked the same way; bench/ is not.
//
// # Code that compiles
//
// A second test compiles the Go the documentation shows, each piece as a
// package of its own, through go build's -overlay (nothing is written into
// the repository; the packages exist only for the build), in the module
// that provides what it imports (a program that imports promobserver
// compiles in observe/prometheus's module, everything else in the core's):
//
//   - every ```go block of README.md and docs/*.md. A block that starts
//     with a package clause is a whole program and compiles as it stands,
//     with no allowance. Any other block is a fragment;
//   - every inline code span of those pages that is one call of a function
//     of the module's packages, such as `memcachedbackend.New(client)`,
//     compiled as a statement (a span that does not parse as Go, such as
//     `rollout.WithMode(...)`, is prose and left alone);
//   - every code block (the tab-indented lines of a gofmt'd comment) in a
//     comment outside the package docs, when it parses as Go statements or
//     declarations and calls a selector (x.F(...)): tables and notation
//     examples ("10/s gcra") do not.
//
// The convention for fragments, so that none needs a marker: a fragment
// that parses as declarations compiles as a file; otherwise as the body of
// a function. Imports are added for every package name it uses, resolved
// the way the module's own files write it: this module's packages by their
// package names (memorybackend, throttler), and any name an import of the
// module's files gives (context, time, redis for go-redis, memcache). A
// fragment may also carry its own import declarations. Names a fragment
// takes from its surroundings (client, opts, th, ctx) stay undefined: the
// compiler's "undefined: name" for an unqualified name is allowed, as are
// "declared and not used" and a return statement of the function the
// fragment stands in. Everything else the compiler says is an error: a
// function of the module that does not exist, a wrong number or type of
// arguments where the types are known, a two-valued call passed on as one
// value. So a fragment checks every call it makes into the module; write
// variables' declarations into it to have their uses checked too.
package doccheck
