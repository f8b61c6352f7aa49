package replication

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// gossipTransport carries memberlist over the bus port (PortMux), so a node
// needs no UDP port of its own:
//
//   - a stream (push/pull, the fallback TCP ping) is one connection whose
//     first byte is KindGossipStream, handed to memberlist as is;
//
//   - packets (probes, acks, gossip) travel over a persistent connection per
//     peer whose first byte is KindGossipPacket, followed by the sender's
//     advertised bus address and then frames:
//
//     'P' | addrLen uint8 | addr | { len uint32 (big endian) | packet }...
//
// Sending a packet never blocks memberlist's loops: WriteTo queues it on the
// peer's bounded queue and a writer goroutine per peer dials, batches and
// writes; a full queue, or a peer that cannot be dialled, drops the packet
// (memberlist is built for lossy UDP and retries what matters). A writer
// with nothing to send for packetIdle closes its connection and exits.
//
// One gossipTransport outlives the memberlist instances built on it
// (SetNodeTimeout and Reset recreate memberlist): memberlist gets a
// gossipShim whose Shutdown does not close the shared transport.
type gossipTransport struct {
	advertise *net.TCPAddr
	src       netip.Addr // source address of our dials (zero: the OS's choice)
	log       *slog.Logger

	packetCh chan *memberlist.Packet
	streamCh chan net.Conn
	done     chan struct{}

	mu      sync.Mutex
	writers map[string]*packetWriter // by peer bus address
	inbound map[net.Conn]struct{}    // accepted packet connections
	closed  bool
	wg      sync.WaitGroup

	// heard, if set, is told the bus address of every packet's sender
	// (the membership's liveness evidence).
	heard func(addr string)

	sent, received atomic.Int64 // packets and streams

	// idle is packetIdle (tests shorten it).
	idle time.Duration
}

const (
	// maxGossipPacket bounds one packet frame read from a peer (memberlist's
	// packets are at most UDPBufferSize, far below): a larger length closes
	// that connection only.
	maxGossipPacket = 64 << 10
	// packetQueueLen bounds the packets queued for one peer.
	packetQueueLen = 256
	// packetIdle closes a peer's packet connection that carried nothing.
	packetIdle = 30 * time.Second
	// packetDialBackoff: after a failed dial, packets for that peer are
	// dropped for this long instead of dialling once per packet.
	packetDialBackoff = 200 * time.Millisecond
	// gossipDialTimeout bounds a packet connection's dial.
	gossipDialTimeout = time.Second
	// packetWriteTimeout bounds one batch's write to a peer.
	packetWriteTimeout = 2 * time.Second
)

func newGossipTransport(mux *PortMux, advertise *net.TCPAddr, src netip.Addr, log *slog.Logger) *gossipTransport {
	t := &gossipTransport{
		advertise: advertise,
		src:       src,
		log:       log,
		packetCh:  make(chan *memberlist.Packet, 64),
		streamCh:  make(chan net.Conn),
		done:      make(chan struct{}),
		writers:   map[string]*packetWriter{},
		inbound:   map[net.Conn]struct{}{},
		idle:      packetIdle,
	}
	mux.Handle(KindGossipStream, t.acceptStream)
	mux.Handle(KindGossipPacket, t.acceptPackets)
	return t
}

// acceptStream hands an incoming stream to memberlist (the PortMux calls it
// on a goroutine of its own).
func (t *gossipTransport) acceptStream(c net.Conn) {
	t.received.Add(1)
	select {
	case t.streamCh <- c:
	case <-t.done:
		c.Close()
	}
}

// acceptPackets reads one peer's packet connection until it breaks.
func (t *gossipTransport) acceptPackets(c net.Conn) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		c.Close()
		return
	}
	t.inbound[c] = struct{}{}
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		delete(t.inbound, c)
		t.mu.Unlock()
		c.Close()
	}()
	r := bufio.NewReaderSize(c, 16<<10)
	c.SetReadDeadline(time.Now().Add(firstByteTimeout))
	n, err := r.ReadByte()
	if err != nil {
		return
	}
	addrBuf := make([]byte, n)
	if _, err := io.ReadFull(r, addrBuf); err != nil {
		return
	}
	c.SetReadDeadline(time.Time{})
	from, err := parsePeerAddr(string(addrBuf)) // a name is refused, not looked up
	if err != nil {
		t.log.Debug("replication: a gossip packet connection names no address; closed",
			"remote", c.RemoteAddr().String())
		return
	}
	fromStr := from.String()
	var hdr [4]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return
		}
		size := binary.BigEndian.Uint32(hdr[:])
		if size == 0 || size > maxGossipPacket {
			t.log.Warn("replication: a gossip packet frame is malformed; its connection is closed",
				"from", fromStr, "size", size)
			return
		}
		buf := make([]byte, size)
		if _, err := io.ReadFull(r, buf); err != nil {
			return
		}
		t.received.Add(1)
		if t.heard != nil {
			t.heard(fromStr)
		}
		select {
		case t.packetCh <- &memberlist.Packet{Buf: buf, From: from, Timestamp: time.Now()}:
		case <-t.done:
			return
		}
	}
}

// sendPacket queues b for addr; it never waits for the network.
func (t *gossipTransport) sendPacket(b []byte, addr string) error {
	if len(b) > maxGossipPacket {
		return fmt.Errorf("replication: gossip packet of %d bytes is over the %d-byte limit", len(b), maxGossipPacket)
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return errors.New("replication: gossip transport closed")
	}
	w := t.writers[addr]
	if w == nil {
		w = &packetWriter{t: t, addr: addr, queue: make(chan []byte, packetQueueLen)}
		t.writers[addr] = w
		t.wg.Add(1)
		go w.run()
	}
	pkt := append([]byte(nil), b...) // memberlist may reuse b
	// Queued under mu: an idle writer leaves (and is forgotten) under mu
	// only when its queue is empty. Queued after the unlock, a packet
	// could land in the queue of a writer that had just left: lost,
	// though counted sent.
	defer t.mu.Unlock()
	select {
	case w.queue <- pkt:
		t.sent.Add(1)
		return nil
	default:
		return nil // full: dropped, as UDP would
	}
}

// packetWriter owns one peer's outgoing packet connection.
type packetWriter struct {
	t     *gossipTransport
	addr  string
	queue chan []byte
}

func (w *packetWriter) run() {
	defer w.t.wg.Done()
	var conn net.Conn
	var bw *bufio.Writer
	var backoffUntil time.Time
	idle := time.NewTimer(w.t.idle)
	defer func() {
		idle.Stop()
		if conn != nil {
			conn.Close()
		}
	}()
	for {
		var pkt []byte
		select {
		case <-w.t.done:
			return
		case pkt = <-w.queue:
		case <-idle.C:
			w.t.mu.Lock()
			if len(w.queue) == 0 {
				delete(w.t.writers, w.addr)
				w.t.mu.Unlock()
				return
			}
			w.t.mu.Unlock()
			idle.Reset(w.t.idle)
			continue
		}
		idle.Reset(w.t.idle)
		if conn == nil {
			if time.Now().Before(backoffUntil) {
				continue // dropped
			}
			c, err := w.dial()
			if err != nil {
				backoffUntil = time.Now().Add(packetDialBackoff)
				w.t.log.Debug("replication: gossip packet dial failed", "peer", w.addr, "err", err)
				continue
			}
			conn, bw = c, bufio.NewWriterSize(c, 16<<10)
		}
		// Batch what is queued into one write.
		conn.SetWriteDeadline(time.Now().Add(packetWriteTimeout))
		err := writeFrame(bw, pkt)
		for more := true; more && err == nil; {
			select {
			case p := <-w.queue:
				err = writeFrame(bw, p)
			default:
				more = false
			}
		}
		if err == nil {
			err = bw.Flush()
		}
		if err != nil {
			conn.Close()
			conn, bw = nil, nil
		}
	}
}

func (w *packetWriter) dial() (net.Conn, error) {
	c, err := dialKindFrom(context.Background(), w.t.src, w.addr, KindGossipPacket, gossipDialTimeout)
	if err != nil {
		return nil, err
	}
	self := w.t.advertise.String()
	hdr := append([]byte{byte(len(self))}, self...)
	c.SetWriteDeadline(time.Now().Add(gossipDialTimeout))
	if _, err := c.Write(hdr); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func writeFrame(w *bufio.Writer, pkt []byte) error {
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(pkt)))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := w.Write(pkt)
	return err
}

func (t *gossipTransport) dialStream(addr string, timeout time.Duration) (net.Conn, error) {
	c, err := dialKindFrom(context.Background(), t.src, addr, KindGossipStream, timeout)
	if err == nil {
		t.sent.Add(1)
	}
	return c, err
}

// close stops every writer and closes every packet connection; memberlist
// instances must be shut down first.
func (t *gossipTransport) close() {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return
	}
	t.closed = true
	close(t.done)
	for c := range t.inbound {
		c.Close()
	}
	t.mu.Unlock()
	t.wg.Wait()
}

// gossipShim is the memberlist.Transport of one memberlist instance.
type gossipShim struct{ t *gossipTransport }

var _ memberlist.Transport = gossipShim{}

func (s gossipShim) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	return s.t.advertise.IP, s.t.advertise.Port, nil
}

func (s gossipShim) WriteTo(b []byte, addr string) (time.Time, error) {
	return time.Now(), s.t.sendPacket(b, addr)
}

func (s gossipShim) PacketCh() <-chan *memberlist.Packet { return s.t.packetCh }

func (s gossipShim) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return s.t.dialStream(addr, timeout)
}

func (s gossipShim) StreamCh() <-chan net.Conn { return s.t.streamCh }

// Shutdown does nothing: the shared transport outlives this instance.
func (s gossipShim) Shutdown() error { return nil }

// joinHostPort is net.JoinHostPort with an int port.
func joinHostPort(host string, port int) string {
	return net.JoinHostPort(host, strconv.Itoa(port))
}
