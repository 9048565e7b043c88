//go:build unix

package localserver

import (
	"fmt"
	"syscall"
)

// This file holds the faults a test inflicts on a running server besides
// stopping it: a hang (SIGSTOP, then SIGCONT) and, for memcached, a crash.

// signal sends sig to the running process; an error when it is not running.
func (p *process) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.cur
	if r == nil || r.exited() {
		return fmt.Errorf("%w: %s on %s is not running", ErrInvalidArgument, p.name, p.addr)
	}
	if err := r.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("localserver: %s on %s: %v: %w", p.name, p.addr, sig, err)
	}
	return nil
}

// Pause stops the server with SIGSTOP, as a hung host would: connections
// stay open, the kernel still accepts new ones, and nothing is answered
// until Resume. Resume a paused server before Stop or Close, which would
// otherwise wait for it to exit (Kill works on a paused server).
func (r *Redis) Pause() error { return r.proc.signal(syscall.SIGSTOP) }

// Resume continues a server stopped by Pause (SIGCONT).
func (r *Redis) Resume() error { return r.proc.signal(syscall.SIGCONT) }

// Pause stops the server with SIGSTOP (see [Redis.Pause]).
func (m *Memcached) Pause() error { return m.proc.signal(syscall.SIGSTOP) }

// Resume continues a server stopped by Pause (SIGCONT).
func (m *Memcached) Resume() error { return m.proc.signal(syscall.SIGCONT) }

// Kill kills the server with SIGKILL (kill -9), as when a host dies; Start
// brings it back, empty.
func (m *Memcached) Kill() { m.proc.kill9() }

// Pause stops the Unleash server's process with SIGSTOP: its port accepts
// connections and answers nothing until Resume. Its database keeps
// running. Close works on a paused server.
func (u *Unleash) Pause() error { return u.node.signal(syscall.SIGSTOP) }

// Resume continues an Unleash server stopped by Pause (SIGCONT).
func (u *Unleash) Resume() error { return u.node.signal(syscall.SIGCONT) }
