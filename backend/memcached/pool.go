package memcachedbackend

import (
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/bradfitz/gomemcache/memcache"
)

// This file holds the hygiene of the connection pools around outages.
//
// gomemcache hands out its idle connections without checking them, and an
// outage can kill every one of them without the client noticing: after a
// restart each fails its next call with EOF, after a black hole each waits
// out a whole Timeout. Left alone, the dead connections would fail one call
// each after the server is back, which behind a circuit breaker means one
// failed probe, and another open period, each. So the first call that
// fails on a dead or silent connection closes every idle connection to
// that server (each server has a client, hence a pool, of its own: see
// servers.go), and later calls dial fresh ones; the server's breaker does
// the same when it opens and before its probe, and so does breaker.Wrap's
// (CloseIdleConnections).

// CloseIdleConnections closes the idle connections to every server, those
// of the client given to New included; calls in flight keep theirs, and
// later calls dial new ones. It implements breaker.IdleCloser.
func (b *Backend) CloseIdleConnections() {
	if b == nil || b.client == nil {
		return
	}
	// gomemcache's Close closes the idle connections alone and leaves the
	// client usable: a later call dials anew.
	_ = b.client.Close()
	b.servers.Range(func(_, s any) bool {
		s.(*server).closeIdle()
		return true
	})
}

// connectionLost reports an error of the connection or the network, as
// opposed to an answer of the server (a miss, a lost CAS race, a server
// error reply).
func connectionLost(err error) bool {
	if err == nil {
		return false
	}
	switch {
	case errors.Is(err, memcache.ErrCacheMiss), errors.Is(err, memcache.ErrCASConflict),
		errors.Is(err, memcache.ErrNotStored), errors.Is(err, memcache.ErrServerError),
		errors.Is(err, memcache.ErrMalformedKey), errors.Is(err, memcache.ErrNoStats),
		errors.Is(err, memcache.ErrNoServers):
		return false
	}
	var ne net.Error
	var cte *memcache.ConnectTimeoutError
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, net.ErrClosed) || errors.As(err, &ne) || errors.As(err, &cte)
}
