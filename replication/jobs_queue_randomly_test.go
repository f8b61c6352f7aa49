package replication

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/diskque/diskque/queue"
)

// TestQueueRandomlyQueuesOnAnotherHolder: ADDJOB … QUEUE-RANDOMLY keeps no
// copy on the node that received it; REPLICATE other nodes hold one each
// when it answers, and exactly one of them, chosen at random (not always
// the same one), queues it.
func TestQueueRandomlyQueuesOnAnotherHolder(t *testing.T) {
	c := newTestCluster(t, 4, -1)
	origin := c.nodes[0]
	queuers := map[string]int{}
	for range 12 {
		res := addJob(t, origin, queue.AddRequest{Replicate: 3, Timeout: 5000, External: queue.ExternalQueueRandomly})
		if res.Err != nil {
			t.Fatal(res.Err)
		}
		if s := origin.state(t, res.ID); s != "" {
			t.Fatalf("the origin holds the job (%s)", s)
		}
		if held, _ := c.holders(t, res.ID); len(held) < 3 {
			t.Fatalf("%d nodes hold the job at the reply, want 3", len(held))
		}
		var queuer *jobsNode
		eventually(t, "one holder queues the job", func() bool {
			_, queued := c.holders(t, res.ID)
			if len(queued) > 1 {
				t.Fatalf("queued on %d nodes", len(queued))
			}
			if len(queued) == 1 {
				queuer = queued[0]
			}
			return queuer != nil
		})
		queuers[queuer.id]++
	}
	if n := origin.broker.QueueLen("q"); n != 0 {
		t.Fatalf("QLEN on the origin = %d, want 0", n)
	}
	// 12 jobs over 3 candidates all on one node: (1/3)^11, 6e-6.
	if len(queuers) < 2 {
		t.Fatalf("every job was queued on the same node: %v", queuers)
	}
	// GLOBALQLEN from the origin sees them all, once each.
	if got := origin.jobs.PeersQueueLen("q", 5*time.Second); got.Sum != 12 {
		t.Fatalf("PeersQueueLen = %+v, want 12", got)
	}
}

// TestQueueRandomlyNeedsReplicateOtherNodes: with every copy elsewhere,
// REPLICATE n needs n reachable other nodes: one short is NOREPL with the
// reason, nothing stored anywhere; ASYNC replies at once and one holder
// queues it.
func TestQueueRandomlyNeedsReplicateOtherNodes(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	origin := c.nodes[0]
	res := addJob(t, origin, queue.AddRequest{Replicate: 3, Timeout: 5000, External: queue.ExternalQueueRandomly})
	var nr *queue.NoReplError
	if !errors.As(res.Err, &nr) || !errors.Is(res.Err, queue.ErrNoRepl) || nr.Reason != "QUEUE-RANDOMLY keeps every copy on other nodes" {
		t.Fatalf("REPLICATE 3 of 3 nodes: err %v, want a NoReplError for QUEUE-RANDOMLY", res.Err)
	}
	for _, nd := range c.nodes {
		if n := nd.st.Stats().Jobs; n != 0 {
			t.Fatalf("node %s holds %d jobs", nd.id[:8], n)
		}
	}
	if d := origin.broker.DefaultReplicateElsewhere(); d != 2 {
		t.Fatalf("DefaultReplicateElsewhere on 3 nodes = %d, want 2", d)
	}
	res = addJob(t, origin, queue.AddRequest{Replicate: 2, Async: true, External: queue.ExternalQueueRandomly})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	eventually(t, "2 copies elsewhere, one queued", func() bool {
		held, queued := c.holders(t, res.ID)
		return len(held) == 2 && len(queued) == 1 && !slices.Contains(held, origin)
	})
}
