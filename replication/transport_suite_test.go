package replication

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/diskque/diskque/internal/leakcheck"
)

// The one suite every Transport passes (STYLE.md: one suite per
// interface): TestTransportSuite runs it against the TCP transport (open
// and with a cluster secret) and against MemNetwork. The TCP transport's
// own tests (authentication, malformed input) are in tcptransport_test.go.

// suiteHarness starts the nodes of one test on one implementation.
type suiteHarness interface {
	// start starts node id (again, after stop) with handler h.
	start(t *testing.T, id string, h Handler) Transport
	// startBatch is start with a BatchHandler.
	startBatch(t *testing.T, id string, h BatchHandler) Transport
	// stop closes node id's transport, as a crash or a shutdown would.
	stop(t *testing.T, id string)
	// addr is where node id's bus listens now ("" in memory).
	addr(id string) string
}

// suiteDeadline bounds every wait of the suite: generous, for a loaded
// 2-core machine under -race; a passing run waits far less.
const suiteDeadline = 20 * time.Second

func TestTransportSuite(t *testing.T) {
	impls := []struct {
		name string
		new  func(t *testing.T) suiteHarness
	}{
		{"mem", func(t *testing.T) suiteHarness {
			return &suiteMemHarness{net: NewMemNetwork(), nodes: map[string]*MemTransport{}}
		}},
		{"tcp", func(t *testing.T) suiteHarness { return newTCPHarness(t, "") }},
		{"tcp-secret", func(t *testing.T) suiteHarness { return newTCPHarness(t, "s3cret") }},
	}
	tests := []struct {
		name string
		run  func(t *testing.T, h suiteHarness)
	}{
		{"OrderedDelivery", suiteOrderedDelivery},
		{"ManySenders", suiteManySenders},
		{"LargePayloads", suiteLargePayloads},
		{"PayloadNotRetained", suitePayloadNotRetained},
		{"PeerRestarts", suitePeerRestarts},
		{"RemovePeer", suiteRemovePeer},
		{"UnknownPeer", suiteUnknownPeer},
		{"Close", suiteClose},
		{"BatchedDelivery", suiteBatchedDelivery},
		{"QueuedWhileDownDropped", suiteQueuedWhileDownDropped},
		{"QueuedOnBrokenLinkDropped", suiteQueuedOnBrokenLinkDropped},
	}
	for _, impl := range impls {
		t.Run(impl.name, func(t *testing.T) {
			for _, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					leakcheck.Check(t)
					tc.run(t, impl.new(t))
				})
			}
		})
	}
}

// suiteRecorder is a Handler that keeps what it receives, by sender.
type suiteRecorder struct {
	mu   sync.Mutex
	got  map[string][]Message
	cond chan struct{} // closed and replaced on each message
}

func newSuiteRecorder() *suiteRecorder {
	return &suiteRecorder{got: map[string][]Message{}, cond: make(chan struct{})}
}

func (r *suiteRecorder) handle(from string, m Message) {
	r.mu.Lock()
	r.got[from] = append(r.got[from], m)
	close(r.cond)
	r.cond = make(chan struct{})
	r.mu.Unlock()
}

// messages returns a copy of what from sent so far.
func (r *suiteRecorder) messages(from string) []Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Message(nil), r.got[from]...)
}

// count returns how many messages from has sent so far, and a channel
// closed at the next message from anyone.
func (r *suiteRecorder) count(from string) (int, <-chan struct{}) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.got[from]), r.cond
}

// waitFor waits until from has sent at least n messages, and returns them.
func (r *suiteRecorder) waitFor(t *testing.T, from string, n int) []Message {
	t.Helper()
	deadline := time.NewTimer(suiteDeadline)
	defer deadline.Stop()
	for {
		got, cond := r.count(from)
		if got >= n {
			return r.messages(from)
		}
		select {
		case <-cond:
		case <-deadline.C:
			t.Fatalf("received %d messages from %s, want %d", got, from, n)
		}
	}
}

// suiteSend sends m, waiting out ErrLinkFull (the sender outran the link):
// a message refused is not queued, so retrying it keeps the order.
func suiteSend(t testing.TB, tr Transport, to string, m Message) {
	t.Helper()
	deadline := time.Now().Add(suiteDeadline)
	for {
		err := tr.Send(to, m)
		if err == nil {
			return
		}
		if !errors.Is(err, ErrLinkFull) || time.Now().After(deadline) {
			t.Fatalf("Send to %s: %v", to, err)
		}
		// Polling: nothing tells a sender that the queue has room.
		time.Sleep(50 * time.Microsecond)
	}
}

// seqMessage is message i of a numbered stream: its payload starts with i
// and is padded to a length that varies with i.
func suiteSeq(i int) Message {
	p := make([]byte, 8+i%61)
	binary.BigEndian.PutUint64(p, uint64(i))
	return Message{Type: MsgReplJob, Payload: p}
}

func suiteSeqOf(t *testing.T, m Message) int {
	t.Helper()
	if len(m.Payload) < 8 {
		t.Fatalf("payload of %d bytes is not a numbered message", len(m.Payload))
	}
	return int(binary.BigEndian.Uint64(m.Payload))
}

// checkSeq checks that msgs are the numbers from, from+1, … in order.
func suiteCheckSeq(t *testing.T, msgs []Message, from int) {
	t.Helper()
	for i, m := range msgs {
		if got := suiteSeqOf(t, m); got != from+i {
			t.Fatalf("message %d is number %d, want %d (order broken or message lost)", i, got, from+i)
		}
		if want := suiteSeq(from + i); !bytes.Equal(m.Payload, want.Payload) || m.Type != want.Type {
			t.Fatalf("message %d arrived damaged", from+i)
		}
	}
}

// suiteBatchedDelivery: a BatchHandler gets every message, in order, and
// the messages that waited while it was busy come together, within the
// batch bounds.
func suiteBatchedDelivery(t *testing.T, h suiteHarness) {
	rb := newSuiteRecorder()
	release := make(chan struct{})
	var mu sync.Mutex
	var sizes []int
	first := true
	a := h.start(t, "node-a", func(string, Message) {})
	h.startBatch(t, "node-b", func(from string, ms []Message) {
		mu.Lock()
		sizes = append(sizes, len(ms))
		wait := first
		first = false
		mu.Unlock()
		if wait {
			<-release // the rest queue up behind the first batch meanwhile
		}
		for _, m := range ms {
			rb.handle(from, m)
		}
	})
	suiteIntroduce(h, a, "node-b")
	suiteSend(t, a, "node-b", suiteSeq(0))
	suiteWaitUntil(t, "the first batch", func() bool { mu.Lock(); defer mu.Unlock(); return len(sizes) == 1 })
	const n = 2000
	for i := 1; i < n; i++ {
		suiteSend(t, a, "node-b", suiteSeq(i))
	}
	// Some of them written (not all: a link may not buffer 2000 while the
	// receiver is held), then the receiver goes on.
	suiteWaitUntil(t, "messages sent", func() bool { return a.Stats().MessagesSent >= 200 })
	close(release)
	suiteCheckSeq(t, rb.waitFor(t, "node-a", n), 0)
	mu.Lock()
	defer mu.Unlock()
	largest := 0
	for _, k := range sizes {
		largest = max(largest, k)
	}
	if largest < 2 || largest > maxBatchMessages {
		t.Fatalf("batch sizes %v: want one of 2 to %d messages (the ones that waited)", sizes, maxBatchMessages)
	}
}

func suiteIntroduce(h suiteHarness, from Transport, to string) { from.SetPeer(to, h.addr(to)) }

func suiteOrderedDelivery(t *testing.T, h suiteHarness) {
	ra, rb := newSuiteRecorder(), newSuiteRecorder()
	a := h.start(t, "node-a", ra.handle)
	b := h.start(t, "node-b", rb.handle)
	suiteIntroduce(h, a, "node-b")
	suiteIntroduce(h, b, "node-a")
	const n = 10000
	done := make(chan struct{})
	go func() { // the other direction at the same time
		defer close(done)
		for i := range n / 10 {
			suiteSend(t, b, "node-a", suiteSeq(i))
		}
	}()
	for i := range n {
		suiteSend(t, a, "node-b", suiteSeq(i))
	}
	<-done
	suiteCheckSeq(t, rb.waitFor(t, "node-a", n), 0)
	suiteCheckSeq(t, ra.waitFor(t, "node-b", n/10), 0)
	if got := len(rb.messages("node-a")); got != n {
		t.Fatalf("node-b received %d messages, want exactly %d", got, n)
	}
	if !a.Connected("node-b") {
		t.Fatalf("Connected(node-b) is false after delivering")
	}
	sa, sb := a.Stats(), b.Stats()
	if sa.MessagesSent < n || sb.MessagesReceived < n || sa.BytesSent == 0 || sb.BytesReceived == 0 {
		t.Fatalf("stats: sender %+v, receiver %+v", sa, sb)
	}
}

func suiteManySenders(t *testing.T, h suiteHarness) {
	r := newSuiteRecorder()
	sink := h.start(t, "sink", r.handle)
	_ = sink
	const senders, each = 6, 1000
	var wg sync.WaitGroup
	for s := range senders {
		id := fmt.Sprintf("sender-%d", s)
		tr := h.start(t, id, func(string, Message) {})
		suiteIntroduce(h, tr, "sink")
		wg.Go(func() {
			for i := range each {
				suiteSend(t, tr, "sink", suiteSeq(i))
			}
		})
	}
	wg.Wait()
	for s := range senders {
		suiteCheckSeq(t, r.waitFor(t, fmt.Sprintf("sender-%d", s), each), 0)
	}
}

func suiteLargePayloads(t *testing.T, h suiteHarness) {
	r := newSuiteRecorder()
	a := h.start(t, "node-a", func(string, Message) {})
	h.start(t, "node-b", r.handle)
	suiteIntroduce(h, a, "node-b")
	rng := rand.New(rand.NewPCG(1, 2))
	random := func(n int) []byte {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(rng.Uint32())
		}
		return p
	}
	payloads := [][]byte{
		{}, {7}, random(255), random(256), random(257), // around the compression threshold
		bytes.Repeat([]byte("compressible "), 100),
		random(4 << 10), // incompressible: sent as is
		bytes.Repeat([]byte("abcdefgh"), 128<<10), // 1 MiB, compresses well
		random(1 << 20), // 1 MiB, does not
		append(random(3<<20), make([]byte, 3<<20)...), // 6 MiB, half compressible
	}
	for i, p := range payloads {
		suiteSend(t, a, "node-b", Message{Type: MsgType(1 + i%12), Payload: p})
	}
	got := r.waitFor(t, "node-a", len(payloads))
	for i, m := range got {
		if m.Type != MsgType(1+i%12) || !bytes.Equal(m.Payload, payloads[i]) {
			t.Fatalf("payload %d (%d bytes) arrived as type %d, %d bytes, or damaged", i, len(payloads[i]), m.Type, len(m.Payload))
		}
	}
}

func suitePayloadNotRetained(t *testing.T, h suiteHarness) {
	r := newSuiteRecorder()
	a := h.start(t, "node-a", func(string, Message) {})
	h.start(t, "node-b", r.handle)
	suiteIntroduce(h, a, "node-b")
	buf := []byte("the original payload, long enough to be compressed? no, short")
	big := bytes.Repeat([]byte("x"), 4096)
	suiteSend(t, a, "node-b", Message{Type: MsgSetAck, Payload: buf})
	suiteSend(t, a, "node-b", Message{Type: MsgSetAck, Payload: big})
	for i := range buf {
		buf[i] = 0
	}
	for i := range big {
		big[i] = 'y'
	}
	got := r.waitFor(t, "node-a", 2)
	if string(got[0].Payload) != "the original payload, long enough to be compressed? no, short" ||
		!bytes.Equal(got[1].Payload, bytes.Repeat([]byte("x"), 4096)) {
		t.Fatalf("the transport kept the sender's buffer: got %q…", got[0].Payload)
	}
}

func suitePeerRestarts(t *testing.T, h suiteHarness) {
	a := h.start(t, "node-a", func(string, Message) {})
	r1 := newSuiteRecorder()
	h.start(t, "node-b", r1.handle)
	suiteIntroduce(h, a, "node-b")
	for i := range 10 {
		suiteSend(t, a, "node-b", suiteSeq(i))
	}
	suiteCheckSeq(t, r1.waitFor(t, "node-a", 10), 0)

	h.stop(t, "node-b")
	suiteWaitUntil(t, "Connected(node-b) turns false once node-b is gone", func() bool { return !a.Connected("node-b") })
	// Sends while it is down are queued or dropped, never an error but
	// ErrLinkFull.
	for i := range 10 {
		if err := a.Send("node-b", suiteSeq(1000+i)); err != nil && !errors.Is(err, ErrLinkFull) {
			t.Fatalf("Send while the peer is down: %v", err)
		}
	}

	r2 := newSuiteRecorder()
	h.start(t, "node-b", r2.handle)
	suiteIntroduce(h, a, "node-b") // its new address
	suiteWaitUntil(t, "Connected(node-b) after its return", func() bool { return a.Connected("node-b") })
	const after = 100
	for i := range after {
		suiteSend(t, a, "node-b", suiteSeq(2000+i))
	}
	// What was queued while it was down may arrive first; everything sent
	// after its return arrives, in order.
	deadline := time.Now().Add(suiteDeadline)
	for {
		var tail []Message
		for _, m := range r2.messages("node-a") {
			if suiteSeqOf(t, m) >= 2000 {
				tail = append(tail, m)
			}
		}
		if len(tail) == after {
			suiteCheckSeq(t, tail, 2000)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the peer's return, %d of %d messages arrived", len(tail), after)
		}
		time.Sleep(time.Millisecond) // polling with a deadline
	}
	if n := len(r1.messages("node-a")); n != 10 {
		t.Fatalf("the stopped node's handler received %d messages, want 10", n)
	}
}

func suiteRemovePeer(t *testing.T, h suiteHarness) {
	r := newSuiteRecorder()
	a := h.start(t, "node-a", func(string, Message) {})
	h.start(t, "node-b", r.handle)
	suiteIntroduce(h, a, "node-b")
	suiteSend(t, a, "node-b", suiteSeq(0))
	r.waitFor(t, "node-a", 1)
	a.RemovePeer("node-b")
	if err := a.Send("node-b", suiteSeq(1)); !errors.Is(err, ErrUnknownPeer) {
		t.Fatalf("Send after RemovePeer: %v, want ErrUnknownPeer", err)
	}
	if a.Connected("node-b") {
		t.Fatalf("Connected after RemovePeer")
	}
	a.RemovePeer("node-b") // twice is harmless
	suiteIntroduce(h, a, "node-b")
	suiteSend(t, a, "node-b", suiteSeq(1))
	suiteCheckSeq(t, r.waitFor(t, "node-a", 2), 0)
}

func suiteUnknownPeer(t *testing.T, h suiteHarness) {
	a := h.start(t, "node-a", func(string, Message) {})
	if err := a.Send("nobody", suiteSeq(0)); !errors.Is(err, ErrUnknownPeer) {
		t.Fatalf("Send to an unknown peer: %v, want ErrUnknownPeer", err)
	}
	if a.Connected("nobody") {
		t.Fatalf("Connected to an unknown peer")
	}
	a.SetPeer("node-a", "127.0.0.1:1") // itself: ignored
	if err := a.Send("node-a", suiteSeq(0)); !errors.Is(err, ErrUnknownPeer) {
		t.Fatalf("Send to itself: %v, want ErrUnknownPeer", err)
	}
	if s := a.Stats(); s.MessagesSent != 0 {
		t.Fatalf("stats count a message never sent: %+v", s)
	}
}

func suiteClose(t *testing.T, h suiteHarness) {
	r := newSuiteRecorder()
	a := h.start(t, "node-a", func(string, Message) {})
	h.start(t, "node-b", r.handle)
	suiteIntroduce(h, a, "node-b")
	suiteSend(t, a, "node-b", suiteSeq(0))
	r.waitFor(t, "node-a", 1)
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := a.Send("node-b", suiteSeq(1)); !errors.Is(err, ErrTransportClosed) {
		t.Fatalf("Send after Close: %v, want ErrTransportClosed", err)
	}
	if a.Connected("node-b") {
		t.Fatalf("Connected after Close")
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// waitUntil polls cond until it holds, failing the test after the deadline.
func suiteWaitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(suiteDeadline)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(time.Millisecond) // polling with a deadline
	}
}

// suiteMemHarness runs the suite on a MemNetwork.
type suiteMemHarness struct {
	net   *MemNetwork
	nodes map[string]*MemTransport
}

func (h *suiteMemHarness) start(t *testing.T, id string, hd Handler) Transport {
	tr := h.net.Join(id, hd)
	h.nodes[id] = tr
	t.Cleanup(func() { tr.Close() })
	return tr
}

func (h *suiteMemHarness) startBatch(t *testing.T, id string, hd BatchHandler) Transport {
	tr := h.net.JoinBatch(id, hd)
	h.nodes[id] = tr
	t.Cleanup(func() { tr.Close() })
	return tr
}

func (h *suiteMemHarness) stop(t *testing.T, id string) { h.nodes[id].Close() }
func (h *suiteMemHarness) addr(string) string           { return "" }
