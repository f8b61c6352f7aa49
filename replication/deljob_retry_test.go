package replication

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/diskque/diskque/queue"
)

// noreplWithALostDelJob adds a REPLICATE 3 job that reaches node 1 but
// not node 2 (cut), and cuts node 1 off the origin before the ms-timeout,
// so whatever the origin sends it at the NOREPL is lost. It returns the id.
func noreplWithALostDelJob(t *testing.T, c *testCluster) string {
	t.Helper()
	origin, holder, cut := c.nodes[0], c.nodes[1], c.nodes[2]
	c.net.Cut(origin.id, cut.id)
	type added struct{ res queue.AddResult }
	done := make(chan added, 1)
	go func() {
		r := queue.AddRequest{Queue: "q", Body: []byte("b"), TTL: 3600, Retry: 1, Replicate: 3, Timeout: 400}
		done <- added{origin.broker.AddJobs([]queue.AddRequest{r})[0]}
	}()
	// The copy lands on the holder (it answers GOTJOB, not enough), then
	// the holder is cut off before the timeout.
	eventually(t, "the copy on node 1", func() bool { return holder.st.Stats().Jobs == 1 })
	c.net.Cut(origin.id, holder.id)
	res := (<-done).res
	if !errors.Is(res.Err, queue.ErrReplTimeout) {
		t.Fatalf("err %v, want ErrReplTimeout", res.Err)
	}
	ids := holderIDs(t, holder)
	if len(ids) != 1 {
		t.Fatalf("holder has %v", ids)
	}
	return ids[0]
}

func holderIDs(t *testing.T, nd *jobsNode) []string {
	t.Helper()
	jobs, err := nd.st.ScanJobs("", 10)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, j := range jobs {
		ids = append(ids, j.ID)
	}
	return ids
}

// TestNoReplCopyDeletedThoughTheDelJobWasLost: a job whose replication
// timed out (-NOREPL) is deleted on the node it reached even though that
// node was unreachable at the timeout: the origin keeps it acked and its
// collection retries (SETACK … GOTACK, then DELJOB) once the link is back.
// Before, one DELJOB was sent at the timeout and, lost, the copy stayed
// active and was requeued at its RETRY — delivering a job the client was
// told failed.
func TestNoReplCopyDeletedThoughTheDelJobWasLost(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	origin, holder := c.nodes[0], c.nodes[1]
	id := noreplWithALostDelJob(t, c)
	if got := origin.state(t, id); got != "acked" {
		t.Fatalf("origin after NOREPL: %q, want acked while the copy is collected", got)
	}
	if j, _ := origin.st.Job(id); !slices.Contains(j.Nodes, holder.id) {
		t.Fatalf("origin's nodes %v lack the holder", j.Nodes)
	}
	c.net.Heal(origin.id, holder.id)
	c.net.Heal(origin.id, c.nodes[2].id)
	origin.jobs.RetryAcks(time.Now().Add(4 * time.Minute)) // the next round, whenever due
	for _, nd := range c.nodes {
		eventually(t, "every copy of the NOREPL job deleted", func() bool { return nd.state(t, id) == "" })
	}
}

// TestNoReplCollectionResumesAfterTheOriginRestarts: the intent to delete
// the copies of a NOREPL job is durable: the origin restarts while the
// holder is unreachable, and the copy is still deleted once it is back.
func TestNoReplCollectionResumesAfterTheOriginRestarts(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	origin, holder := c.nodes[0], c.nodes[1]
	id := noreplWithALostDelJob(t, c)
	c.close(origin)
	c.net.Heal(origin.id, holder.id)
	c.net.Heal(origin.id, c.nodes[2].id)
	c.open(origin)
	for _, nd := range c.nodes {
		eventually(t, "the copy deleted after the origin's restart", func() bool { return nd.state(t, id) == "" })
	}
}

// TestAckCollectionEndsWhenATargetIsForgotten: a collection waiting for a
// node that is then forgotten (CLUSTER FORGET: no longer among the known
// nodes) ends at its next round: DELJOB to the others, deleted here.
func TestAckCollectionEndsWhenATargetIsForgotten(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	origin, gone := c.nodes[0], c.nodes[2]
	res := addJob(t, origin, queue.AddRequest{Replicate: 3, Timeout: 5000})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	c.net.Cut(origin.id, gone.id)
	if _, err := origin.broker.Ack([]string{res.ID}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "node 1 confirmed", func() bool { return c.nodes[1].state(t, res.ID) == "acked" })
	origin.jobs.RetryAcks(time.Now().Add(4 * time.Minute))
	if got := origin.state(t, res.ID); got != "acked" {
		t.Fatalf("collection ended while its target is known: %q", got)
	}
	c.mu.Lock()
	c.ids = slices.DeleteFunc(slices.Clone(c.ids), func(s string) bool { return s == gone.id })
	c.mu.Unlock()
	origin.jobs.RetryAcks(time.Now().Add(8 * time.Minute))
	eventually(t, "the origin's job deleted", func() bool { return origin.state(t, res.ID) == "" })
	eventually(t, "node 1's copy deleted", func() bool { return c.nodes[1].state(t, res.ID) == "" })
	if p := origin.jobs.Stats().PendingAcks; p != 0 {
		t.Fatalf("%d collections pending", p)
	}
}
