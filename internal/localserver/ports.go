package localserver

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
)

// clusterBusOffset is the distance between a Redis Cluster node's client port
// and its cluster bus port (Redis's default when cluster-port is 0).
const clusterBusOffset = 10000

// reserved holds the ports handed out by this process and not yet released,
// so that two servers of the same test binary never race for one port.
var (
	reservedMu sync.Mutex
	reserved   = map[int]bool{}
)

// reservePort finds a free loopback TCP port. With bus set, port+10000 must
// be free (and a valid port) too. The returned port(s) stay reserved in this
// process until releasePort; other processes may still take them, which the
// callers handle by retrying.
func reservePort(bus bool) (int, error) {
	var lastErr error
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			lastErr = err
			continue
		}
		port := l.Addr().(*net.TCPAddr).Port
		ok := true
		if bus {
			if port+clusterBusOffset > 65535 {
				ok = false
			} else if bl, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+clusterBusOffset))); err != nil {
				ok = false
				lastErr = err
			} else {
				bl.Close()
			}
		}
		l.Close()
		if !ok {
			continue
		}
		reservedMu.Lock()
		if reserved[port] || (bus && reserved[port+clusterBusOffset]) {
			reservedMu.Unlock()
			continue
		}
		reserved[port] = true
		if bus {
			reserved[port+clusterBusOffset] = true
		}
		reservedMu.Unlock()
		return port, nil
	}
	if lastErr == nil {
		lastErr = errors.New("no suitable port found")
	}
	return 0, fmt.Errorf("localserver: reserving a free port: %w", lastErr)
}

// releasePort undoes reservePort.
func releasePort(port int, bus bool) {
	reservedMu.Lock()
	delete(reserved, port)
	if bus {
		delete(reserved, port+clusterBusOffset)
	}
	reservedMu.Unlock()
}
