package replication

import (
	"strings"
	"testing"
	"time"
)

// TestPeerAddressesAreIPsNeverNames: an address from a peer is a literal
// ip:port; a name is refused, not looked up (it was: net.ResolveTCPAddr on
// gossip metadata and packet headers, a DNS query on a peer's say-so).
func TestPeerAddressesAreIPsNeverNames(t *testing.T) {
	for _, tc := range []struct {
		in, want string
	}{
		{"127.0.0.1:17711", "127.0.0.1:17711"},
		{"[::1]:17711", "[::1]:17711"},
		{"[::ffff:10.0.0.1]:5", "10.0.0.1:5"},
		{"localhost:17711", ""},
		{"example.com:17711", ""},
		{"127.0.0.1", ""},
		{"127.0.0.1:0", ""},
		{"0.0.0.0:17711", ""},
		{"[fe80::1%eth0]:17711", ""},
		{"", ""},
	} {
		got, err := parsePeerAddr(tc.in)
		switch {
		case tc.want == "" && err == nil:
			t.Errorf("parsePeerAddr(%q) = %v, want an error", tc.in, got)
		case tc.want != "" && (err != nil || got.String() != tc.want):
			t.Errorf("parsePeerAddr(%q) = %v, %v; want %s", tc.in, got, err, tc.want)
		}
	}
	id := strings.Repeat("a", 40)
	if _, err := decodeMeta([]byte("dq1 " + id + " 127.0.0.1:7711 127.0.0.1:17711 -")); err != nil {
		t.Fatalf("good metadata refused: %v", err)
	}
	for _, bad := range []string{
		"dq1 " + id + " localhost:7711 127.0.0.1:17711 -",
		"dq1 " + id + " 127.0.0.1:7711 evil.example:17711 -",
	} {
		if _, err := decodeMeta([]byte(bad)); err == nil {
			t.Errorf("metadata with a name accepted: %q", bad)
		}
	}
}

// TestGossipPacketHeaderWithANameIsClosed: a packet connection whose
// header names a host (not an ip:port) is closed, its packets unread.
func TestGossipPacketHeaderWithANameIsClosed(t *testing.T) {
	gt, mux := gossipPair(t)
	c, err := DialKind(mux.Addr().String(), KindGossipPacket, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	name := "localhost:1"
	c.Write(append([]byte{byte(len(name))}, name...))
	c.Write([]byte{0, 0, 0, 1, 42})
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || strings.Contains(err.Error(), "timeout") {
		t.Fatalf("connection not closed: %v", err)
	}
	if n := gt.received.Load(); n != 0 {
		t.Fatalf("%d packets taken from a connection naming a host", n)
	}
}
