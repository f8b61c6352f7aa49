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
