//go:build !linux

package localserver

import "os/exec"

// setProcAttr is a no-op outside Linux: there is no portable parent-death
// signal, so callers must Close the servers they start.
func setProcAttr(cmd *exec.Cmd) {}

// setUser is a no-op outside Linux: the servers run as the current user
// there, which must then not be root for PostgreSQL.
func setUser(cmd *exec.Cmd, u *account) {}
