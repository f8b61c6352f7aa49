package replication

import (
	"sync/atomic"
	"testing"

	"github.com/diskque/diskque/queue"
)

// TestAsyncJobStoredWithItsNodes: an ADDJOB ASYNC on a node whose cluster
// is an AsyncPlanner stores the job queued with its three nodes in its one
// commit — when ADDJOB returns, the job is queued and names them, and
// ReplicateAsync (the wait-repl path and its second commit) was not used —
// and the copies reach both other nodes.
func TestAsyncJobStoredWithItsNodes(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	origin := c.nodes[0]
	g := c.reopenGated(origin)
	close(g.gate)
	var async atomic.Int64
	g.onReplicateAsync = func() { async.Add(1) }
	res := addJob(t, origin, queue.AddRequest{Replicate: 3, Async: true})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	job, err := origin.st.Job(res.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got := origin.state(t, res.ID); got != "queued" || len(job.Nodes) != 3 {
		t.Fatalf("origin's job when ADDJOB returned: %s, nodes %v", got, job.Nodes)
	}
	if n := async.Load(); n != 0 {
		t.Fatalf("ReplicateAsync called %d times: the job took the wait-repl path", n)
	}
	for _, nd := range c.nodes[1:] {
		eventually(t, "the async copy", func() bool { return nd.state(t, res.ID) == "active" })
	}
}
