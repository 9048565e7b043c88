// Package releasecheck tests scripts/apicheck.sh, the check that every
// module's exported API stays compatible with the last release's unless
// CHANGELOG.md announces the change: it fails on a deliberately removed
// exported function and passes once the CHANGELOG names it.
package releasecheck
