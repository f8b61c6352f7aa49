package replication

import (
	"testing"
	"time"

	"github.com/diskque/diskque/queue"
)

// TestReviewFederationRetryZeroReplicaCopyLost: an at-most-once job
// (RETRY 0) added on A with REPLICATE 2 has a copy on B (active, never
// queued). A blocking GETJOB on B makes A give it away (YOURJOBS) and
// delete it; B, finding its own copy, does not queue it
// (RemoteYourJobs: cur.Retry == 0 → continue). The job, never delivered,
// is queued nowhere: lost.
func TestReviewFederationRetryZeroReplicaCopyLost(t *testing.T) {
	c := fedCluster(t, 2)
	a, b := c.nodes[0], c.nodes[1]
	r := a.broker.AddJobs([]queue.AddRequest{{Queue: "q", Body: []byte("x"), TTL: 3600, Retry: 0, Replicate: 2}})[0]
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	if b.state(t, r.ID) == "" {
		t.Fatal("B has no copy")
	}
	got := getWait(t, b, "q", 1, 3*time.Second)
	if len(got) == 1 {
		return
	}
	t.Fatalf("GETJOB on B got nothing; A's copy: %q, B's copy: %q, A's queue %d, B's queue %d",
		a.state(t, r.ID), b.state(t, r.ID), a.broker.QueueLen("q"), b.broker.QueueLen("q"))
}

// TestReviewFederationRetryZeroCopyNeverCollected: an at-most-once job
// added on A with REPLICATE 2 in a 3-node cluster has its copy on one
// other node; GETJOB on the third moves it there (YOURJOBS), where its
// node list is that node alone (RemoteYourJobs: j.Nodes = self). The
// ACKJOB there deletes it there only: the copy on the replica is never
// collected (it stays until its TTL).
func TestReviewFederationRetryZeroCopyNeverCollected(t *testing.T) {
	c := fedCluster(t, 3)
	a := c.nodes[0]
	r := a.broker.AddJobs([]queue.AddRequest{{Queue: "q", Body: []byte("x"), TTL: 3600, Retry: 0, Replicate: 2}})[0]
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	var holder, asker *jobsNode
	for _, nd := range c.nodes[1:] {
		if nd.state(t, r.ID) != "" {
			holder = nd
		} else {
			asker = nd
		}
	}
	if holder == nil || asker == nil {
		t.Fatal("no single copy")
	}
	got := getWait(t, asker, "q", 1, 3*time.Second)
	if len(got) != 1 {
		t.Fatal("not moved")
	}
	if _, err := asker.broker.Ack([]string{r.ID}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the replica's copy collected", func() bool {
		return holder.state(t, r.ID) == "" && asker.state(t, r.ID) == ""
	})
}
