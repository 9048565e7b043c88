package memcachedbackend

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/throttlekit/throttlekit/internal/hrw"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// RendezvousSelector is a gomemcache ServerSelector that places keys by
// rendezvous (highest random weight) hashing: each server scores a key with
// a hash of the key and the server's name, and the highest score wins.
// Adding a server to n moves only the keys the newcomer now wins, about
// 1/(n+1) of them, and losing a server moves only the keys it held, whereas
// gomemcache's default ServerList (a CRC modulo the number of servers)
// remaps most keys.
//
// A key is placed by its routing part, what precedes RouteSeparator (the
// whole key when there is none), so every item of one identifier under one
// policy is on one server. Servers are named by the strings given to
// SetServers, not by their resolved addresses: give every process the same
// spelling so they agree on placement.
//
// It is safe for concurrent use; its zero value has no servers.
type RendezvousSelector struct {
	mu      sync.RWMutex
	servers []rendezvousServer
}

var _ memcache.ServerSelector = (*RendezvousSelector)(nil)

type rendezvousServer struct {
	addr net.Addr
	seed uint64 // hash of the server's name
}

// NewRendezvousSelector returns a selector over servers ("host:port", or a
// Unix socket path containing '/'). The error wraps driver.ErrInvalidOption.
func NewRendezvousSelector(servers ...string) (*RendezvousSelector, error) {
	s := new(RendezvousSelector)
	if err := s.SetServers(servers...); err != nil {
		return nil, err
	}
	return s, nil
}

// SetServers replaces the server list. On error (wrapping driver.ErrInvalidOption)
// the list is left as it was: an empty list, an entry that is empty, has no
// host or no port, or a port outside 1 to 65535 (what an unset environment
// variable gives: "" or "127.0.0.1:"), and an entry listed twice are
// refused, so that a mistake is an error here and not a client whose every
// call fails. Keys held by servers that stay keep their place unless a
// newcomer outscores it.
func (s *RendezvousSelector) SetServers(servers ...string) error {
	if len(servers) == 0 {
		return driver.Errorf("%w: memcached: servers: empty list (want host:port or a Unix socket path)", driver.ErrInvalidOption)
	}
	list := make([]rendezvousServer, 0, len(servers))
	seen := make(map[string]bool, len(servers))
	for i, name := range servers {
		if seen[name] {
			return driver.Errorf("%w: memcached: servers[%d]: %q listed twice", driver.ErrInvalidOption, i, name)
		}
		seen[name] = true
		if err := checkServerName(name); err != nil {
			return driver.Errorf("%w: memcached: servers[%d] %q: %w", driver.ErrInvalidOption, i, name, err)
		}
		addr, err := resolve(name)
		if err != nil {
			return driver.Errorf("%w: memcached: servers[%d] %q: %w", driver.ErrInvalidOption, i, name, err)
		}
		list = append(list, rendezvousServer{addr: addr, seed: hrw.Hash(name)})
	}
	s.mu.Lock()
	s.servers = list
	s.mu.Unlock()
	return nil
}

// checkServerName refuses a server name that cannot reach a server although
// net.ResolveTCPAddr accepts it: "" (every call would dial the local host's
// port 0), no host, or a missing or zero port.
func checkServerName(name string) error {
	if name == "" {
		return errors.New("empty (an unset variable?); want host:port")
	}
	if strings.Contains(name, "/") {
		return nil // a Unix socket path
	}
	host, port, err := net.SplitHostPort(name)
	if err != nil {
		return errors.New("want host:port")
	}
	if host == "" {
		return errors.New("no host; want host:port")
	}
	if port == "" {
		return errors.New("no port; want host:port (memcached listens on 11211)")
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return fmt.Errorf("port %q is not a number from 1 to 65535", port)
	}
	return nil
}

// resolve turns a server name into an address the way gomemcache's
// ServerList does, keeping the name as the address's string.
func resolve(name string) (net.Addr, error) {
	if strings.Contains(name, "/") {
		a, err := net.ResolveUnixAddr("unix", name)
		if err != nil {
			return nil, err
		}
		return staticAddr{network: a.Network(), str: a.String()}, nil
	}
	a, err := net.ResolveTCPAddr("tcp", name)
	if err != nil {
		return nil, err
	}
	return staticAddr{network: a.Network(), str: a.String()}, nil
}

// staticAddr is a resolved address whose strings are computed once:
// gomemcache keys its connection pool by String().
type staticAddr struct{ network, str string }

func (a staticAddr) Network() string { return a.network }
func (a staticAddr) String() string  { return a.str }

// PickServer returns the server that holds key: the one with the highest
// score for the key's routing part. It fails with memcache.ErrNoServers
// when the list is empty.
func (s *RendezvousSelector) PickServer(key string) (net.Addr, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	switch len(s.servers) {
	case 0:
		return nil, memcache.ErrNoServers
	case 1:
		return s.servers[0].addr, nil
	}
	h := hrw.Hash(routeOf(key))
	best, bestScore := 0, uint64(0)
	for i, srv := range s.servers {
		// A tie (probability 2^-64) goes to the higher seed, so processes
		// that list the servers in different orders still agree.
		score := hrw.Score(h, srv.seed)
		if i == 0 || score > bestScore || score == bestScore && srv.seed > s.servers[best].seed {
			best, bestScore = i, score
		}
	}
	return s.servers[best].addr, nil
}

// Each calls f for every server, in the order given to SetServers, and
// stops at the first error.
func (s *RendezvousSelector) Each(f func(net.Addr) error) error {
	s.mu.RLock()
	addrs := make([]net.Addr, len(s.servers))
	for i, srv := range s.servers {
		addrs[i] = srv.addr
	}
	s.mu.RUnlock()
	for _, a := range addrs {
		if err := f(a); err != nil {
			return err
		}
	}
	return nil
}
