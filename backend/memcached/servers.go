package memcachedbackend

import (
	"log/slog"
	"net"
	"runtime"
	"sync"
	"weak"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/throttlekit/throttlekit/backend/breaker"
	"github.com/throttlekit/throttlekit/throttler/driver"
)

// This file holds what a Backend keeps per memcached server: a connection
// pool of its own and a circuit breaker (see "Servers" in the package
// documentation).

// WithBreaker configures the circuit breaker every memcached server has by
// default (see package breaker): once a server has failed opts' number of
// consecutive round trips over the failing period, calls for the
// identifiers it holds fail at once with an error wrapping
// breaker.ErrOpen, and the throttler answers them by their failure mode in
// microseconds instead of waiting out the client's Timeout, while the
// identifiers of the other servers go on as before. A probe goes through
// after the open period; the server is used again as soon as one answers.
// WithoutBreaker turns them off.
//
// Breakers are on by default because the figures say so (the package
// documentation, Servers): with one server of three hung or killed, its
// identifiers cost microseconds once its breaker opened instead of a whole
// Timeout each, the others' identifiers see nothing of it, and a returned
// server is used again within the open period and one probe; and healthy
// servers did not trip them when a loaded process made hundreds of their
// calls time out.
//
// A breaker needs to know which server holds a key: the backend has them
// for a client of NewClient, and for one built with memcache.NewFromSelector
// when WithSelector names its selector. For any other client there is no
// breaker by default, and WithBreaker is an error wrapping
// driver.ErrInvalidOption.
//
// Network errors and timeouts count as failures; every answer of the
// server, an error reply included, counts as a success. When a breaker
// opens, and before each probe, the idle connections to its server (and
// to it alone) are closed, so that the probe dials afresh.
func WithBreaker(opts ...breaker.Option) Option {
	return optionFunc(func(b *Backend) error {
		b.cfg.breaker, b.cfg.breakerAsked, b.cfg.breakerOpts = true, true, opts
		return nil
	})
}

// WithoutBreaker turns off the servers' circuit breakers (see WithBreaker):
// every call then goes to its server, and one to a server that is hung
// waits the client's whole Timeout. The connection pools per server stay.
func WithoutBreaker() Option {
	return optionFunc(func(b *Backend) error {
		b.cfg.breaker, b.cfg.breakerAsked, b.cfg.breakerOpts = false, false, nil
		return nil
	})
}

// WithSelector tells a Backend over a client built with
// memcache.NewFromSelector(sel) which selector places its keys, so that it
// can give each server a circuit breaker and a connection pool of its own
// (see WithBreaker). The backend then places keys by sel, whatever the
// client was built over. A client of NewClient needs no such option.
func WithSelector(sel *RendezvousSelector) Option {
	return optionFunc(func(b *Backend) error {
		if sel == nil {
			return driver.Errorf("%w: memcached: WithSelector(nil)", driver.ErrInvalidOption)
		}
		b.selector = sel
		return nil
	})
}

// serverConfig holds the options about servers.
type serverConfig struct {
	breaker      bool // on by default; WithoutBreaker turns it off
	breakerAsked bool // WithBreaker was given: no placement is then an error
	breakerOpts  []breaker.Option
}

// server is one memcached server as a Backend uses it: a client of its
// own, so that closing the idle connections of a server that failed
// leaves the others' alone, and its breaker (nil without breakers).
type server struct {
	client *memcache.Client
	br     *breaker.Breaker
}

// oneServer is the selector of a server's own client.
type oneServer struct{ addr net.Addr }

func (s oneServer) PickServer(string) (net.Addr, error) { return s.addr, nil }
func (s oneServer) Each(f func(net.Addr) error) error   { return f(s.addr) }

var _ memcache.ServerSelector = oneServer{}

// clientSelectors maps each client NewClient built to its selector. The
// keys are weak: an entry goes when its client does.
var clientSelectors sync.Map // weak.Pointer[memcache.Client] -> *RendezvousSelector

// registerSelector records that c was built over sel.
func registerSelector(c *memcache.Client, sel *RendezvousSelector) {
	k := weak.Make(c)
	clientSelectors.Store(k, sel)
	runtime.AddCleanup(c, func(k weak.Pointer[memcache.Client]) { clientSelectors.Delete(k) }, k)
}

// selectorOf returns the selector NewClient built c over, or nil.
func selectorOf(c *memcache.Client) *RendezvousSelector {
	if v, ok := clientSelectors.Load(weak.Make(c)); ok {
		return v.(*RendezvousSelector)
	}
	return nil
}

// setUpServers completes New: the placement and the breakers.
func (b *Backend) setUpServers() error {
	if b.selector == nil {
		b.selector = selectorOf(b.client)
	}
	if b.selector == nil {
		if b.cfg.breakerAsked {
			return driver.Errorf("%w: memcached: WithBreaker needs to know which server holds a key: build the client with NewClient, or give WithSelector the selector of memcache.NewFromSelector",
				driver.ErrInvalidOption)
		}
		// Placement unknown: every call goes through the client as given.
		b.whole = &server{client: b.client}
		return nil
	}
	if b.cfg.breaker {
		set, err := breaker.NewSet(b.cfg.breakerOpts...)
		if err != nil {
			return err
		}
		b.breakers = set
	}
	return nil
}

// serverOf returns the server that holds the keys of route.
func (b *Backend) serverOf(route string) (*server, error) {
	if b.whole != nil {
		return b.whole, nil
	}
	addr, err := b.selector.PickServer(route)
	if err != nil {
		return nil, driver.Errorf("throttlekit: memcached: %w", err)
	}
	return b.server(addr), nil
}

// server returns the server at addr, made on first use with a client that
// takes the Timeout, MaxIdleConns and DialContext of the backend's client.
func (b *Backend) server(addr net.Addr) *server {
	name := addr.String()
	if s, ok := b.servers.Load(name); ok {
		return s.(*server)
	}
	b.serversMu.Lock()
	defer b.serversMu.Unlock()
	if s, ok := b.servers.Load(name); ok {
		return s.(*server)
	}
	mc := memcache.NewFromSelector(oneServer{addr})
	mc.Timeout, mc.MaxIdleConns, mc.DialContext = b.client.Timeout, b.client.MaxIdleConns, b.client.DialContext
	s := &server{client: mc}
	if b.breakers != nil {
		s.br = b.breakers.For(name)
		s.br.AddDrain(s.closeIdle)
	}
	b.servers.Store(name, s)
	return s
}

// do runs one round trip f on s: through its breaker, if any, which
// rejects it at once with an error wrapping breaker.ErrOpen while open;
// a connection lost closes s's idle connections.
func (s *server) do(f func() error) error {
	var done func(error)
	if s.br != nil {
		var err error
		if done, err = s.br.Allow(); err != nil {
			return err
		}
	}
	err := f()
	lost := connectionLost(err)
	if lost {
		s.closeIdle()
	}
	if done != nil {
		if lost {
			done(err)
		} else {
			done(nil) // the server answered, if only with an error reply
		}
	}
	return err
}

// closeIdle closes s's idle connections; later round trips dial anew.
func (s *server) closeIdle() {
	// gomemcache's Close closes the idle connections alone and leaves the
	// client usable.
	_ = s.client.Close()
}

// each calls f for every server of the placement, in the order given to
// it, and stops at the first error.
func (b *Backend) each(f func(*server) error) error {
	if b.whole != nil {
		return f(b.whole)
	}
	var addrs []net.Addr
	_ = b.selector.Each(func(a net.Addr) error { addrs = append(addrs, a); return nil })
	if len(addrs) == 0 {
		return driver.Errorf("throttlekit: memcached: %w", memcache.ErrNoServers)
	}
	for _, a := range addrs {
		if err := f(b.server(a)); err != nil {
			return err
		}
	}
	return nil
}

// Breakers returns the state of every breaker the backend has made so far
// (one per server it has talked to), sorted by server; nil with
// WithoutBreaker, or for a client whose placement the backend does not
// know (see WithBreaker).
func (b *Backend) Breakers() []breaker.Status {
	if b == nil || b.breakers == nil {
		return nil
	}
	return b.breakers.Statuses()
}

// SetLogger implements driver.LoggerSetter: the servers' breakers log to
// l, and nowhere for a nil l, unless WithBreaker was given
// breaker.WithLogger, which wins.
func (b *Backend) SetLogger(l *slog.Logger) {
	if b == nil || b.breakers == nil {
		return
	}
	b.breakers.SetLogger(l)
}

var _ driver.LoggerSetter = (*Backend)(nil)
