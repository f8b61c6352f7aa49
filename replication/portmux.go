package replication

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"
)

// A node has exactly two ports: the client port and the bus port. The bus
// port carries every cluster protocol: memberlist's gossip streams and
// packets, and the persistent job links of the Transport. The first byte of
// each TCP connection says which protocol it speaks.
const (
	// KindBus: a persistent job link (Transport).
	KindBus byte = 'B'
	// KindGossipStream: one of memberlist's streams (push/pull state
	// exchange, a direct ping's fallback).
	KindGossipStream byte = 'S'
	// KindGossipPacket: memberlist packets (probes, gossip) carried over TCP.
	KindGossipPacket byte = 'P'
)

// firstByteTimeout bounds how long an accepted connection may take to say
// what it is: a client that connects and says nothing holds no goroutine
// for longer.
const firstByteTimeout = 5 * time.Second

// PortMux shares one TCP listener among the protocols of the bus port. Each
// accepted connection is handed, after its first byte (which is consumed),
// to the handler registered for that byte, on a goroutine of its own. A
// connection whose first byte names no handler is closed and logged.
type PortMux struct {
	ln  net.Listener
	log *slog.Logger

	mu       sync.Mutex
	handlers map[byte]func(net.Conn)
	conns    map[net.Conn]struct{} // accepted, not yet handed over
	closed   bool
	done     chan struct{}
}

// ListenMux listens on addr ("host:port"; port 0 picks one).
func ListenMux(addr string, log *slog.Logger) (*PortMux, error) {
	if log == nil {
		log = slog.Default()
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("replication: listen on the bus port: %w", err)
	}
	return &PortMux{ln: ln, log: log, handlers: map[byte]func(net.Conn){},
		conns: map[net.Conn]struct{}{}, done: make(chan struct{})}, nil
}

// Handle registers h for connections whose first byte is kind. Register
// every handler before Serve.
func (m *PortMux) Handle(kind byte, h func(net.Conn)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.handlers[kind] = h
}

// Addr is the address listened on.
func (m *PortMux) Addr() *net.TCPAddr { return m.ln.Addr().(*net.TCPAddr) }

// Serve accepts connections until Close. It returns nil after Close.
func (m *PortMux) Serve() error {
	defer close(m.done)
	var backoff time.Duration
	for {
		c, err := m.ln.Accept()
		if err != nil {
			m.mu.Lock()
			closed := m.closed
			m.mu.Unlock()
			if closed || errors.Is(err, net.ErrClosed) {
				return nil
			}
			// A transient accept error (EMFILE): back off, never spin.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			m.log.Warn("replication: accept on the bus port", "err", err, "retry_in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		m.mu.Lock()
		if m.closed {
			m.mu.Unlock()
			c.Close()
			return nil
		}
		m.conns[c] = struct{}{}
		m.mu.Unlock()
		go m.dispatch(c)
	}
}

func (m *PortMux) dispatch(c net.Conn) {
	var kind [1]byte
	c.SetReadDeadline(time.Now().Add(firstByteTimeout))
	_, err := io.ReadFull(c, kind[:])
	c.SetReadDeadline(time.Time{})
	m.mu.Lock()
	delete(m.conns, c)
	h := m.handlers[kind[0]]
	closed := m.closed
	m.mu.Unlock()
	switch {
	case closed:
		c.Close()
	case err != nil:
		c.Close() // said nothing: a port scan or a health check
	case h == nil:
		m.log.Warn("replication: a connection to the bus port speaks no protocol of ours; closed",
			"remote", c.RemoteAddr().String(), "first_byte", fmt.Sprintf("%#x", kind[0]))
		c.Close()
	default:
		h(c)
	}
}

// Close stops accepting and closes the connections not yet handed over.
// Handlers own the connections they were given.
func (m *PortMux) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	for c := range m.conns {
		c.Close()
	}
	m.mu.Unlock()
	return m.ln.Close()
}

// DialKind connects to a bus port and says which protocol follows.
func DialKind(addr string, kind byte, timeout time.Duration) (net.Conn, error) {
	return dialKindFrom(context.Background(), netip.Addr{}, addr, kind, timeout)
}
