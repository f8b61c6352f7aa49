package replication

import (
	"fmt"
	"net"
	"net/netip"
)

// parsePeerAddr parses an address another node gave us (gossip metadata,
// a packet connection's header, the nodes file): a literal ip:port, never
// a name — a name would be a DNS lookup on a peer's say-so, on the
// gossip or ping path. IPv4-mapped IPv6 addresses are taken as IPv4, as
// net.ResolveTCPAddr printed them.
func parsePeerAddr(s string) (*net.TCPAddr, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return nil, fmt.Errorf("replication: %q is not an ip:port: %w", s, err)
	}
	if ap.Port() == 0 || ap.Addr().IsUnspecified() || ap.Addr().Zone() != "" {
		return nil, fmt.Errorf("replication: %q is not a peer's address", s)
	}
	return net.TCPAddrFromAddrPort(netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())), nil
}
