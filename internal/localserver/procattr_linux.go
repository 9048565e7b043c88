//go:build linux

package localserver

import (
	"os/exec"
	"syscall"
)

// setProcAttr makes the kernel kill the child when the parent goes away, so
// servers never outlive the test binary.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}

// setUser makes the child run as u.
func setUser(cmd *exec.Cmd, u *account) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Credential = &syscall.Credential{Uid: u.uid, Gid: u.gid}
}
