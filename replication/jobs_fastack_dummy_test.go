package replication

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/diskque/diskque/queue"
)

// TestFastDelLeavesADummyOnAHolderWithoutTheJob: FASTACK on a holder
// while the origin's REPLJOB to a third holder is still on its way (held
// here, as a link being redialled holds it for up to DownQueueTimeout).
// The third node gets the FASTDEL first, for a job it does not have yet:
// as a SETACK would, it must leave a dummy ack, or the late REPLJOB
// queues a copy of a job the client FASTACKed, delivered again at its
// RETRY (before, it answered GOTACK and kept nothing: the copy came
// back). The dummy is then collected by its own round, as SETACK's are:
// nothing is left anywhere.
func TestFastDelLeavesADummyOnAHolderWithoutTheJob(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	origin, holder, victim := c.nodes[0], c.nodes[1], c.nodes[2]
	kept := keepBackReplJobs(c, victim.id, origin.id, nil)
	res := addJob(t, origin, queue.AddRequest{Replicate: 3, Async: true})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	eventually(t, "the copy on the holder", func() bool { return holder.state(t, res.ID) != "" })
	eventually(t, "the victim's REPLJOB held", kept.any)
	late := kept.late()
	if j, err := holder.st.Job(res.ID); err != nil || len(j.Nodes) != 3 {
		t.Fatalf("holder's job %+v, %v: want the three nodes", j, err)
	}
	fastAcked := time.Now()
	if n, err := holder.broker.FastAck([]string{res.ID}); err != nil || n != 1 {
		t.Fatalf("FastAck: %d, %v", n, err)
	}
	eventually(t, "the FASTACK's deletion over", func() bool {
		return holder.state(t, res.ID) == "" && origin.state(t, res.ID) == "" && holder.jobs.Stats().PendingAcks == 0
	})
	victim.jobs.HandleBatch(origin.id, late) // the REPLJOB arrives, late
	if got := victim.state(t, res.ID); got != "acked" {
		t.Fatalf("after the late REPLJOB the victim's copy is %q, want the dummy ack the FASTDEL left", got)
	}
	if j, err := victim.st.Job(res.ID); err != nil || !j.IsDummyAck() {
		t.Fatalf("victim: %+v, %v: want a dummy ack", j, err)
	}
	next := heldRoundDue(t, victim, res.ID, fastAcked)
	if n := victim.jobs.RetryAcks(next); n != 2 {
		t.Fatalf("the dummy's round sent %d SETACKs, want one to each other node", n)
	}
	noTrace(t, c, res.ID)
}

// TestFastDelOfAnUnknownIDLeavesNothingOnBystanders: a FASTACK on a node
// that never had the job sends its deletion to every node (mayhave 0): a
// node that does not have the job either keeps nothing, as for a SETACK
// with mayhave 0 (its collector would never ask it again).
func TestFastDelOfAnUnknownIDLeavesNothingOnBystanders(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	origin, asker, bystander := c.nodes[0], c.nodes[1], c.nodes[2]
	c.setDown(asker.id, true)
	c.setDown(bystander.id, true)
	res := addJob(t, origin, queue.AddRequest{Replicate: 1})
	c.setDown(asker.id, false)
	c.setDown(bystander.id, false)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	eventually(t, "the links", func() bool {
		return asker.tr.Connected(origin.id) && asker.tr.Connected(bystander.id)
	})
	if n, err := asker.broker.FastAck([]string{res.ID}); err != nil || n != 0 {
		t.Fatalf("FastAck on a non-holder: %d, %v", n, err)
	}
	noTrace(t, c, res.ID)
}

// TestFastDelSentAgainLeavesNoDummyWhereTheCopyWasDeleted: a holder's
// GOTACK to a FASTDEL is lost, so the deletion sends it FASTDEL again; the
// holder deleted its copy at the first one and must not take the second
// for a job it never had: no dummy ack (it would cost a collection round,
// and with every answer late on a loaded node, one per job: the
// FASTACK cost test left dummies behind).
func TestFastDelSentAgainLeavesNoDummyWhereTheCopyWasDeleted(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	origin, holder := c.nodes[0], c.nodes[1]
	res := addJob(t, origin, queue.AddRequest{Replicate: 3, Timeout: 5000})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	var lost atomic.Int64
	c.mu.Lock()
	c.lose = func(dst, from string, m Message) bool {
		if dst == origin.id && from == holder.id && m.Type == MsgGotAck {
			lost.Add(1)
			return true
		}
		return false
	}
	c.mu.Unlock()
	if n, err := origin.broker.FastAck([]string{res.ID}); err != nil || n != 1 {
		t.Fatalf("FastAck: %d, %v", n, err)
	}
	eventually(t, "the holder's answer lost", func() bool { return lost.Load() > 0 })
	// The third node's answer in too, or the retry sends it FASTDEL again.
	eventually(t, "the third node's answer", func() bool {
		origin.jobs.mu.Lock()
		defer origin.jobs.mu.Unlock()
		gc := origin.jobs.acks.get(res.ID)
		return gc != nil && gc.confirmed[c.nodes[2].id]
	})
	next, ok := origin.jobs.NextAckRetry(res.ID)
	if !ok {
		t.Fatal("the origin does not retry the deletion")
	}
	if n := origin.jobs.RetryAcks(next); n != 1 {
		t.Fatalf("the retry sent %d messages, want one FASTDEL to the holder", n)
	}
	eventually(t, "the second answer lost too", func() bool { return lost.Load() > 1 })
	if got := holder.state(t, res.ID); got != "" {
		t.Fatalf("after the FASTDEL sent again the holder has %q, want nothing", got)
	}
	c.mu.Lock()
	c.lose = nil
	c.mu.Unlock()
	next, _ = origin.jobs.NextAckRetry(res.ID)
	origin.jobs.RetryAcks(next)
	noTrace(t, c, res.ID)
}

// TestReplJobAgainAfterFastDelIsDropped: a copy FASTDEL deleted here, its
// REPLJOB delivered again afterwards (a resend, or a duplicate a redialled
// link brings), must not come back as a live copy of a FASTACKed job: it is
// dropped as a late copy of an ended job is (jobs_gone.go). Before, the
// ids a FASTDEL deleted were kept only to answer FASTDEL's own resends, and
// the REPLJOB stored the job again, requeued at its RETRY.
func TestReplJobAgainAfterFastDelIsDropped(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	origin, holder, victim := c.nodes[0], c.nodes[1], c.nodes[2]
	var mu sync.Mutex
	var seen []Message
	c.mu.Lock()
	c.hold = func(to, from string, ms []Message) { // records, delivers
		if to == victim.id && from == origin.id {
			mu.Lock()
			for _, m := range ms {
				if m.Type == MsgReplJob {
					seen = append(seen, m)
				}
			}
			mu.Unlock()
		}
	}
	c.mu.Unlock()
	res := addJob(t, origin, queue.AddRequest{Replicate: 3, Timeout: 5000})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	c.mu.Lock()
	c.hold = nil
	c.mu.Unlock()
	if got := victim.state(t, res.ID); got == "" {
		t.Fatal("the synchronous copy is not on the victim")
	}
	if n, err := holder.broker.FastAck([]string{res.ID}); err != nil || n != 1 {
		t.Fatalf("FastAck: %d, %v", n, err)
	}
	noTrace(t, c, res.ID)
	mu.Lock()
	again := seen
	mu.Unlock()
	if len(again) == 0 {
		t.Fatal("no REPLJOB to the victim recorded")
	}
	victim.jobs.HandleBatch(origin.id, again) // the REPLJOB again
	if got := victim.state(t, res.ID); got != "" {
		t.Fatalf("after the REPLJOB again the victim has %q of a FASTACKed job, want nothing", got)
	}
	if n := victim.jobs.Stats().LateCopiesDropped; n != 1 {
		t.Fatalf("%d late copies dropped, want 1", n)
	}
}
