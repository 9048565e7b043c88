package localserver

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy is a TCP proxy on a loopback port in front of one server, which a
// test cuts off the way a network fault would: a black hole (packets
// dropped, nothing closed) that later heals, or every connection reset. A
// client that dials the proxy's address sees the server behind it while the
// proxy forwards. It is safe for concurrent use.
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	holing bool // new connections join the black hole
	links  map[*link]struct{}
	closed bool
	wg     sync.WaitGroup
}

// link is one client connection and, while it forwards, its connection to
// the server.
type link struct {
	client net.Conn
	mu     sync.Mutex
	server net.Conn // nil once the link is dead or was never connected
}

// StartProxy listens on a free loopback port and forwards every connection
// made to it to target (a host:port).
func StartProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("localserver: proxy listen: %w", err)
	}
	p := &Proxy{ln: ln, target: target, links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// ProxyT starts a proxy to target for a test (see [StartProxy]) and closes
// it when the test ends.
func ProxyT(tb testing.TB, target string) *Proxy {
	tb.Helper()
	p, err := StartProxy(target)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { closeT(tb, p.Close) })
	return p
}

// Addr returns the address clients dial, "127.0.0.1:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// BlackHole cuts the server off without closing anything: every open
// connection stays open to its client, which can still write, but what it
// writes is dropped and nothing comes back; new connections are accepted
// and treated the same. The proxy's connections to the server are closed.
func (p *Proxy) BlackHole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holing = true
	for l := range p.links {
		l.kill()
	}
}

// Heal ends a black hole for new connections, which reach the server
// again. The connections the black hole swallowed stay dead, silently, as
// behind a NAT or firewall that lost their state: a client finds out only
// by its own timeouts.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holing = false
}

// Reset closes every open connection with a TCP reset (RST) on the
// client's side; new connections forward as before.
func (p *Proxy) Reset() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := range p.links {
		l.kill()
		if tc, ok := l.client.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
		_ = l.client.Close()
	}
}

// Close stops the proxy and closes every connection. It is idempotent.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	err := p.ln.Close()
	for l := range p.links {
		l.kill()
		_ = l.client.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		l := &link{client: c}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = c.Close()
			return
		}
		holing := p.holing
		p.links[l] = struct{}{}
		p.wg.Add(1)
		p.mu.Unlock()
		go p.serve(l, holing)
	}
}

// serve forwards one link until its client goes away; a dead link's
// client bytes are read and dropped.
func (p *Proxy) serve(l *link, holing bool) {
	defer p.wg.Done()
	defer func() {
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
		l.kill()
		_ = l.client.Close()
	}()
	if !holing {
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			return // the client sees its connection closed, as with a refused one
		}
		l.mu.Lock()
		l.server = s
		l.mu.Unlock()
		p.wg.Add(1)
		go func() { // server to client, until the server side is closed
			defer p.wg.Done()
			_, _ = io.Copy(l.client, s)
			if l.alive() { // the server closed: so does the client's side
				_ = l.client.Close()
			}
		}()
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := l.client.Read(buf)
		if n > 0 {
			if s := l.upstream(); s != nil {
				if _, werr := s.Write(buf[:n]); werr != nil && l.alive() {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// upstream returns the server connection, nil once the link is dead.
func (l *link) upstream() net.Conn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.server
}

// alive reports a link still forwarding.
func (l *link) alive() bool { return l.upstream() != nil }

// kill makes the link dead: its server connection is closed and nothing
// more is forwarded either way.
func (l *link) kill() {
	l.mu.Lock()
	s := l.server
	l.server = nil
	l.mu.Unlock()
	if s != nil {
		_ = s.Close()
	}
}
