package replication

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/diskque/diskque/queue"
)

// loseFastDelsTo makes every DELJOB and FASTDEL sent to node to lost while
// on is set, and counts them.
func loseFastDelsTo(c *testCluster, to string, on *atomic.Bool) *atomic.Int64 {
	var lost atomic.Int64
	c.mu.Lock()
	c.lose = func(dst, _ string, m Message) bool {
		if on.Load() && dst == to && (m.Type == MsgDelJob || m.Type == MsgFastDel) {
			lost.Add(1)
			return true
		}
		return false
	}
	c.mu.Unlock()
	return &lost
}

// TestFastAckLostDelJobIsRetried: FASTACK on the origin; its deletion to
// one holder is lost. Before, that holder kept an active copy (requeued at
// its RETRY, delivered again after the FASTACK). Now the origin keeps an
// acked placeholder and sends the deletion again at its next round; once
// every holder answered, nothing is left anywhere.
func TestFastAckLostDelJobIsRetried(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	origin, holder, victim := c.nodes[0], c.nodes[1], c.nodes[2]
	res := addJob(t, origin, queue.AddRequest{Replicate: 3, Timeout: 5000})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	var on atomic.Bool
	on.Store(true)
	lost := loseFastDelsTo(c, victim.id, &on)
	if n, err := origin.broker.FastAck([]string{res.ID}); err != nil || n != 1 {
		t.Fatalf("FastAck: %d, %v", n, err)
	}
	// The holder's answer handled (its copy is gone before its GOTACK
	// goes, once the delete is durable): the retry is for the victim.
	eventually(t, "the reachable holder's copy deleted and its answer in", func() bool {
		return holder.state(t, res.ID) == "" && origin.jobs.Stats().GotAcksReceived > 0
	})
	eventually(t, "the deletion to the victim lost", func() bool { return lost.Load() > 0 })
	if got := victim.state(t, res.ID); got != "active" {
		t.Fatalf("victim: %q, want its copy (the deletion was lost)", got)
	}
	if got := origin.state(t, res.ID); got != "acked" {
		t.Fatalf("origin: %q, want the acked placeholder until every holder answered", got)
	}
	next, ok := origin.jobs.NextAckRetry(res.ID)
	if !ok {
		t.Fatal("the origin does not retry the deletion")
	}
	on.Store(false)
	if n := origin.jobs.RetryAcks(next); n != 1 {
		t.Fatalf("the retry sent %d messages, want one FASTDEL to the victim", n)
	}
	noTrace(t, c, res.ID)
}

// TestFastAckOnNonHolderIsRetried: FASTACK on a node that never had the
// job leaves a dummy placeholder there (counted 0) whose deletion goes to
// every node, again while one has not answered.
func TestFastAckOnNonHolderIsRetried(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	origin, holder, asker := c.nodes[0], c.nodes[1], c.nodes[2]
	c.setDown(asker.id, true)
	res := addJob(t, origin, queue.AddRequest{Replicate: 2, Timeout: 5000})
	c.setDown(asker.id, false)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	var on atomic.Bool
	on.Store(true)
	lost := loseFastDelsTo(c, holder.id, &on)
	if n, err := asker.broker.FastAck([]string{res.ID}); err != nil || n != 0 {
		t.Fatalf("FastAck on a non-holder: %d, %v", n, err)
	}
	eventually(t, "the origin's copy deleted", func() bool { return origin.state(t, res.ID) == "" })
	eventually(t, "the deletion to the holder lost", func() bool { return lost.Load() > 0 })
	if got := holder.state(t, res.ID); got != "active" {
		t.Fatalf("holder: %q, want its copy (the deletion was lost)", got)
	}
	next, ok := asker.jobs.NextAckRetry(res.ID)
	if !ok {
		t.Fatal("the asker does not retry the deletion")
	}
	on.Store(false)
	asker.jobs.RetryAcks(next)
	noTrace(t, c, res.ID)
}

// TestFastAckResumesAfterRestart: FASTACK on an origin cut off from both
// holders, then a restart of the origin: the placeholder's collection
// resumes and deletes every copy. Before, the job was deleted here at once
// and the copies stayed active.
func TestFastAckResumesAfterRestart(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	origin := c.nodes[0]
	res := addJob(t, origin, queue.AddRequest{Replicate: 3, Timeout: 5000})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	c.net.Cut(origin.id, c.nodes[1].id)
	c.net.Cut(origin.id, c.nodes[2].id)
	if n, err := origin.broker.FastAck([]string{res.ID}); err != nil || n != 1 {
		t.Fatalf("FastAck: %d, %v", n, err)
	}
	c.close(origin)
	c.net.Heal(origin.id, c.nodes[1].id)
	c.net.Heal(origin.id, c.nodes[2].id)
	for _, nd := range c.nodes[1:] {
		if got := nd.state(t, res.ID); got != "active" {
			t.Fatalf("a holder's copy is %q while the origin is down, want active", got)
		}
	}
	c.open(origin)
	noTrace(t, c, res.ID)
}

// TestFastAckLateReplJobDoesNotResurrect: a REPLJOB of a FASTACKed job
// arriving at its placeholder (a resend that was on its way) leaves it
// acked: it is not queued or delivered again.
func TestFastAckLateReplJobDoesNotResurrect(t *testing.T) {
	c := newTestCluster(t, 2, -1)
	origin, holder := c.nodes[0], c.nodes[1]
	res := addJob(t, origin, queue.AddRequest{Replicate: 2, Timeout: 5000})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	job, body, err := holder.broker.Job(res.ID)
	if err != nil {
		t.Fatal(err)
	}
	c.net.Cut(origin.id, holder.id)
	if _, err := holder.broker.FastAck([]string{res.ID}); err != nil {
		t.Fatal(err)
	}
	if errs, _ := holder.broker.ReplicaApply([]queue.Replica{{Job: job, Body: body}}); errs[0] == nil {
		if got := holder.state(t, res.ID); got != "acked" {
			t.Fatalf("after a late REPLJOB the placeholder is %q", got)
		}
	}
	if got := holder.state(t, res.ID); got != "acked" {
		t.Fatalf("placeholder: %q, want acked", got)
	}
	c.net.Heal(origin.id, holder.id)
	holder.jobs.RetryAcks(time.Now().Add(4 * time.Minute))
	noTrace(t, c, res.ID)
}
