package replication

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
)

// holders returns the nodes of c that hold id, and those that have it
// queued.
func (c *testCluster) holders(t *testing.T, id string) (held, queued []*jobsNode) {
	t.Helper()
	for _, nd := range c.nodes {
		switch nd.state(t, id) {
		case "":
		case "queued":
			queued = append(queued, nd)
			held = append(held, nd)
		default:
			held = append(held, nd)
		}
	}
	return held, queued
}

// TestExternalReplicationKeepsNoLocalCopy: a node that is leaving adds a
// REPLICATE 2 job to two *other* nodes, keeps nothing itself, and exactly
// one of them queues it; it is delivered from there, and its ack collects
// every copy.
func TestExternalReplicationKeepsNoLocalCopy(t *testing.T) {
	c := newTestCluster(t, 4, 20*time.Millisecond)
	origin := c.nodes[0]
	res := addJob(t, origin, queue.AddRequest{Replicate: 2, Timeout: 5000, External: queue.ExternalLeaving})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	if !strings.HasPrefix(res.ID, storage.JobIDPrefix(origin.id)) {
		t.Fatalf("id %s does not carry the origin's prefix %s", res.ID, storage.JobIDPrefix(origin.id))
	}
	if n := origin.st.Stats().Jobs; n != 0 {
		t.Fatalf("the origin holds %d jobs, want none", n)
	}
	// The reply came after two other nodes had a durable copy. A third
	// may hold one too: when the GOTJOBs are late (past ResendInterval, a
	// loaded machine's fsync), the origin sends the job to one more node,
	// as Disque does every 50 ms; that copy lists all three, the first
	// two list the nodes sent to when theirs went.
	held, _ := c.holders(t, res.ID)
	if len(held) < 2 {
		t.Fatalf("%d nodes hold the job, want at least 2", len(held))
	}
	for _, nd := range held {
		j, _ := nd.st.Job(res.ID)
		if slices.Contains(j.Nodes, origin.id) || len(j.Nodes) < 2 || !slices.Contains(j.Nodes, nd.id) {
			t.Fatalf("node %s: nodes %v, want at least two holders, itself among them, not the origin %s",
				nd.id[:8], j.Nodes, origin.id[:8])
		}
	}
	var queuer *jobsNode
	eventually(t, "one holder queues the job (ENQUEUE)", func() bool {
		_, queued := c.holders(t, res.ID)
		if len(queued) > 1 {
			t.Fatalf("%d nodes queued the job", len(queued))
		}
		if len(queued) == 1 {
			queuer = queued[0]
		}
		return queuer != nil
	})
	got, err := queuer.broker.GetJobs(context.Background(), queue.GetRequest{Queues: []string{"q"}, Count: 1, NoHang: true})
	if err != nil || len(got) != 1 || got[0].ID != res.ID {
		t.Fatalf("GETJOB on the queueing node: %v %v", got, err)
	}
	if _, queued := c.holders(t, res.ID); len(queued) != 0 {
		t.Fatalf("still queued on %d nodes after its delivery", len(queued))
	}
	if s := origin.jobs.Stats(); s.EnqueuesSent != 1 {
		t.Fatalf("EnqueuesSent = %d, want 1", s.EnqueuesSent)
	}
	// The ack, on the origin that never held it: a dummy ack there,
	// SETACK to every node, and the copies go.
	if _, err := origin.broker.Ack([]string{res.ID}); err != nil {
		t.Fatal(err)
	}
	// A node that never had it may keep the dummy ack a holder's SETACK
	// left (until its TTL: a late REPLJOB must not bring the job back).
	eventually(t, "every copy collected, the origin's dummy ack too", func() bool {
		held, _ := c.holders(t, res.ID)
		for _, nd := range held {
			if j, _ := nd.st.Job(res.ID); nd == origin || j != nil && !j.IsDummyAck() {
				return false
			}
		}
		return true
	})
}

// TestExternalReplicationAsync: ASYNC under memory pressure replies at
// once and keeps nothing here; the copies arrive on REPLICATE other nodes
// and exactly one of them queues the job.
func TestExternalReplicationAsync(t *testing.T) {
	c := newTestCluster(t, 4, -1)
	origin := c.nodes[0]
	res := addJob(t, origin, queue.AddRequest{Replicate: 3, Async: true, External: queue.ExternalOutOfMemory})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	if n := origin.st.Stats().Jobs; n != 0 {
		t.Fatalf("the origin holds %d jobs, want none", n)
	}
	eventually(t, "3 copies, one queued", func() bool {
		held, queued := c.holders(t, res.ID)
		return len(held) == 3 && len(queued) == 1
	})
	if s := origin.broker.Stats(); s.JobsExternal != 1 || s.JobsAdded != 0 {
		t.Fatalf("stats %+v: want JobsExternal 1, JobsAdded 0", s)
	}
}

// TestExternalReplicationNotEnoughNodes: a job that must be replicated
// externally needs REPLICATE other nodes; one short is Disque's NOREPL
// with the reason, and nothing is stored anywhere. A preferred one that
// cannot have them keeps its copy here as usual.
func TestExternalReplicationNotEnoughNodes(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	origin := c.nodes[0]
	res := addJob(t, origin, queue.AddRequest{Replicate: 3, Timeout: 5000, External: queue.ExternalLeaving})
	var nr *queue.NoReplError
	if !errors.As(res.Err, &nr) || !errors.Is(res.Err, queue.ErrNoRepl) || nr.Reason != "I'm leaving the cluster" {
		t.Fatalf("err %v, want a NoReplError for leaving", res.Err)
	}
	res = addJob(t, origin, queue.AddRequest{Replicate: 3, Async: true, External: queue.ExternalOutOfDisk})
	if !errors.As(res.Err, &nr) || nr.Reason != "I'm out of disk space" {
		t.Fatalf("async: err %v, want a NoReplError for disk", res.Err)
	}
	for _, nd := range c.nodes {
		if n := nd.st.Stats().Jobs; n != 0 {
			t.Fatalf("node %s holds %d jobs", nd.id[:8], n)
		}
	}
	// Preferred, REPLICATE 3 of 3 nodes: the usual path, a copy here.
	res = addJob(t, origin, queue.AddRequest{Replicate: 3, Timeout: 5000, External: queue.ExternalPreferred})
	if res.Err != nil || origin.state(t, res.ID) != "queued" {
		t.Fatalf("preferred, too few peers: %v, state %q; want a local queued copy", res.Err, origin.state(t, res.ID))
	}
	// Preferred with enough peers: external.
	res = addJob(t, origin, queue.AddRequest{Replicate: 2, Timeout: 5000, External: queue.ExternalPreferred})
	if res.Err != nil || origin.state(t, res.ID) != "" {
		t.Fatalf("preferred: %v, state here %q; want no local copy", res.Err, origin.state(t, res.ID))
	}
	// Bad requests are still refused for what they are.
	res = addJob(t, origin, queue.AddRequest{Replicate: 2, TTL: 10, Delay: 20, External: queue.ExternalLeaving})
	if res.Err == nil || errors.Is(res.Err, queue.ErrNoRepl) {
		t.Fatalf("DELAY ≥ TTL: err %v", res.Err)
	}
}

// TestExternalReplicationTimeout: a node cut off (membership has not
// noticed) never confirms; at the ms-timeout the ADDJOB fails and the
// copy that did arrive is deleted (DELJOB); nothing is queued anywhere.
func TestExternalReplicationTimeout(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	origin := c.nodes[0]
	c.net.Cut(origin.id, c.nodes[2].id)
	res := addJob(t, origin, queue.AddRequest{Replicate: 2, Timeout: 200, External: queue.ExternalOutOfMemory})
	if !errors.Is(res.Err, queue.ErrReplTimeout) {
		t.Fatalf("err %v, want ErrReplTimeout", res.Err)
	}
	eventually(t, "no copy left", func() bool {
		for _, nd := range c.nodes {
			if nd.st.Stats().Jobs != 0 {
				return false
			}
		}
		return true
	})
}

// TestExternalReplicationDelay: a DELAYed job is queued by the chosen node
// when its delay is over, not before, and by one node only.
func TestExternalReplicationDelay(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	origin := c.nodes[0]
	start := time.Now()
	res := addJob(t, origin, queue.AddRequest{Replicate: 2, Timeout: 5000, Delay: 1, External: queue.ExternalLeaving})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	eventually(t, "queued after its delay", func() bool {
		_, queued := c.holders(t, res.ID)
		if len(queued) > 0 && time.Since(start) < 900*time.Millisecond {
			t.Fatalf("queued %v after a DELAY of 1 s", time.Since(start))
		}
		if len(queued) > 1 {
			t.Fatalf("queued on %d nodes", len(queued))
		}
		return len(queued) == 1
	})
	// An at-most-once job with DELAY has no requeue timer to wait with
	// on the queueing node: a leaving node refuses it, a node short of
	// memory keeps it.
	amo := queue.AddRequest{Queue: "q", Body: []byte("x"), TTL: 60, Replicate: 1, Delay: 1, External: queue.ExternalLeaving}
	if r := origin.broker.AddJobs([]queue.AddRequest{amo})[0]; !errors.Is(r.Err, queue.ErrNoRepl) {
		t.Fatalf("at-most-once with DELAY, leaving: %v, want ErrNoRepl", r.Err)
	}
	amo.External = queue.ExternalPreferred
	if r := origin.broker.AddJobs([]queue.AddRequest{amo})[0]; r.Err != nil || origin.state(t, r.ID) != "active" {
		t.Fatalf("at-most-once with DELAY, preferred: %v, want a delayed copy here", r.Err)
	}
}

// TestEnqueueMalformed: a malformed ENQUEUE is dropped and counted; a
// well-formed one for an unknown job changes nothing.
func TestEnqueueMalformed(t *testing.T) {
	c := newTestCluster(t, 2, -1)
	nd := c.nodes[1]
	for _, p := range [][]byte{nil, {codecVersion}, {codecVersion, 1}, {9, 0}, append(encodeEnqueues([]string{storage.NewJobID(nd.id, 60, 1)}, []int64{0}), 0)} {
		nd.jobs.Handle(c.nodes[0].id, Message{Type: MsgEnqueue, Payload: p})
	}
	if s := nd.jobs.Stats(); s.BadPayloads != 5 {
		t.Fatalf("BadPayloads = %d, want 5", s.BadPayloads)
	}
	ids, delays, err := decodeEnqueues(encodeEnqueues([]string{storage.NewJobID(nd.id, 60, 1)}, []int64{1500}))
	if err != nil || len(ids) != 1 || delays[0] != 1500 {
		t.Fatalf("round trip: %v %v %v", ids, delays, err)
	}
	nd.jobs.Handle(c.nodes[0].id, Message{Type: MsgEnqueue, Payload: encodeEnqueues(ids, []int64{0})})
	if n := nd.st.Stats().Jobs; n != 0 {
		t.Fatalf("an ENQUEUE of an unknown job left %d jobs", n)
	}
}
