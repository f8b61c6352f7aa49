package replication

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/internal/leakcheck"
	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
)

// TestInboxNeedJobsNotBehindADurableWait: a NEEDJOBS that arrives while
// the sender's last message (a SETACK) waits for its fsync is answered at
// once: the jobs leave B's queue for A while the SETACK still waits, and
// reach A once the disk lets it go. (Handled on the link's reader, as
// before HandleBatchQueued, the NEEDJOBS waited for the SETACK's fsync:
// B's queue stayed full until the gate opened.)
func TestInboxNeedJobsNotBehindADurableWait(t *testing.T) {
	c := fedCluster(t, 2)
	a, b := c.nodes[0], c.nodes[1]
	gate := &syncGate{}
	c.close(b)
	b.fs = gatedFS{vfs.Default, gate}
	c.open(b)
	if err := b.broker.Tick(time.Now().UnixMilli()); err != nil {
		t.Fatal(err)
	}
	const n = 6
	for range n {
		if r := addJob(t, b, queue.AddRequest{Replicate: 1}); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	acked := addJob(t, b, queue.AddRequest{Queue: "other", Replicate: 1})
	if acked.Err != nil {
		t.Fatal(acked.Err)
	}

	gate.close()
	defer gate.open()
	// Sent by A on its link, read by B's reader, as in the daemon.
	if err := a.tr.Send(b.id, Message{Type: MsgSetAck, Payload: encodeSetAcks([]string{acked.ID}, []int{2})}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the SETACK waiting for its fsync", func() bool { return gate.held.Load() > 0 })
	if err := a.tr.Send(b.id, Message{Type: MsgNeedJobs, Payload: encodeNeedJobs("q", 2)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "B giving jobs while the SETACK waits", func() bool { return b.st.QueueLen("q") < n })
	gate.open()
	eventually(t, "the jobs queued on A", func() bool { return a.st.QueueLen("q") > 0 })
	eventually(t, "the SETACK applied on B", func() bool {
		j, err := b.st.Job(acked.ID)
		return err == nil && j.State == storage.StateAcked
	})
}

// TestInboxKeepsOrderAndBound: one sender's batches are handled in the
// order they came, however many queue up behind a durable wait, and a
// reader whose sender's inbox is full waits for room.
func TestInboxKeepsOrderAndBound(t *testing.T) {
	c := fedCluster(t, 2)
	b := c.nodes[1]
	// The batches come from a sender of no traffic of its own: a's own
	// messages to b (its incarnation, told again when b's store opens
	// again: jobs_federation_first.go) would wait in the same inbox and
	// take places in it.
	from := strings.Repeat("5e", 20)
	gate := &syncGate{}
	c.close(b)
	b.fs = gatedFS{vfs.Default, gate}
	c.open(b)
	var ids []string
	for range maxInboxBatches + 2 {
		r := addJob(t, b, queue.AddRequest{Replicate: 1})
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		ids = append(ids, r.ID)
	}
	gate.close()
	defer gate.open()
	// Each batch: the job's SETACK, then its DELJOB. Applied out of order,
	// a DELJOB before its SETACK would leave the job acked, not deleted.
	batch := func(id string) []Message {
		return []Message{
			{Type: MsgSetAck, Payload: encodeSetAcks([]string{id}, []int{2})},
			{Type: MsgDelJob, Payload: encodeIDs([]string{id})},
		}
	}
	// The first batch is taken by the handler, whose SETACK then waits at
	// the gate; maxInboxBatches more fit; the reader waits with the last.
	b.jobs.HandleBatchQueued(from, batch(ids[0]))
	eventually(t, "the first SETACK waiting for its fsync", func() bool { return gate.held.Load() > 0 })
	var queued atomic.Int64
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		for _, id := range ids[1:] {
			b.jobs.HandleBatchQueued(from, batch(id))
			queued.Add(1)
		}
	}()
	eventually(t, "the inbox full", func() bool { return queued.Load() == maxInboxBatches })
	b.jobs.inboxes.mu.Lock()
	held := len(b.jobs.inboxes.byFrom[from].batches)
	b.jobs.inboxes.mu.Unlock()
	if held != maxInboxBatches {
		t.Fatalf("the inbox holds %d batches, want %d", held, maxInboxBatches)
	}
	select {
	case <-readerDone:
		t.Fatal("the reader went on past a full inbox")
	default:
	}
	gate.open()
	<-readerDone
	for _, id := range ids {
		eventually(t, "job "+id+" deleted on B", func() bool { return b.state(t, id) == "" })
	}
}

// TestYourJobsAsksAgainBeforeTheImportIsDurable: a YOURJOBS whose jobs
// the blocked clients take at once (the queue empty again) sends its
// NEEDJOBS to the source while the import still waits for its fsync, not
// after (it did after: one more fsync in every round trip).
func TestYourJobsAsksAgainBeforeTheImportIsDurable(t *testing.T) {
	c := fedCluster(t, 2)
	a, b := c.nodes[0], c.nodes[1]
	gate := &syncGate{}
	c.close(b)
	b.fs = gatedFS{vfs.Default, gate}
	c.open(b)
	if err := b.broker.Tick(time.Now().UnixMilli()); err != nil {
		t.Fatal(err)
	}
	var asked atomic.Int64 // NEEDJOBS from B to A for more than one job (not a broadcast)
	c.mu.Lock()
	c.lose = func(to, from string, m Message) bool {
		if to == a.id && from == b.id && m.Type == MsgNeedJobs {
			if _, count, err := decodeNeedJobs(m.Payload); err == nil && count > 1 {
				asked.Add(1)
			}
		}
		return false
	}
	c.mu.Unlock()
	r := addJob(t, a, queue.AddRequest{Replicate: 1})
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	give, err := a.broker.RemoteNeedJobs(b.id, "q", 5)
	if err != nil || len(give) != 1 {
		t.Fatalf("A gives %d, %v", len(give), err)
	}
	got := make(chan []queue.Delivered, 1)
	go func() { got <- getWait(t, b, "q", 1, 10*time.Second) }()
	eventually(t, "the GETJOB blocked on B", func() bool { return b.broker.Stats().BlockedClients == 1 })

	gate.close()
	defer gate.open()
	if err := a.tr.Send(b.id, Message{Type: MsgYourJobs, Payload: encodeYourJobs(give)}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "B asking A again while its import waits for the disk", func() bool { return asked.Load() > 0 })
	if gate.held.Load() == 0 {
		t.Fatal("nothing waited at the gate")
	}
	gate.open()
	if d := <-got; len(d) != 1 || d[0].ID != r.ID {
		t.Fatalf("the blocked GETJOB got %+v, want %s", d, r.ID)
	}
}

// TestInboxHandlerOutlivesAnEmptyInbox: a sender's handler goroutine that
// has emptied its inbox waits for the next batch (inboxLinger) instead of
// ending, so a sender under load does not cost a goroutine per batch; and
// Close ends a waiting handler at once, leaking nothing.
func TestInboxHandlerOutlivesAnEmptyInbox(t *testing.T) {
	leakcheck.Check(t)
	c := fedCluster(t, 2)
	a, b := c.nodes[0], c.nodes[1]
	ib := &b.jobs.inboxes
	waiting := func() bool {
		ib.mu.Lock()
		defer ib.mu.Unlock()
		box := ib.byFrom[a.id]
		return box == nil || box.idle && len(box.batches) == 0
	}
	for i := range 3 {
		r := addJob(t, b, queue.AddRequest{Replicate: 1})
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		b.jobs.HandleBatchQueued(a.id, []Message{{Type: MsgSetAck, Payload: encodeSetAcks([]string{r.ID}, []int{2})}})
		eventually(t, fmt.Sprintf("SETACK %d applied", i), func() bool {
			j, err := b.st.Job(r.ID)
			return err == nil && j.State == storage.StateAcked
		})
		eventually(t, "the handler done with the batch", waiting)
	}
	ib.mu.Lock()
	started := ib.started
	ib.mu.Unlock()
	if started != 1 {
		t.Fatalf("3 batches, one at a time: %d handler goroutines started, want 1", started)
	}
	begin := time.Now()
	c.close(b)
	if d := time.Since(begin); d > inboxLinger/2 {
		t.Fatalf("Close took %v with a handler waiting for a batch", d)
	}
}
