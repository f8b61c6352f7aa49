package replication

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/diskque/diskque/queue"
)

// TestFastDelSentAgainKeepsTheDummyTheFirstLeft: the victim gets a
// FASTDEL before the REPLJOB of its copy (held on its way) and leaves a
// dummy ack; its GOTACK is lost, so the deletion sends the FASTDEL again.
// The second FASTDEL finds the dummy, not a copy: it must keep it, or the
// late REPLJOB queues a copy of a job the client FASTACKed. Before, the
// blind delete removed the dummy (it counted as a copy deleted) and the
// REPLJOB brought the job back.
func TestFastDelSentAgainKeepsTheDummyTheFirstLeft(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	origin, holder, victim := c.nodes[0], c.nodes[1], c.nodes[2]
	var lost atomic.Int64
	kept := keepBackReplJobs(c, victim.id, origin.id, func(dst, from string, m Message) bool {
		if dst == holder.id && from == victim.id && m.Type == MsgGotAck && lost.Load() == 0 {
			lost.Add(1)
			return true
		}
		return false
	})
	res := addJob(t, origin, queue.AddRequest{Replicate: 3, Async: true})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	eventually(t, "the copy on the holder", func() bool { return holder.state(t, res.ID) != "" })
	eventually(t, "the victim's REPLJOB held", kept.any)
	if j, err := holder.st.Job(res.ID); err != nil || len(j.Nodes) != 3 {
		t.Fatalf("holder's job %+v, %v: want the three nodes", j, err)
	}
	fastAcked := time.Now()
	if n, err := holder.broker.FastAck([]string{res.ID}); err != nil || n != 1 {
		t.Fatalf("FastAck: %d, %v", n, err)
	}
	eventually(t, "the victim's first answer lost", func() bool { return lost.Load() == 1 })
	if got := victim.state(t, res.ID); got != "acked" {
		t.Fatalf("after the first FASTDEL the victim has %q, want its dummy ack", got)
	}
	eventually(t, "the origin's answer", func() bool {
		holder.jobs.mu.Lock()
		defer holder.jobs.mu.Unlock()
		gc := holder.jobs.acks.get(res.ID)
		return gc != nil && gc.confirmed[origin.id]
	})
	next, ok := holder.jobs.NextAckRetry(res.ID)
	if !ok {
		t.Fatal("the holder does not retry the deletion")
	}
	if n := holder.jobs.RetryAcks(next); n != 1 {
		t.Fatalf("the retry sent %d messages, want one FASTDEL to the victim", n)
	}
	eventually(t, "the FASTACK's deletion over", func() bool {
		return holder.state(t, res.ID) == "" && holder.jobs.Stats().PendingAcks == 0
	})
	late := kept.late()
	victim.jobs.HandleBatch(origin.id, late) // the REPLJOB arrives, late
	if got := victim.state(t, res.ID); got != "acked" {
		t.Fatalf("after the late REPLJOB the victim's copy is %q, want the dummy ack the first FASTDEL left", got)
	}
	// The dummy is still collected by its own round: nothing is left.
	next = heldRoundDue(t, victim, res.ID, fastAcked)
	if n := victim.jobs.RetryAcks(next); n != 2 {
		t.Fatalf("the dummy's round sent %d SETACKs, want one to each other node", n)
	}
	noTrace(t, c, res.ID)
}
