package replication

import (
	"testing"

	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
)

// TestAckOnANonHolderLeavesNoDummyOnBystanders: an ACKJOB on a node that
// never had the job broadcasts SETACK (mayhave 0) to every node; a node
// that does not have the job either must not keep a dummy ack of it, since
// the holder that collects the job sends DELJOB only to the job's own
// nodes. Found by the Jepsen checker (cmd/diskque-server jepsen_test.go,
// leftover-dummy-ack): with REPLICATE 1 on 3 nodes, an ACKJOB on the
// second left a dummy ack on the third until the id's TTL.
func TestAckOnANonHolderLeavesNoDummyOnBystanders(t *testing.T) {
	for _, repl := range []int{1, 2} {
		c := newTestCluster(t, 4, -1)
		origin := c.nodes[0]
		res := addJob(t, origin, queue.AddRequest{Replicate: repl, Timeout: 5000})
		if res.Err != nil {
			t.Fatal(res.Err)
		}
		var strangers []*jobsNode
		for _, nd := range c.nodes[1:] {
			if nd.state(t, res.ID) == "" {
				strangers = append(strangers, nd)
			}
		}
		if len(strangers) < 2 {
			t.Fatalf("REPLICATE %d on 4 nodes: %d nodes without the job, want 2 at least", repl, len(strangers))
		}
		if n, err := strangers[0].broker.Ack([]string{res.ID}); err != nil || n != 0 {
			t.Fatalf("Ack of an unknown id: %d, %v", n, err)
		}
		for i, nd := range c.nodes {
			eventually(t, "no trace of the job on node "+string(rune('0'+i)), func() bool { return nd.state(t, res.ID) == "" })
		}
	}
}

// TestDummyAckNobodyKnowsIsDropped: a dummy ack whose SETACK every node
// answered without knowing the job is deleted, as Disque deletes it ("dummy
// ACK not known cluster-wide"): every copy is gone already (a holder would
// have answered that it knows the job), so no REPLJOB can come late.
// Found by the Jepsen checker (leftover-dummy-ack, seed 22): a holder
// killed after collecting a job acked on a non-holder, and before its
// GOTACK went out, left the non-holder's dummy ack until the id's TTL.
func TestDummyAckNobodyKnowsIsDropped(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	stranger := c.nodes[1]
	id := storage.NewJobID(c.nodes[0].id, 3600, 60) // at-least-once, never added
	if n, err := stranger.broker.Ack([]string{id}); err != nil || n != 0 {
		t.Fatalf("Ack of an unknown id: %d, %v", n, err)
	}
	for i, nd := range c.nodes {
		eventually(t, "no trace of the job on node "+string(rune('0'+i)), func() bool { return nd.state(t, id) == "" })
	}
	if p := stranger.jobs.Stats().PendingAcks; p != 0 {
		t.Errorf("%d collections still pending", p)
	}
}
