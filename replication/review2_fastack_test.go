package replication

import (
	"slices"
	"testing"

	"github.com/diskque/diskque/queue"
)

// TestFastAckReachesAHolderOnlyAnotherHolderKnows: the FASTACK node knows
// fewer holders than one of them (a copy that holder gave on: federation,
// a WILLQUEUE's sender). ACKJOB covers that (SETACK's mayhave: the holder
// that knows more collects the job itself); FASTDEL did not: the holder
// deleted its copy and answered, and the copy only it knew of stayed
// active, requeued at its RETRY and delivered again after the FASTACK.
func TestFastAckReachesAHolderOnlyAnotherHolderKnows(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	origin, holder, far := c.nodes[0], c.nodes[1], c.nodes[2]
	c.setDown(far.id, true)
	res := addJob(t, origin, queue.AddRequest{Replicate: 2, Timeout: 5000})
	c.setDown(far.id, false)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	// far gets a copy from holder, which alone knows it.
	job, body, err := holder.broker.Job(res.ID)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(job.Nodes, far.id) {
		t.Fatalf("far already a holder: %v", job.Nodes)
	}
	cp := *job
	cp.Nodes = append(slices.Clone(job.Nodes), far.id)
	if errs, durable := far.broker.ReplicaApply([]queue.Replica{{Job: &cp, Body: body}}); errs[0] != nil || durable() != nil {
		t.Fatalf("far's copy: %v", errs[0])
	}
	if _, _, err := holder.broker.RemoteWillQueue(far.id, []string{res.ID}); err != nil {
		t.Fatal(err)
	}
	if j, _, _ := origin.broker.Job(res.ID); slices.Contains(j.Nodes, far.id) {
		t.Fatalf("the origin knows far: %v", j.Nodes)
	}
	if n, err := origin.broker.FastAck([]string{res.ID}); err != nil || n != 1 {
		t.Fatalf("FastAck: %d, %v", n, err)
	}
	noTrace(t, c, res.ID)
}
