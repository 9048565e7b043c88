package main

import (
	"os/exec"
	"syscall"
)

// setProcAttr makes a service die with the harness (SIGKILL when the
// harness's thread that started it exits), so that an interrupted run
// leaves no process behind.
func setProcAttr(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
