package replication

import (
	"strings"
	"testing"
	"time"

	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
)

// addQueued adds n REPLICATE 1 jobs to queue q on nd (queued there).
func addQueued(t *testing.T, nd *jobsNode, q string, n int) {
	t.Helper()
	for range n {
		if res := addJob(t, nd, queue.AddRequest{Queue: q, Replicate: 1}); res.Err != nil {
			t.Fatal(res.Err)
		}
	}
}

// TestPeersQueueLenSumsTheOtherNodes: GLOBALQLEN's ask reaches every
// other reachable node and sums their lengths
// of the queue (and of that queue only); a REPLICATE 3 job, queued on
// one node, counts once.
func TestPeersQueueLenSumsTheOtherNodes(t *testing.T) {
	c := newTestCluster(t, 4, -1)
	addQueued(t, c.nodes[0], "q", 1) // the asker's own: not in the peers' sum
	addQueued(t, c.nodes[1], "q", 2)
	addQueued(t, c.nodes[2], "q", 3)
	addQueued(t, c.nodes[3], "other", 4)
	if res := addJob(t, c.nodes[3], queue.AddRequest{Queue: "q", Replicate: 3, Timeout: 5000}); res.Err != nil {
		t.Fatal(res.Err)
	}

	got := c.nodes[0].jobs.PeersQueueLen("q", 5*time.Second)
	if want := (QueueLenResult{Sum: 6, Asked: 3, Answered: 3}); got != want {
		t.Fatalf("PeersQueueLen(q) = %+v, want %+v", got, want)
	}
	if got := c.nodes[1].jobs.PeersQueueLen("none", 5*time.Second); got.Sum != 0 || got.Answered != 3 {
		t.Fatalf("PeersQueueLen of an unknown queue = %+v, want 0 from 3 nodes", got)
	}
	// A node marked down (suspected or failed) is not asked.
	c.setDown(c.nodes[1].id, true)
	if got := c.nodes[0].jobs.PeersQueueLen("q", 5*time.Second); got != (QueueLenResult{Sum: 4, Asked: 2, Answered: 2}) {
		t.Fatalf("with node 1 down: %+v, want 4 from 2 nodes", got)
	}
	// A name no queue can have asks nobody (each node would drop it as
	// malformed) and is 0.
	if got := c.nodes[0].jobs.PeersQueueLen(strings.Repeat("x", storage.MaxQueueNameLen+1), 5*time.Second); got != (QueueLenResult{}) {
		t.Fatalf("PeersQueueLen of a too long name = %+v, want nothing asked", got)
	}
	for _, nd := range c.nodes {
		if s := nd.jobs.Stats(); s.BadPayloads != 0 {
			t.Fatalf("node %s dropped %d malformed messages", nd.id[:8], s.BadPayloads)
		}
	}
	if s := c.nodes[0].jobs.qlenPending(); s != 0 {
		t.Fatalf("%d asks left pending", s)
	}
	// INFO's counters: node 0 asked 3 + 2 nodes, all answered in time.
	if s := c.nodes[0].jobs.Stats(); s.QueueLensSent != 5 || s.QueueLenAnswersReceived != 5 {
		t.Fatalf("node 0 counts %d QUEUELENs sent and %d answers, want 5 and 5", s.QueueLensSent, s.QueueLenAnswersReceived)
	}
}

// TestPeersQueueLenTimeout: a node that is asked but never answers (its
// answer lost) is left out once the timeout passes, and the answers of
// the others are kept; an answer that comes late, twice, or from a node
// that was not asked changes nothing.
func TestPeersQueueLenTimeout(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	addQueued(t, c.nodes[1], "q", 2)
	addQueued(t, c.nodes[2], "q", 5)
	silent := c.nodes[2].id
	c.mu.Lock()
	c.lose = func(to, from string, m Message) bool { return to == silent && m.Type == MsgQueueLen }
	c.mu.Unlock()

	const timeout = 150 * time.Millisecond
	start := time.Now()
	got := c.nodes[0].jobs.PeersQueueLen("q", timeout)
	if el := time.Since(start); el < timeout {
		t.Fatalf("returned after %v, before the timeout %v, with a node silent", el, timeout)
	}
	if want := (QueueLenResult{Sum: 2, Asked: 2, Answered: 1}); got != want {
		t.Fatalf("PeersQueueLen = %+v, want %+v", got, want)
	}

	// Answers nobody waits for: a stale id, and (with an ask pending)
	// one from a node it did not ask and a repeat.
	asker := c.nodes[0].jobs
	asker.Handle(silent, Message{Type: MsgQueueLenAnswer, Payload: encodeQueueLenAnswer(12345, 1000)})
	if n := asker.qlenPending(); n != 0 {
		t.Fatalf("%d asks pending after a stale answer", n)
	}
	c.mu.Lock()
	c.lose = nil
	c.mu.Unlock()
	c.setDown(silent, true) // asks node 1 only
	done := make(chan QueueLenResult)
	c.mu.Lock()
	hold := make(chan struct{})
	c.lose = func(to, from string, m Message) bool {
		if m.Type == MsgQueueLenAnswer && to == c.nodes[0].id {
			<-hold // the real answer waits until the forged ones are in
		}
		return false
	}
	c.mu.Unlock()
	go func() { done <- asker.PeersQueueLen("q", 10*time.Second) }()
	var id uint64
	eventually(t, "the ask to be registered", func() bool {
		asker.mu.Lock()
		defer asker.mu.Unlock()
		for k := range asker.qlens.pending {
			id = k
		}
		return id != 0
	})
	asker.Handle(silent, Message{Type: MsgQueueLenAnswer, Payload: encodeQueueLenAnswer(id, 1000)})
	close(hold)
	if got := <-done; got != (QueueLenResult{Sum: 2, Asked: 1, Answered: 1}) {
		t.Fatalf("with a forged answer from a node not asked: %+v, want 2 from node 1 alone", got)
	}
}

// TestPeersQueueLenMalformed: a malformed QUEUELEN or answer is dropped
// and counted, and answers nothing.
func TestPeersQueueLenMalformed(t *testing.T) {
	c := newTestCluster(t, 2, -1)
	nd := c.nodes[0]
	from := c.nodes[1].id
	for _, m := range []Message{
		{Type: MsgQueueLen, Payload: []byte{codecVersion, 1, 0}},                                                    // empty queue name
		{Type: MsgQueueLen, Payload: append(encodeQueueLen(1, "q"), 0)},                                             // trailing byte
		{Type: MsgQueueLen, Payload: []byte{99, 1, 1, 'q'}},                                                         // unknown version
		{Type: MsgQueueLenAnswer, Payload: []byte{codecVersion, 1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f}}, // length out of range
		{Type: MsgQueueLenAnswer, Payload: []byte{codecVersion}},                                                    // short
	} {
		nd.jobs.Handle(from, m)
	}
	if s := nd.jobs.Stats(); s.BadPayloads != 5 {
		t.Fatalf("BadPayloads = %d, want 5", s.BadPayloads)
	}
}

// qlenPending is the number of GLOBALQLEN asks waiting.
func (j *Jobs) qlenPending() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return len(j.qlens.pending)
}
