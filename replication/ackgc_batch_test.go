package replication

import (
	"testing"
	"time"

	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
)

// heldCopies stores n copies of jobs of origin on holder (REPLJOBs that
// want no answer, handled as holder's link would) and returns their ids.
func heldCopies(t *testing.T, origin, holder *jobsNode, n int) []string {
	t.Helper()
	return heldCopiesWith(t, origin, holder, n)
}

// heldCopiesWith is heldCopies with more nodes in the copies' lists.
func heldCopiesWith(t *testing.T, origin, holder *jobsNode, n int, more ...string) []string {
	t.Helper()
	var ids []string
	var run []Message
	for range n {
		r := replJob{Job: &storage.Job{ID: storage.NewJobID(origin.id, 3600, 60), Queue: "q", Ctime: uint64(time.Now().UnixMicro()),
			Etime: time.Now().UnixMilli() + 3_600_000, Retry: 60, Repl: 2, Nodes: append([]string{origin.id, holder.id}, more...)}, Body: []byte("b")}
		ids = append(ids, r.Job.ID)
		run = append(run, Message{Type: MsgReplJob, Payload: encodeReplJobs(true, []replJob{r})})
	}
	holder.jobs.HandleBatch(origin.id, run)
	for _, id := range ids {
		if got := holder.state(t, id); got != "active" {
			t.Fatalf("copy %s: state %q, want active", id, got)
		}
	}
	return ids
}

// TestSetAckOfAPairWritesOneRecord: the holder of a two-holder copy whose
// other holder sends the SETACK deletes it at once (one record), answers
// GOTACK known, and the DELJOB that follows writes nothing.
func TestSetAckOfAPairWritesOneRecord(t *testing.T) {
	a, b, ids, delOnly := pairAndOneDelete(t)
	gotAcks := a.jobs.Stats().GotAcksReceived
	setAck := aofGrowth(t, b, func() {
		b.jobs.HandleBatch(a.id, []Message{{Type: MsgSetAck, Payload: encodeSetAcks(ids[1:], []int{2})}})
	})
	if got := b.state(t, ids[1]); got != "" {
		t.Fatalf("copy %s: state %q after its pair's SETACK, want deleted", ids[1], got)
	}
	eventually(t, "the GOTACK", func() bool { return a.jobs.Stats().GotAcksReceived == gotAcks+1 })
	delJob := aofGrowth(t, b, func() {
		b.jobs.HandleBatch(a.id, []Message{{Type: MsgDelJob, Payload: encodeIDs(ids[1:])}})
	})
	// A record's size varies by a byte or two (varints).
	if delOnly <= 0 || setAck+delJob > delOnly+delOnly/2 {
		t.Fatalf("SETACK then DELJOB of a two-holder copy wrote %d+%d bytes, a DELJOB alone %d: want one record", setAck, delJob, delOnly)
	}
	if n := b.jobs.Stats().PendingAcks; n != 0 {
		t.Fatalf("the holder keeps %d collections of a job deleted", n)
	}
	// A late copy of the job is not brought back (jobs_gone.go).
	late := replJob{Job: &storage.Job{ID: ids[1], Queue: "q", Ctime: uint64(time.Now().UnixMicro()),
		Etime: time.Now().UnixMilli() + 3_600_000, Retry: 60, Repl: 2, Nodes: []string{a.id, b.id}}, Body: []byte("b")}
	b.jobs.HandleBatch(a.id, []Message{{Type: MsgReplJob, Payload: encodeReplJobs(true, []replJob{late})}})
	if got := b.state(t, ids[1]); got != "" {
		t.Fatalf("a late REPLJOB after the pair's delete left state %q", got)
	}
}

// TestSetAckAgainAfterThePairDeleteLeavesNoDummy: a SETACK resent (its
// GOTACK slow or lost) after the pair's delete finds the id among the
// ended ones and leaves no dummy ack, which only a collection of its own
// would clear; it is answered "not known".
func TestSetAckAgainAfterThePairDeleteLeavesNoDummy(t *testing.T) {
	c := newTestCluster(t, 2, -1)
	a, b := c.nodes[0], c.nodes[1]
	ids := heldCopies(t, a, b, 1)
	set := Message{Type: MsgSetAck, Payload: encodeSetAcks(ids, []int{2})}
	b.jobs.HandleBatch(a.id, []Message{set})
	b.jobs.HandleBatch(a.id, []Message{set})
	if got := b.state(t, ids[0]); got != "" {
		t.Fatalf("copy %s: state %q after its pair's SETACK twice, want nothing left", ids[0], got)
	}
	eventually(t, "the GOTACKs", func() bool { return a.jobs.Stats().GotAcksReceived == 2 })
	if n := b.jobs.Stats().PendingAcks; n != 0 {
		t.Fatalf("the holder keeps %d collections", n)
	}
}

// TestSetAckOfAThreeHolderCopyAcks: a copy that names a third holder is
// acked at SETACK, not deleted, whatever the sender's mayhave.
func TestSetAckOfAThreeHolderCopyAcks(t *testing.T) {
	c := newTestCluster(t, 2, -1)
	a, b := c.nodes[0], c.nodes[1]
	ids := heldCopiesWith(t, a, b, 1, "0123456789abcdef0123456789abcdef01234567")
	b.jobs.HandleBatch(a.id, []Message{{Type: MsgSetAck, Payload: encodeSetAcks(ids, []int{2})}})
	if got := b.state(t, ids[0]); got != "acked" {
		t.Fatalf("copy with three holders: state %q after SETACK, want acked", got)
	}
}

func aofGrowth(t *testing.T, nd *jobsNode, f func()) int64 {
	t.Helper()
	before := int64(nd.st.Stats().AOFEnd)
	f()
	// What f applied but did not wait for (a GETJOB's deliveries of
	// at-least-once jobs: queue/get.go) is written before this returns.
	if err := nd.st.AppliedPending().Wait(); err != nil {
		t.Fatal(err)
	}
	return int64(nd.st.Stats().AOFEnd) - before
}

// pairAndOneDelete makes two nodes holding two copies whose node lists
// are exactly the pair (a the origin), and measures what b's log grows
// by for a DELJOB of the first: one DEL record, the unit the tests
// compare with.
func pairAndOneDelete(t *testing.T) (a, b *jobsNode, ids []string, delOnly int64) {
	t.Helper()
	c := newTestCluster(t, 2, -1)
	a, b = c.nodes[0], c.nodes[1]
	ids = heldCopies(t, a, b, 2)
	delOnly = aofGrowth(t, b, func() {
		b.jobs.HandleBatch(a.id, []Message{{Type: MsgDelJob, Payload: encodeIDs(ids[:1])}})
	})
	return a, b, ids, delOnly
}

// TestSetAckThenDelJobInOneReadWritesOnlyTheDelete: a holder whose link
// read a SETACK and then the DELJOB of the same job does not write the
// ack: one DEL record, as for a DELJOB alone, and the GOTACK still goes,
// "known", once the delete is durable.
func TestSetAckThenDelJobInOneReadWritesOnlyTheDelete(t *testing.T) {
	a, b, ids, delOnly := pairAndOneDelete(t)
	gotAcks := a.jobs.Stats().GotAcksReceived
	both := aofGrowth(t, b, func() {
		b.jobs.HandleBatch(a.id, []Message{
			{Type: MsgSetAck, Payload: encodeSetAcks(ids[1:], []int{2})},
			{Type: MsgDelJob, Payload: encodeIDs(ids[1:])},
		})
	})
	// A record's size varies by a byte or two (varints); an ACK record
	// is about a DEL record's.
	if delOnly <= 0 || both > delOnly+delOnly/2 {
		t.Fatalf("SETACK + DELJOB of one job read together wrote %d bytes, a DELJOB alone %d: want one record (no ACK)", both, delOnly)
	}
	for _, id := range ids {
		if got := b.state(t, id); got != "" {
			t.Fatalf("copy %s: state %q after its DELJOB", id, got)
		}
	}
	eventually(t, "the GOTACK", func() bool { return a.jobs.Stats().GotAcksReceived == gotAcks+1 })
	if n := b.jobs.Stats().PendingAcks; n != 0 {
		t.Fatalf("the holder keeps %d collections of a job deleted", n)
	}
}

// TestSetAcksInOneReadAreAnsweredByOneGotAck: the SETACKs a link read
// together are acked in one batch and answered by one GOTACK.
func TestSetAcksInOneReadAreAnsweredByOneGotAck(t *testing.T) {
	c := newTestCluster(t, 2, -1)
	a, b := c.nodes[0], c.nodes[1]
	ids := heldCopies(t, a, b, 3)
	sent := b.tr.Stats().MessagesSent
	b.jobs.HandleBatch(a.id, []Message{
		{Type: MsgSetAck, Payload: encodeSetAcks(ids[:2], []int{2, 2})},
		{Type: MsgSetAck, Payload: []byte{0xff}}, // malformed: costs only itself
		{Type: MsgSetAck, Payload: encodeSetAcks(ids[2:], []int{2})},
	})
	for _, id := range ids {
		// Deleted, not acked: the copies' holders are the two nodes
		// (ackgc_pair.go).
		if got := b.state(t, id); got != "" {
			t.Fatalf("copy %s: state %q after SETACK, want deleted", id, got)
		}
	}
	eventually(t, "the GOTACKs", func() bool { return a.jobs.Stats().GotAcksReceived == 3 })
	if n := b.tr.Stats().MessagesSent - sent; n != 1 {
		t.Fatalf("three SETACKs read together were answered in %d messages, want one GOTACK", n)
	}
	if got := b.jobs.Stats().BadPayloads; got != 1 {
		t.Fatalf("BadPayloads = %d, want 1", got)
	}
}

// TestDelJobThenSetAckInOneReadLeavesADummyAck: order is kept within a
// read: a SETACK after the DELJOB of its job leaves a dummy ack, as it
// would read alone, so a late REPLJOB cannot bring the job back.
func TestDelJobThenSetAckInOneReadLeavesADummyAck(t *testing.T) {
	c := newTestCluster(t, 2, -1)
	a, b := c.nodes[0], c.nodes[1]
	ids := heldCopies(t, a, b, 1)
	b.jobs.HandleBatch(a.id, []Message{
		{Type: MsgDelJob, Payload: encodeIDs(ids)},
		{Type: MsgSetAck, Payload: encodeSetAcks(ids, []int{2})},
	})
	if j, err := b.st.Job(ids[0]); err != nil || !j.IsDummyAck() {
		t.Fatalf("after DELJOB then SETACK: %+v, %v; want a dummy ack", j, err)
	}
}

// TestGotAcksInOneReadEndInOneDelJob: the GOTACKs a collector's link read
// together finish their jobs at once: one DELJOB to the holder for all of
// them, and every job deleted here.
func TestGotAcksInOneReadEndInOneDelJob(t *testing.T) {
	c := newTestCluster(t, 2, -1)
	a, b := c.nodes[0], c.nodes[1]
	// The holder's GOTACKs are lost, so the collections wait for the
	// ones this test hands a's link.
	c.mu.Lock()
	c.lose = func(dst, _ string, m Message) bool { return dst == a.id && m.Type == MsgGotAck }
	c.mu.Unlock()
	var ids []string
	for range 3 {
		res := addJob(t, a, queue.AddRequest{Replicate: 2, Timeout: 5000})
		if res.Err != nil {
			t.Fatal(res.Err)
		}
		ids = append(ids, res.ID)
	}
	if n, err := a.broker.Ack(ids); err != nil || n != 3 {
		t.Fatalf("Ack: %d, %v", n, err)
	}
	for _, id := range ids {
		// The pair's holder deletes at SETACK (ackgc_pair.go).
		eventually(t, "the SETACK on the holder", func() bool { return b.state(t, id) == "" })
	}
	dels := a.jobs.Stats().DelJobsSent
	a.jobs.HandleBatch(b.id, []Message{
		{Type: MsgGotAck, Payload: encodeGotAcks(ids[:1], []bool{true})},
		{Type: MsgGotAck, Payload: encodeGotAcks(ids[1:], []bool{true, true})},
	})
	if n := a.jobs.Stats().DelJobsSent - dels; n != 1 {
		t.Fatalf("two GOTACKs read together sent %d DELJOBs, want one", n)
	}
	for _, id := range ids {
		if got := a.state(t, id); got != "" {
			t.Fatalf("job %s: state %q on the collector after every GOTACK", id, got)
		}
		eventually(t, "the DELJOB on the holder", func() bool { return b.state(t, id) == "" })
	}
	if n := a.jobs.Stats().PendingAcks; n != 0 {
		t.Fatalf("%d collections left", n)
	}
}

// TestDelJobAfterThePairDeleteReadsNothing: the collector's DELJOB of a
// copy this node deleted at its pair's SETACK (ackgc_pair.go) is answered
// from memory: no read of the index for a job known to be gone, no record.
// A DELJOB of another copy still deletes it.
func TestDelJobAfterThePairDeleteReadsNothing(t *testing.T) {
	c := newTestCluster(t, 2, -1)
	a, b := c.nodes[0], c.nodes[1]
	ids := heldCopies(t, a, b, 2)
	b.jobs.HandleBatch(a.id, []Message{{Type: MsgSetAck, Payload: encodeSetAcks(ids[:1], []int{2})}})
	if got := b.state(t, ids[0]); got != "" {
		t.Fatalf("copy %s: state %q after its pair's SETACK, want deleted", ids[0], got)
	}
	eventually(t, "the GOTACK", func() bool { return a.jobs.Stats().GotAcksReceived == 1 })
	// The delete's index writes go to Pebble: a lookup of the id now
	// reads it there.
	if err := b.st.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	gets := b.st.Stats().IndexGets
	grew := aofGrowth(t, b, func() {
		b.jobs.HandleBatch(a.id, []Message{{Type: MsgDelJob, Payload: encodeIDs(ids[:1])}})
	})
	if n := b.st.Stats().IndexGets - gets; n != 0 || grew != 0 {
		t.Fatalf("the DELJOB of a copy deleted at its pair's SETACK made %d index reads and %d bytes of log, want none", n, grew)
	}
	b.jobs.HandleBatch(a.id, []Message{{Type: MsgDelJob, Payload: encodeIDs(ids[1:])}})
	if got := b.state(t, ids[1]); got != "" {
		t.Fatalf("copy %s: state %q after its DELJOB", ids[1], got)
	}
	if n := b.jobs.Stats().PendingAcks; n != 0 {
		t.Fatalf("the holder keeps %d collections", n)
	}
}

// TestDelJobAfterThePairDeleteStillEndsAClientsDummy: a client's ACKJOB
// here of a job deleted at its pair's SETACK leaves a dummy ack and a
// collection of it; the collector's DELJOB then deletes the dummy and ends
// the collection, as it did before DELJOBs of such ids skipped the store.
// (Skipping it ended the collection and kept the dummy: the Jepsen
// checker's "leftover-dummy-ack", seed 1.)
func TestDelJobAfterThePairDeleteStillEndsAClientsDummy(t *testing.T) {
	c := newTestCluster(t, 2, -1)
	a, b := c.nodes[0], c.nodes[1]
	ids := heldCopies(t, a, b, 1)
	b.jobs.HandleBatch(a.id, []Message{{Type: MsgSetAck, Payload: encodeSetAcks(ids, []int{2})}})
	eventually(t, "the GOTACK", func() bool { return a.jobs.Stats().GotAcksReceived == 1 })
	if _, err := b.broker.Ack(ids); err != nil {
		t.Fatal(err)
	}
	if got := b.state(t, ids[0]); got != "acked" {
		t.Fatalf("an ACKJOB of a job deleted here left state %q, want a dummy ack", got)
	}
	b.jobs.HandleBatch(a.id, []Message{{Type: MsgDelJob, Payload: encodeIDs(ids)}})
	if got := b.state(t, ids[0]); got != "" {
		t.Fatalf("the collector's DELJOB left state %q: the dummy ack stays", got)
	}
	eventually(t, "no collection left", func() bool { return b.jobs.Stats().PendingAcks == 0 })
}
