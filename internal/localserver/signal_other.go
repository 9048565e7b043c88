//go:build !unix

package localserver

import (
	"errors"
	"fmt"
)

// errNoSignals reports a fault this platform cannot inflict.
var errNoSignals = errors.New("localserver: SIGSTOP and SIGCONT need a unix system")

// Pause needs SIGSTOP: an error here.
func (r *Redis) Pause() error { return fmt.Errorf("%w: %w", ErrInvalidArgument, errNoSignals) }

// Resume needs SIGCONT: an error here.
func (r *Redis) Resume() error { return fmt.Errorf("%w: %w", ErrInvalidArgument, errNoSignals) }

// Pause needs SIGSTOP: an error here.
func (m *Memcached) Pause() error { return fmt.Errorf("%w: %w", ErrInvalidArgument, errNoSignals) }

// Resume needs SIGCONT: an error here.
func (m *Memcached) Resume() error { return fmt.Errorf("%w: %w", ErrInvalidArgument, errNoSignals) }

// Kill kills the server, as when a host dies; Start brings it back, empty.
func (m *Memcached) Kill() { m.proc.kill9() }

// Pause needs SIGSTOP: an error here.
func (u *Unleash) Pause() error { return fmt.Errorf("%w: %w", ErrInvalidArgument, errNoSignals) }

// Resume needs SIGCONT: an error here.
func (u *Unleash) Resume() error { return fmt.Errorf("%w: %w", ErrInvalidArgument, errNoSignals) }
