// Package upgradetest holds tests only: it upgrades stores that earlier
// releases of throttlekit wrote to the code in this tree, while the
// earlier release is still running or just after it stopped, and judges
// the upgrade from the results both versions returned.
//
// The earlier release is built from its own source: the tests extract the
// release's commit from this repository's history (git archive), add the
// program in testdata/probe to it, and build it with the release's own
// go.mod. The program decides identifiers on real servers started by
// internal/localserver and prints each result as a JSON line; the code
// under test decides the same identifiers in the test process. A clone
// without those commits (a shallow one) skips the tests and says why.
//
// The verdict is the one clients would reach from the headers they read:
// per identifier, no ResetAt that changes while its window is open, no
// window that grants more than its quota counting the grants of every
// version, and no error or degraded result.
package upgradetest
