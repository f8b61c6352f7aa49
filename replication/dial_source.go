package replication

import (
	"context"
	"net"
	"net/netip"
	"time"
)

// Outgoing bus connections (job links, gossip packets and streams) may
// leave from a chosen source address: the daemon's bind-source-addr, or
// its bind when that is one specific IP (as Redis Cluster does). A node
// bound to 127.0.0.3 then reaches its peers from 127.0.0.3, so a peer (or
// a fault proxy in front of one, internal/faultproxy) can tell it from the
// others by the connection's source alone.

// sourceDialer is a dialer whose connections leave from src (the zero
// Addr: wherever the OS routes them from), with the given timeout.
func sourceDialer(src netip.Addr, timeout time.Duration) *net.Dialer {
	d := &net.Dialer{Timeout: timeout, KeepAlive: 15 * time.Second}
	if src.IsValid() {
		d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
	}
	return d
}

// dialKindFrom is DialKind from source address src.
func dialKindFrom(ctx context.Context, src netip.Addr, addr string, kind byte, timeout time.Duration) (net.Conn, error) {
	c, err := sourceDialer(src, timeout).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c.SetWriteDeadline(time.Now().Add(timeout))
	if _, err := c.Write([]byte{kind}); err != nil {
		c.Close()
		return nil, err
	}
	c.SetWriteDeadline(time.Time{})
	return c, nil
}
