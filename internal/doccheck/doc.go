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
// modules' packages (redis.NewClient) are not checked.
package doccheck
