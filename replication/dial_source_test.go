package replication

import (
	"errors"
	"io"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/diskque/diskque/internal/faultproxy"
	"github.com/diskque/diskque/internal/leakcheck"
)

// acceptOne accepts one connection on ln within 10 s.
func acceptOne(t *testing.T, ln net.Listener) net.Conn {
	t.Helper()
	got := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			got <- c
		}
		close(got)
	}()
	select {
	case c := <-got:
		if c == nil {
			t.Fatal("accept failed")
		}
		t.Cleanup(func() { c.Close() })
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no connection within 10 s")
	}
	return nil
}

func remoteIP(c net.Conn) netip.Addr {
	return c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
}

// TestTCPTransportDialsFromSourceAddr: a link's connection leaves from
// TCPConfig.SourceAddr.
func TestTCPTransportDialsFromSourceAddr(t *testing.T) {
	src := netip.MustParseAddr("127.0.0.9")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	n := startTCPNode(t, TCPConfig{ID: randomID(t), SourceAddr: src, Handler: func(string, Message) {}})
	n.tr.SetPeer(randomID(t), ln.Addr().String())
	c := acceptOne(t, ln)
	if got := remoteIP(c); got != src {
		t.Fatalf("link dialled from %s, want %s", got, src)
	}
	kind := make([]byte, 1)
	if _, err := io.ReadFull(c, kind); err != nil || kind[0] != KindBus {
		t.Fatalf("first byte %q, %v; want the bus kind", kind, err)
	}
}

// TestGossipDialsFromSourceAddr: packet connections and streams leave from
// the gossip transport's source address and name the advertised address.
func TestGossipDialsFromSourceAddr(t *testing.T) {
	src := netip.MustParseAddr("127.0.0.9")
	log := testLogger(t)
	mux, err := ListenMux("127.0.0.1:0", log)
	if err != nil {
		t.Fatal(err)
	}
	advertise := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 9), Port: 4242}
	gt := newGossipTransport(mux, advertise, src, log)
	defer func() { mux.Close(); gt.close() }()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if err := gt.sendPacket([]byte("ping"), ln.Addr().String()); err != nil {
		t.Fatal(err)
	}
	c := acceptOne(t, ln)
	hdr := make([]byte, 2+len(advertise.String()))
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, hdr); err != nil {
		t.Fatal(err)
	}
	if got := remoteIP(c); got != src || hdr[0] != KindGossipPacket || string(hdr[2:]) != advertise.String() {
		t.Fatalf("packet connection from %s, header %q; want from %s naming %s", got, hdr, src, advertise)
	}
	go gossipShim{gt}.DialTimeout(ln.Addr().String(), 5*time.Second)
	if got := remoteIP(acceptOne(t, ln)); got != src {
		t.Fatalf("stream dialled from %s, want %s", got, src)
	}
}

func TestMembershipRefusesABadAdvertiseBus(t *testing.T) {
	mux, err := ListenMux("127.0.0.1:0", testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	defer mux.Close()
	for _, bad := range []string{"127.0.0.1", "localhost:7000", "0.0.0.0:7000", "127.0.0.1:0"} {
		_, err := NewMembership(MembershipConfig{ID: randomID(t), ClientAddr: "127.0.0.1:7711", Mux: mux,
			AdvertiseBus: bad, Logger: testLogger(t)})
		if !errors.Is(err, ErrInvalidAddress) {
			t.Errorf("AdvertiseBus %q: err = %v, want ErrInvalidAddress", bad, err)
		}
	}
}

// TestMembershipThroughAFaultProxy: node b listens on its own address and
// advertises a fault proxy in front of its bus; a, dialling from its own
// address, meets b at the proxy. Both see each other, a knows b by the
// proxy's address, a's gossip to b goes through it, and a cut there makes a
// fail b until the heal.
func TestMembershipThroughAFaultProxy(t *testing.T) {
	leakcheck.Check(t)
	nt, err := faultproxy.New(2)
	if err != nil {
		t.Fatal(err)
	}
	defer nt.Close()
	start := func(i int) *testNode {
		nd := nt.Node(i)
		return startNode(t, "", "", nodeOpts{timeout: time.Second,
			addr:      netip.AddrPortFrom(nd.IP, uint16(nd.BusPort)).String(),
			advertise: nd.Proxy.String(), source: nd.IP})
	}
	a, b := start(0), start(1)
	if err := a.m.MeetBus(nt.Node(1).IP.String(), int(nt.Node(1).Proxy.Port())); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "a and b reach each other", allReachable([]*testNode{a, b}))
	if info, _ := a.node(b.id); info.BusAddr != nt.Node(1).Proxy.String() {
		t.Fatalf("a knows b's bus at %s, want the proxy %s", info.BusAddr, nt.Node(1).Proxy)
	}
	if s := nt.Stats(1); s.Accepted == 0 || s.BytesUp == 0 {
		t.Fatalf("b's proxy carried nothing: %+v", s)
	}
	nt.Cut(0, 1)
	waitFor(t, 20*time.Second, "a to flag b failed under the cut", func() bool {
		info, ok := a.node(b.id)
		return ok && info.Failed
	})
	nt.HealAll()
	waitFor(t, 20*time.Second, "a and b reach each other after the heal", allReachable([]*testNode{a, b}))
}
