package replication

import (
	"bufio"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"
)

// gossipPair is a gossip transport on a PortMux, and the address to send to.
func gossipPair(b testing.TB) (*gossipTransport, *PortMux) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	mux, err := ListenMux("127.0.0.1:0", log)
	if err != nil {
		b.Fatal(err)
	}
	gt := newGossipTransport(mux, mux.Addr(), netip.Addr{}, log)
	done := make(chan struct{})
	go func() { mux.Serve(); close(done) }()
	b.Cleanup(func() { mux.Close(); gt.close(); <-done })
	return gt, mux
}

func TestGossipTransportCarriesPacketsAndStreams(t *testing.T) {
	gt, mux := gossipPair(t)
	shim := gossipShim{gt}
	addr := mux.Addr().String()
	for i := range 100 {
		if _, err := shim.WriteTo([]byte{byte(i), 1, 2, 3}, addr); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 100 {
		select {
		case p := <-shim.PacketCh():
			if len(p.Buf) != 4 || p.Buf[0] != byte(i) || p.From.String() != addr {
				t.Fatalf("packet %d: %v from %v", i, p.Buf, p.From)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("packet %d not delivered", i)
		}
	}
	c, err := shim.DialTimeout(addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case s := <-shim.StreamCh():
		c.Write([]byte("hi"))
		buf := make([]byte, 2)
		if _, err := io.ReadFull(s, buf); err != nil || string(buf) != "hi" {
			t.Fatalf("stream read %q, %v", buf, err)
		}
		s.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("stream not delivered")
	}
	if _, err := shim.WriteTo(make([]byte, maxGossipPacket+1), addr); err == nil {
		t.Error("an oversized packet was accepted")
	}
}

// The two ways to carry memberlist's packets over TCP, measured
// (go test -bench GossipPacket ./replication): one persistent connection
// per peer (what gossipTransport does) against a connection per packet.
func BenchmarkGossipPacketPersistent(b *testing.B) {
	gt, mux := gossipPair(b)
	addr := mux.Addr().String()
	pkt := make([]byte, 200)
	b.ResetTimer()
	for range b.N {
		gt.sendPacket(pkt, addr)
		<-gt.packetCh
	}
}

func BenchmarkGossipPacketConnPerPacket(b *testing.B) {
	gt, mux := gossipPair(b)
	addr := mux.Addr().String()
	pkt := make([]byte, 200)
	self := addr
	b.ResetTimer()
	for range b.N {
		c, err := DialKind(addr, KindGossipPacket, time.Second)
		if err != nil {
			b.Fatal(err)
		}
		w := bufio.NewWriter(c)
		w.WriteByte(byte(len(self)))
		w.WriteString(self)
		writeFrame(w, pkt)
		w.Flush()
		<-gt.packetCh
		c.Close()
	}
}

// TestGossipPacketNotLostToAWriterLeaving: packets sent while their
// peer's writer leaves for idleness all arrive. sendPacket queued a packet
// after releasing the lock, so it could land in the queue of a writer
// that had just checked its queue empty and left: lost, counted sent.
func TestGossipPacketNotLostToAWriterLeaving(t *testing.T) {
	gt, mux := gossipPair(t)
	gt.idle = 20 * time.Microsecond // writers leave between almost every packet
	addr := mux.Addr().String()
	var got atomic.Int64
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-gt.packetCh:
				got.Add(1)
			case <-stop:
				return
			}
		}
	}()
	for i := range 3000 {
		if err := gt.sendPacket([]byte{byte(i)}, addr); err != nil {
			t.Fatal(err)
		}
		if i%2 == 0 { // gaps of about the idle time: the leave races the next send
			time.Sleep(time.Duration(rand.IntN(40)) * time.Microsecond)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for got.Load() != gt.sent.Load() {
		if time.Now().After(deadline) {
			t.Fatalf("%d packets sent, %d arrived", gt.sent.Load(), got.Load())
		}
		time.Sleep(time.Millisecond)
	}
}
