package replication

import (
	"log/slog"
	"testing"
	"time"

	"github.com/diskque/diskque/internal/leakcheck"
)

// TestTCPTransportRedialsAPeerThatDialledIn: a's link to b, down while b
// was, waits out a backoff of a minute; b, back on the same address, dials
// a, and a's link redials at once, so what a sends b arrives in seconds,
// not after the backoff. (Before, for up to BackoffMax — 3 s in the daemon
// — after a node's restart, its peers' GOTJOBs, GOTACKs and DELJOBs to it
// were dropped: Disque suite 05-acks then found a REPLICATE 5 job on all 7
// nodes, or an ack not collected.)
func TestTCPTransportRedialsAPeerThatDialledIn(t *testing.T) {
	leakcheck.Check(t)
	b := startTCPNode(t, tcpTestConfig("node-b", "", func(string, Message) {}))
	bAddr := b.addr()
	b.close()

	cfg := tcpTestConfig("node-a", "", func(string, Message) {})
	cfg.BackoffMin, cfg.BackoffMax = time.Minute, time.Minute
	a := startTCPNode(t, cfg)
	a.tr.SetPeer("node-b", bAddr)
	if err := a.tr.Send("node-b", suiteSeq(0)); err != nil {
		t.Fatal(err) // queued: the link is not up yet
	}
	a.log.waitFor(t, "cannot reach peer", "node-b") // now in its minute of backoff
	// (The message queued for the failed dial was dropped with it: a link
	// keeps nothing for a peer that is down, QueuedWhileDownDropped.)

	// b again, on its address (held a moment after the close, maybe).
	rb := newSuiteRecorder()
	var mux *PortMux
	suiteWaitUntil(t, "b's address to be free again", func() bool {
		var err error
		mux, err = ListenMux(bAddr, slog.New(slog.DiscardHandler))
		return err == nil
	})
	served := make(chan struct{})
	go func() { defer close(served); mux.Serve() }()
	bcfg := tcpTestConfig("node-b", "", rb.handle)
	bcfg.Mux, bcfg.Logger = mux, slog.New(slog.DiscardHandler)
	b2, err := NewTCPTransport(bcfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b2.Close(); mux.Close(); <-served })
	b2.SetPeer("node-a", a.addr())
	suiteSend(t, b2, "node-a", suiteSeq(0))

	start := time.Now()
	deadline := time.Now().Add(10 * time.Second) // far below the minute
	for !a.tr.Connected("node-b") {
		if time.Now().After(deadline) {
			t.Fatalf("a's link to b not up %v after b dialled a (it waits out its backoff)", time.Since(start))
		}
		time.Sleep(5 * time.Millisecond) // polling with a deadline
	}
	if err := a.tr.Send("node-b", suiteSeq(1)); err != nil {
		t.Fatal(err)
	}
	// The first message may be there too: when the first dial failed
	// before Send queued it, it waited in the backoff, within
	// DownQueueTimeout, and the redial carries it first.
	got := rb.waitFor(t, "node-a", 1)
	if suiteSeqOf(t, got[0]) == 0 {
		got = rb.waitFor(t, "node-a", 2)[1:]
	}
	if suiteSeqOf(t, got[0]) != 1 {
		t.Fatalf("b received %v, want the message sent once the link was up", got)
	}
	t.Logf("a's link to b up %v after b dialled a", time.Since(start).Round(time.Millisecond))
}
