package memcachedbackend

import (
	"errors"
	"io"
	"net"
	"syscall"

	"github.com/bradfitz/gomemcache/memcache"
)

// This file holds the hygiene of the client's connection pool around
// outages.
//
// gomemcache hands out its idle connections without checking them, and an
// outage can kill every one of them without the client noticing: after a
// restart each fails its next call with EOF, after a black hole each waits
// out a whole Timeout. Left alone, the dead connections would fail one call
// each after the server is back, which behind a circuit breaker means one
// failed probe, and another open period, each. So the first call that
// fails on a dead or silent connection closes every idle connection, and
// later calls dial fresh ones; the circuit breaker of breaker.Wrap does the
// same when it opens and before its probe (CloseIdleConnections).

// CloseIdleConnections closes the client's idle connections to every
// server; calls in flight keep theirs, and later calls dial new ones. It
// implements breaker.IdleCloser.
func (b *Backend) CloseIdleConnections() {
	if b == nil || b.client == nil {
		return
	}
	// gomemcache's Close closes the idle connections alone and leaves the
	// client usable: a later call dials anew.
	_ = b.client.Close()
}

// afterRoundTrip closes the idle connections when err says the connection
// of a round trip was dead or the server silent: its siblings idle in the
// pool most likely are too.
func (b *Backend) afterRoundTrip(err error) {
	if connectionLost(err) {
		b.CloseIdleConnections()
	}
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
