package replication

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/klauspost/compress/s2"

	"github.com/diskque/diskque/internal/leakcheck"
)

// tcpTestLog is a log destination a test can read while the transport
// writes to it.
type tcpTestLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *tcpTestLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *tcpTestLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// waitFor waits until a line containing every one of parts is logged.
func (l *tcpTestLog) waitFor(t *testing.T, parts ...string) {
	t.Helper()
	suiteWaitUntil(t, "a log line with "+strings.Join(parts, ", "), func() bool {
		for _, line := range strings.Split(l.String(), "\n") {
			ok := true
			for _, p := range parts {
				ok = ok && strings.Contains(line, p)
			}
			if ok {
				return true
			}
		}
		return false
	})
}

// tcpTestNode is one node of a TCP test: its bus port and transport.
type tcpTestNode struct {
	mux    *PortMux
	tr     *TCPTransport
	served chan struct{} // closed when Serve returned
	log    *tcpTestLog
}

func (n *tcpTestNode) addr() string { return n.mux.Addr().String() }

func (n *tcpTestNode) close() {
	n.tr.Close()
	n.mux.Close()
	<-n.served
}

// tcpTestConfig is the configuration of the tests' transports: short
// timeouts and backoff, so a test waits little for a redial.
func tcpTestConfig(id, secret string, h Handler) TCPConfig {
	return TCPConfig{ID: id, Secret: secret, Handler: h, HandshakeTimeout: 2 * time.Second,
		BackoffMin: 10 * time.Millisecond, BackoffMax: 200 * time.Millisecond}
}

// startTCPNode listens on 127.0.0.1:0 and starts a transport configured
// by cfg (Mux and Logger set here); Cleanup closes both.
func startTCPNode(t testing.TB, cfg TCPConfig) *tcpTestNode {
	t.Helper()
	n := &tcpTestNode{log: &tcpTestLog{}, served: make(chan struct{})}
	logger := slog.New(slog.NewTextHandler(n.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	mux, err := ListenMux("127.0.0.1:0", logger)
	if err != nil {
		t.Fatal(err)
	}
	n.mux = mux
	cfg.Mux, cfg.Logger = mux, logger
	tr, err := NewTCPTransport(cfg)
	if err != nil {
		mux.Close()
		t.Fatal(err)
	}
	n.tr = tr
	go func() {
		defer close(n.served)
		mux.Serve()
	}()
	t.Cleanup(n.close)
	return n
}

// suiteTCPHarness runs the suite on TCP transports on 127.0.0.1.
type suiteTCPHarness struct {
	secret string
	nodes  map[string]*tcpTestNode
}

func newTCPHarness(t *testing.T, secret string) *suiteTCPHarness {
	return &suiteTCPHarness{secret: secret, nodes: map[string]*tcpTestNode{}}
}

func (h *suiteTCPHarness) start(t *testing.T, id string, hd Handler) Transport {
	n := startTCPNode(t, tcpTestConfig(id, h.secret, hd))
	h.nodes[id] = n
	return n.tr
}

func (h *suiteTCPHarness) startBatch(t *testing.T, id string, hd BatchHandler) Transport {
	cfg := tcpTestConfig(id, h.secret, nil)
	cfg.BatchHandler = hd
	n := startTCPNode(t, cfg)
	h.nodes[id] = n
	return n.tr
}

func (h *suiteTCPHarness) stop(t *testing.T, id string) { h.nodes[id].close() }
func (h *suiteTCPHarness) addr(id string) string        { return h.nodes[id].addr() }

func TestTCPTransportWrongSecretRefused(t *testing.T) {
	leakcheck.Check(t)
	rb := newSuiteRecorder()
	b := startTCPNode(t, tcpTestConfig("node-b", "the-secret", rb.handle))
	b.tr.lim.setInterval(0) // every refusal logged: the two diallers share a host
	wrong := startTCPNode(t, tcpTestConfig("node-w", "not-the-secret", func(string, Message) {}))
	none := startTCPNode(t, tcpTestConfig("node-n", "", func(string, Message) {}))
	for _, n := range []*tcpTestNode{wrong, none} {
		n.tr.SetPeer("node-b", b.addr())
		if err := n.tr.Send("node-b", suiteSeq(0)); err != nil {
			t.Fatal(err)
		}
	}
	// Refused and logged on both sides, with the remote address.
	wrong.log.waitFor(t, "bus link refused", "wrong cluster-secret", "remote="+b.addr())
	b.log.waitFor(t, "bus connection refused", "wrong cluster-secret", "remote=127.0.0.1:")
	none.log.waitFor(t, "bus link refused", "requires a cluster-secret", "remote="+b.addr())
	b.log.waitFor(t, "bus connection refused", "node-n", "requires a cluster-secret")
	none.log.waitFor(t, "the cluster bus is open")

	// The diallers keep trying, with backoff, and never get through.
	suiteWaitUntil(t, "a second attempt", func() bool {
		return strings.Contains(wrong.log.String(), "attempt=2") ||
			strings.Contains(wrong.log.String(), "similar_lines_suppressed") || strings.Count(b.log.String(), "wrong cluster-secret") > 1
	})
	if wrong.tr.Connected("node-b") || none.tr.Connected("node-b") {
		t.Fatalf("a dialler with the wrong secret is connected")
	}
	if got := len(rb.messages("node-w")) + len(rb.messages("node-n")); got != 0 {
		t.Fatalf("%d messages got through without the secret", got)
	}
	if s := b.tr.Stats(); s.MessagesReceived != 0 {
		t.Fatalf("stats count messages from refused links: %+v", s)
	}

	// The right secret gets through.
	good := startTCPNode(t, tcpTestConfig("node-g", "the-secret", func(string, Message) {}))
	good.tr.SetPeer("node-b", b.addr())
	suiteSend(t, good.tr, "node-b", suiteSeq(0))
	suiteCheckSeq(t, rb.waitFor(t, "node-g", 1), 0)
}

func TestTCPTransportWrongNodeRefused(t *testing.T) {
	leakcheck.Check(t)
	rb := newSuiteRecorder()
	b := startTCPNode(t, tcpTestConfig("node-b", "", rb.handle))
	a := startTCPNode(t, tcpTestConfig("node-a", "", func(string, Message) {}))
	// node-x's address now belongs to node-b (node-x was reset, moved…).
	a.tr.SetPeer("node-x", b.addr())
	if err := a.tr.Send("node-x", suiteSeq(0)); err != nil {
		t.Fatal(err)
	}
	a.log.waitFor(t, "bus link refused", "dialled node node-x but reached node node-b")
	b.log.waitFor(t, "bus connection refused", "reached node node-b")
	if a.tr.Connected("node-x") || len(rb.messages("node-a")) != 0 {
		t.Fatalf("a message for node-x was delivered to node-b")
	}
}

// rawFrame builds a frame by hand; corrupt changes it after the checksum
// is computed (nil: a valid frame).
func rawFrame(typ MsgType, flags byte, body []byte, corrupt func(frame []byte)) []byte {
	f := make([]byte, frameHeaderLen+len(body))
	binary.BigEndian.PutUint32(f[0:4], uint32(len(body)))
	f[8], f[9] = byte(typ), flags
	copy(f[frameHeaderLen:], body)
	binary.BigEndian.PutUint32(f[4:8], frameCRC(f, f[frameHeaderLen:]))
	if corrupt != nil {
		corrupt(f)
	}
	return f
}

// rawBusConn dials addr and runs the dialler's handshake as id, as a peer
// writing frames by hand would.
func rawBusConn(t *testing.T, addr, id, secret string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := dialHandshake(c, []byte{KindBus}, id, "", secret); err != nil {
		t.Fatal(err)
	}
	return c
}

// waitClosed fails unless the peer closes c (a read ends with EOF or a
// reset, not with our deadline).
func waitClosed(t *testing.T, c net.Conn) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(suiteDeadline))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the connection was not closed by the peer")
	}
}

func TestTCPTransportMalformedFrameClosesThatLinkOnly(t *testing.T) {
	leakcheck.Check(t)
	const maxFrame = 64 << 10
	rb := newSuiteRecorder()
	cfg := tcpTestConfig("node-b", "key", rb.handle)
	cfg.MaxFrame = maxFrame
	b := startTCPNode(t, cfg)
	a := startTCPNode(t, tcpTestConfig("node-a", "key", func(string, Message) {}))
	a.tr.SetPeer("node-b", b.addr())
	suiteSend(t, a.tr, "node-b", suiteSeq(0))
	rb.waitFor(t, "node-a", 1)

	hello := []byte("hello")
	cases := []struct {
		name  string
		bytes []byte
	}{
		{"bad checksum", rawFrame(MsgReplJob, 0, hello, func(f []byte) { f[len(f)-1] ^= 1 })},
		{"bad length", rawFrame(MsgReplJob, 0, hello, func(f []byte) { f[3]-- })},
		{"over the frame limit", rawFrame(MsgReplJob, 0, nil, func(f []byte) { binary.BigEndian.PutUint32(f, maxFrame+1) })},
		{"huge length", rawFrame(MsgReplJob, 0, nil, func(f []byte) { binary.BigEndian.PutUint32(f, 0xffffffff) })},
		{"type 0", rawFrame(0, 0, hello, nil)},
		{"unknown flag", rawFrame(MsgReplJob, 0x80, hello, nil)},
		{"compressed garbage", rawFrame(MsgReplJob, frameCompressed, []byte{0xff, 0xff, 0xff, 0xff, 0x0f, 1, 2}, nil)},
		{"decompresses over the limit", rawFrame(MsgReplJob, frameCompressed, s2.Encode(nil, make([]byte, maxFrame+1)), nil)},
		{"torn header", rawFrame(MsgReplJob, 0, hello, nil)[:6]},
		{"torn body", rawFrame(MsgReplJob, 0, bytes.Repeat(hello, 10), nil)[:20]},
	}
	for i, tc := range cases {
		id := "raw-" + string(rune('a'+i))
		c := rawBusConn(t, b.addr(), id, "key")
		// A valid frame first: it is delivered; the bad one after it closes
		// the link.
		valid := rawFrame(MsgGotJob, 0, []byte(tc.name), nil)
		if _, err := c.Write(append(valid, tc.bytes...)); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if strings.HasPrefix(tc.name, "torn") {
			c.(*net.TCPConn).CloseWrite()
		}
		waitClosed(t, c)
		got := rb.waitFor(t, id, 1)
		if len(got) != 1 || string(got[0].Payload) != tc.name {
			t.Fatalf("%s: received %d messages, want only the valid one", tc.name, len(got))
		}
	}
	b.log.waitFor(t, "malformed frame", "link closed", "peer=raw-a", "remote=127.0.0.1:")

	// The transport's own link was not touched and still works.
	suiteSend(t, a.tr, "node-b", suiteSeq(1))
	suiteCheckSeq(t, rb.waitFor(t, "node-a", 2), 0)
	if !a.tr.Connected("node-b") {
		t.Fatalf("the good link is down")
	}
}

// TestTCPTransportBatchEndsAtAMalformedFrame: frames read together go to
// the BatchHandler together; a malformed frame after good ones delivers
// the good ones and closes that link only.
func TestTCPTransportBatchEndsAtAMalformedFrame(t *testing.T) {
	leakcheck.Check(t)
	rb := newSuiteRecorder()
	var mu sync.Mutex
	var sizes []int
	cfg := tcpTestConfig("node-b", "key", nil)
	cfg.BatchHandler = func(from string, ms []Message) {
		mu.Lock()
		sizes = append(sizes, len(ms))
		mu.Unlock()
		for _, m := range ms {
			rb.handle(from, m)
		}
	}
	b := startTCPNode(t, cfg)
	c := rawBusConn(t, b.addr(), "raw-a", "key")
	var out []byte
	for i := range 3 {
		out = append(out, rawFrame(MsgGotJob, 0, []byte{byte('0' + i)}, nil)...)
	}
	out = append(out, rawFrame(MsgReplJob, 0, []byte("bad"), func(f []byte) { f[len(f)-1] ^= 1 })...)
	out = append(out, rawFrame(MsgGotJob, 0, []byte("after"), nil)...)
	if _, err := c.Write(out); err != nil { // one write: read in one go
		t.Fatal(err)
	}
	waitClosed(t, c)
	got := rb.waitFor(t, "raw-a", 3)
	if len(got) != 3 || string(got[0].Payload) != "0" || string(got[2].Payload) != "2" {
		t.Fatalf("received %d messages, want the 3 before the bad frame, in order", len(got))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(sizes) != 1 || sizes[0] != 3 {
		t.Fatalf("batches %v, want the three frames of one read in one batch", sizes)
	}
	b.log.waitFor(t, "malformed frame", "link closed", "peer=raw-a")
}

func TestTCPTransportGarbageConnectionsClosed(t *testing.T) {
	leakcheck.Check(t)
	rb := newSuiteRecorder()
	cfg := tcpTestConfig("node-b", "", rb.handle)
	cfg.HandshakeTimeout = 300 * time.Millisecond
	b := startTCPNode(t, cfg)
	b.tr.lim.setInterval(0) // every line logged: all come from one host
	dial := func(first []byte) net.Conn {
		c, err := net.DialTimeout("tcp", b.addr(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := c.Write(first); err != nil {
			t.Fatal(err)
		}
		return c
	}
	// A first byte that names no protocol: the PortMux closes it.
	waitClosed(t, dial([]byte("GET / HTTP/1.0\r\n\r\n")))
	b.log.waitFor(t, "speaks no protocol of ours", "first_byte=0x47")
	// The bus byte and then no hello.
	waitClosed(t, dial([]byte("Bnot a hello at all, but long enough")))
	b.log.waitFor(t, "bus connection refused", "not a diskque bus hello")
	// The bus byte and then silence: the handshake deadline closes it.
	waitClosed(t, dial([]byte{KindBus}))
	// A hello with an invalid id.
	waitClosed(t, dial(append([]byte("BDQB1\x00\x03a b"), make([]byte, 32)...)))
	b.log.waitFor(t, "invalid node id")

	a := startTCPNode(t, tcpTestConfig("node-a", "", func(string, Message) {}))
	a.tr.SetPeer("node-b", b.addr())
	suiteSend(t, a.tr, "node-b", suiteSeq(0))
	rb.waitFor(t, "node-a", 1)
}

func TestTCPTransportCompressesAndBatches(t *testing.T) {
	leakcheck.Check(t)
	rb := newSuiteRecorder()
	b := startTCPNode(t, tcpTestConfig("node-b", "", rb.handle))
	a := startTCPNode(t, tcpTestConfig("node-a", "", func(string, Message) {}))
	a.tr.SetPeer("node-b", b.addr())

	big := bytes.Repeat([]byte(`{"field":"a job body that repeats"}`), 30000) // ~1 MiB
	suiteSend(t, a.tr, "node-b", Message{Type: MsgReplJob, Payload: big})
	if got := rb.waitFor(t, "node-a", 1); !bytes.Equal(got[0].Payload, big) {
		t.Fatalf("the compressed payload arrived damaged")
	}
	if s := a.tr.Stats(); s.BytesSent > int64(len(big))/10 {
		t.Fatalf("%d bytes on the wire for a %d-byte compressible payload", s.BytesSent, len(big))
	}
	if s := b.tr.Stats(); s.BytesReceived != a.tr.Stats().BytesSent {
		t.Fatalf("received %d bytes, sent %d", s.BytesReceived, a.tr.Stats().BytesSent)
	}

	// Pipelined small messages share writes.
	const n = 20000
	writesBefore := a.tr.stats.writes.Load()
	for i := range n {
		suiteSend(t, a.tr, "node-b", suiteSeq(i))
	}
	suiteCheckSeq(t, rb.waitFor(t, "node-a", n+1)[1:], 0)
	if writes := a.tr.stats.writes.Load() - writesBefore; writes > n/2 {
		t.Fatalf("%d writes for %d pipelined messages: they are not batched", writes, n)
	}
}

func TestTCPTransportLimits(t *testing.T) {
	leakcheck.Check(t)
	rb := newSuiteRecorder()
	cfg := tcpTestConfig("node-a", "", func(string, Message) {})
	cfg.MaxFrame, cfg.QueueBytes = 1024, 4096
	a := startTCPNode(t, cfg)
	b := startTCPNode(t, tcpTestConfig("node-b", "", rb.handle))

	// A peer that does not answer: messages queue up to QueueBytes. (A
	// listener that never accepts: the dial's handshake waits, so what is
	// queued stays queued while the test fills the queue — a refused dial
	// would drop it, as a link keeps nothing for a peer that is down.)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	nowhere := ln.Addr().String()
	a.tr.SetPeer("node-gone", nowhere)
	queued := 0
	for ; queued < 1000; queued++ {
		err := a.tr.Send("node-gone", Message{Type: MsgSetAck, Payload: make([]byte, 100)})
		if errors.Is(err, ErrLinkFull) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if want := 4096 / (100 + queueRecordHeader); queued != want {
		t.Fatalf("%d messages queued for a peer that is down, want %d", queued, want)
	}
	if s := a.tr.Stats(); s.Dropped != 1 {
		t.Fatalf("Dropped = %d, want 1", s.Dropped)
	}
	if a.tr.Connected("node-gone") {
		t.Fatalf("connected to nowhere")
	}

	a.tr.SetPeer("node-b", b.addr())
	if err := a.tr.Send("node-b", Message{Type: MsgReplJob, Payload: make([]byte, 1025)}); !errors.Is(err, ErrMessageTooLarge) {
		t.Fatalf("Send over MaxFrame: %v", err)
	}
	suiteSend(t, a.tr, "node-b", Message{Type: MsgReplJob, Payload: make([]byte, 1024)})
	if got := rb.waitFor(t, "node-a", 1); len(got[0].Payload) != 1024 {
		t.Fatalf("received %d bytes", len(got[0].Payload))
	}
	// RemovePeer drops the queue of the peer that is down and returns.
	a.tr.RemovePeer("node-gone")
}

func TestTCPTransportNewTransportOnSameMux(t *testing.T) {
	leakcheck.Check(t)
	r1, r2 := newSuiteRecorder(), newSuiteRecorder()
	b := startTCPNode(t, tcpTestConfig("node-b", "", r1.handle))
	a := startTCPNode(t, tcpTestConfig("node-a", "", func(string, Message) {}))
	a.tr.SetPeer("node-b", b.addr())
	suiteSend(t, a.tr, "node-b", suiteSeq(0))
	r1.waitFor(t, "node-a", 1)

	// node-b's transport restarts on the same bus port: node-a notices the
	// broken link and redials the same address.
	b.tr.Close()
	suiteWaitUntil(t, "the link to be seen down", func() bool { return !a.tr.Connected("node-b") })
	cfg := tcpTestConfig("node-b", "", r2.handle)
	cfg.Mux, cfg.Logger = b.mux, slog.New(slog.NewTextHandler(b.log, nil))
	tr2, err := NewTCPTransport(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer tr2.Close()
	suiteWaitUntil(t, "the link to be up again", func() bool { return a.tr.Connected("node-b") })
	suiteSend(t, a.tr, "node-b", suiteSeq(1))
	got := r2.waitFor(t, "node-a", 1)
	if suiteSeqOf(t, got[len(got)-1]) != 1 {
		t.Fatalf("the message after the restart did not arrive last")
	}
}

func TestTCPTransportConfigValidated(t *testing.T) {
	mux, err := ListenMux("127.0.0.1:0", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer mux.Close()
	h := func(string, Message) {}
	for name, cfg := range map[string]TCPConfig{
		"no id":          {Mux: mux, Handler: h},
		"id with spaces": {ID: "a b", Mux: mux, Handler: h},
		"no mux":         {ID: "a", Handler: h},
		"no handler":     {ID: "a", Mux: mux},
		"negative limit": {ID: "a", Mux: mux, Handler: h, QueueBytes: -1},
	} {
		if _, err := NewTCPTransport(cfg); err == nil {
			t.Errorf("%s: NewTCPTransport accepted it", name)
		}
	}
}

// BenchmarkTCPTransport measures one-way throughput between two transports
// on 127.0.0.1: the sender pipelines b.N messages (waiting out ErrLinkFull)
// and the clock stops when the receiver has them all.
func BenchmarkTCPTransport(b *testing.B) {
	text := bytes.Repeat([]byte(`{"user":12345,"action":"resize","image":"s3://bucket/key.jpg"} `), 70)[:4096]
	random := make([]byte, 4096)
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range random {
		random[i] = byte(rng.Uint32())
	}
	for _, bc := range []struct {
		name    string
		payload []byte
	}{
		{"100B", text[:100]},
		{"4KiB-text", text},
		{"4KiB-random", random},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var got atomic.Int64
			all := make(chan struct{})
			want := int64(b.N)
			recv := startTCPNode(b, tcpTestConfig("node-b", "", func(string, Message) {
				if got.Add(1) == want {
					close(all)
				}
			}))
			send := startTCPNode(b, tcpTestConfig("node-a", "", func(string, Message) {}))
			send.tr.SetPeer("node-b", recv.addr())
			b.SetBytes(int64(len(bc.payload)))
			b.ResetTimer()
			start := time.Now()
			m := Message{Type: MsgReplJob, Payload: bc.payload}
			for range b.N {
				for send.tr.Send("node-b", m) != nil {
					time.Sleep(20 * time.Microsecond) // the queue is full: let the writer drain it
				}
			}
			<-all
			b.StopTimer()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
			b.ReportMetric(float64(send.tr.Stats().MessagesSent)/float64(max(send.tr.stats.writes.Load(), 1)), "msgs/write")
		})
	}
}

func TestTCPTransportBackoff(t *testing.T) {
	tr := &TCPTransport{cfg: TCPConfig{BackoffMin: 100 * time.Millisecond, BackoffMax: 3 * time.Second}}
	for _, tc := range []struct {
		attempt int
		full    time.Duration
	}{
		{1, 100 * time.Millisecond}, {2, 200 * time.Millisecond}, {3, 400 * time.Millisecond},
		{5, 1600 * time.Millisecond}, {6, 3 * time.Second}, {50, 3 * time.Second},
	} {
		for range 100 {
			if d := tr.backoff(tc.attempt); d < tc.full/2 || d > tc.full {
				t.Fatalf("attempt %d: backoff %v, want within [%v, %v]", tc.attempt, d, tc.full/2, tc.full)
			}
		}
	}
}

// FuzzHandshake feeds arbitrary bytes to both sides of the handshake: they
// must fail cleanly (never panic, never accept without the secret's proof).
func FuzzHandshake(f *testing.F) {
	f.Add([]byte("DQB1\x01\x06node-a" + strings.Repeat("n", 32) + "\x00" + strings.Repeat("m", 32)))
	f.Add([]byte("DQB1\x00\x06node-a" + strings.Repeat("n", 32) + "\x00"))
	f.Add([]byte("\x00\x06node-b" + strings.Repeat("n", 32) + strings.Repeat("m", 32) + "\x00"))
	f.Add([]byte("\x01\x05nope!"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, secret := range []string{"", "key"} {
			rw := struct {
				io.Reader
				io.Writer
			}{bytes.NewReader(data), io.Discard}
			if id, err := acceptHandshake(rw, "node-b", secret); err == nil && (secret != "" || !validLinkID(id)) {
				t.Fatalf("acceptor accepted %q without a valid proof", id)
			}
			rw.Reader = bytes.NewReader(data)
			if id, err := dialHandshake(rw, []byte{KindBus}, "node-a", "node-b", secret); err == nil && secret != "" {
				t.Fatalf("dialler accepted %q without a valid proof", id)
			}
		}
	})
}

// TestTCPTransportConcurrentUse runs Send, SetPeer (readdressing),
// RemovePeer, Connected, Stats and finally Close at once: under -race it
// finds unguarded state; every error must be one the interface names.
func TestTCPTransportConcurrentUse(t *testing.T) {
	leakcheck.Check(t)
	r1, r2 := newSuiteRecorder(), newSuiteRecorder()
	b1 := startTCPNode(t, tcpTestConfig("node-b", "", r1.handle))
	b2 := startTCPNode(t, tcpTestConfig("node-b", "", r2.handle)) // the same node, moved
	c := startTCPNode(t, tcpTestConfig("node-c", "", func(string, Message) {}))
	a := startTCPNode(t, tcpTestConfig("node-a", "", func(string, Message) {}))
	a.tr.SetPeer("node-b", b1.addr())
	a.tr.SetPeer("node-c", c.addr())
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var sent atomic.Int64
	for range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				for _, to := range []string{"node-b", "node-c"} {
					err := a.tr.Send(to, suiteSeq(i))
					switch {
					case err == nil:
						sent.Add(1)
					case errors.Is(err, ErrLinkFull), errors.Is(err, ErrUnknownPeer), errors.Is(err, ErrTransportClosed):
					default:
						t.Errorf("Send: %v", err)
						return
					}
				}
				a.tr.Connected(concurrentPeer(i))
				a.tr.Stats()
			}
		})
	}
	// The mover readdresses node-b and moves on once a message reached it
	// at its new address (a fixed pause starved the dial under -cpu 1).
	arrived := func(r *suiteRecorder) bool {
		n, _ := r.count("node-a")
		for {
			m, next := r.count("node-a")
			if m > n {
				return true
			}
			select {
			case <-stop:
				return false
			case <-next:
			}
		}
	}
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			switch i % 3 {
			case 0:
				a.tr.SetPeer("node-b", b2.addr())
				if !arrived(r2) {
					return
				}
			case 1:
				a.tr.RemovePeer("node-b")
			case 2:
				a.tr.SetPeer("node-b", b1.addr())
				if !arrived(r1) {
					return
				}
			}
		}
	})
	suiteWaitUntil(t, "messages to flow", func() bool {
		return len(r1.messages("node-a")) > 0 && len(r2.messages("node-a")) > 0
	})
	a.tr.Close()
	close(stop)
	wg.Wait()
	if sent.Load() == 0 {
		t.Fatalf("nothing was sent")
	}
}

func concurrentPeer(i int) string {
	if i%2 == 0 {
		return "node-b"
	}
	return "node-c"
}

// TestTCPTransportQueuedTooLongExpires: a message that waited over
// DownQueueTimeout for a connection is dropped when one comes up (a dial
// that hangs and then succeeds, as through a partition that heals), and
// one queued since is delivered. The clock is the test's.
func TestTCPTransportQueuedTooLongExpires(t *testing.T) {
	leakcheck.Check(t)
	rb := newSuiteRecorder()
	b := startTCPNode(t, tcpTestConfig("node-b", "", rb.handle))
	cfg := tcpTestConfig("node-a", "", func(string, Message) {})
	cfg.DownQueueTimeout = time.Second
	a := startTCPNode(t, cfg)
	var skew atomic.Int64
	a.tr.now = func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }

	// A proxy that holds the first connection until released, then
	// forwards it to node-b.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var once sync.Once
	letGo := func() { once.Do(func() { close(release) }) }
	var wg sync.WaitGroup
	var connMu sync.Mutex
	var conns []net.Conn
	keep := func(c net.Conn) { connMu.Lock(); conns = append(conns, c); connMu.Unlock() }
	t.Cleanup(func() {
		letGo()
		ln.Close()
		connMu.Lock()
		for _, c := range conns {
			c.Close()
		}
		connMu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		keep(c)
		<-release
		up, err := net.Dial("tcp", b.addr())
		if err != nil {
			c.Close()
			return
		}
		keep(up)
		wg.Go(func() { io.Copy(up, c); up.Close() })
		io.Copy(c, up)
		c.Close()
	})

	a.tr.SetPeer("node-b", ln.Addr().String())
	if err := a.tr.Send("node-b", suiteSeq(1)); err != nil {
		t.Fatal(err)
	}
	skew.Store(int64(2 * time.Second)) // it has waited 2 s
	if err := a.tr.Send("node-b", suiteSeq(2)); err != nil {
		t.Fatal(err)
	}
	letGo()
	suiteWaitUntil(t, "Connected(node-b) through the proxy", func() bool { return a.tr.Connected("node-b") })
	suiteSend(t, a.tr, "node-b", suiteSeq(3))
	got := rb.waitFor(t, "node-a", 2)
	if len(got) != 2 || suiteSeqOf(t, got[0]) != 2 || suiteSeqOf(t, got[1]) != 3 {
		var ns []int
		for _, m := range got {
			ns = append(ns, suiteSeqOf(t, m))
		}
		t.Fatalf("node-b received %v, want [2 3]: 1 waited over DownQueueTimeout", ns)
	}
	if d := a.tr.Stats().Dropped; d != 1 {
		t.Fatalf("Dropped = %d, want 1 (the expired message)", d)
	}
}
