//go:build !linux

package main

import "os/exec"

// setProcAttr does nothing outside Linux; the harness stops its services
// itself.
func setProcAttr(*exec.Cmd) {}
