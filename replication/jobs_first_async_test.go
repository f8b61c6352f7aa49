package replication

import (
	"testing"
	"time"

	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
)

// TestFirstAsyncReplJobs: an origin whose jobs are all ASYNC learns its
// peers' incarnations from the GOTJOB its REPLJOBs ask for now and then
// (asyncHead), marks the REPLJOBs of ASYNC jobs planned after that first,
// and the replicas store those copies without their index lookup (the
// tracked set of other adds does not grow with them).
func TestFirstAsyncReplJobs(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	origin, b, d := c.nodes[0], c.nodes[1], c.nodes[2]
	seen := recordReplJobs(c)
	req := queue.AddRequest{Replicate: 3, Async: true}
	held := func(id string) func() bool {
		return func() bool { return b.state(t, id) != "" && d.state(t, id) != "" }
	}
	warm := addJob(t, origin, req)
	if warm.Err != nil {
		t.Fatal(warm.Err)
	}
	eventually(t, "the first ASYNC copies", held(warm.ID))
	for _, s := range seen() {
		if s.first != 0 {
			t.Fatalf("a REPLJOB marked before any GOTJOB: %+v", s)
		}
	}
	eventually(t, "the peers' incarnations, from the GOTJOB the first REPLJOBs asked for", func() bool {
		origin.jobs.mu.Lock()
		defer origin.jobs.mu.Unlock()
		return origin.jobs.peerInc[b.id] == b.st.ReplicaIncarnation() && origin.jobs.peerInc[d.id] == d.st.ReplicaIncarnation()
	})
	seen0 := len(seen())
	const n = 5
	for range n {
		res := addJob(t, origin, req)
		if res.Err != nil {
			t.Fatal(res.Err)
		}
		eventually(t, "the ASYNC copies", held(res.ID))
	}
	for _, s := range seen()[seen0:] {
		nd := b
		if s.to == d.id {
			nd = d
		}
		if s.first != nd.st.ReplicaIncarnation() {
			t.Fatalf("an ASYNC REPLJOB planned after the GOTJOB stamped %d, node's incarnation %d", s.first, nd.st.ReplicaIncarnation())
		}
	}
	wantFirst(t, b, n, 0)
	wantFirst(t, d, n, 0)
}

// TestAsyncStampLearnedAfterThePlan: an ASYNC job's REPLJOB is not marked
// with an incarnation learned after the job was planned (its id may have
// left the origin by then: it is queued from its commit on), and is with
// one learned before.
func TestAsyncStampLearnedAfterThePlan(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	origin, b, d := c.nodes[0], c.nodes[1], c.nodes[2]
	seen := recordReplJobs(c)
	if res := addJob(t, origin, queue.AddRequest{Replicate: 3, Timeout: 10000}); res.Err != nil {
		t.Fatal(res.Err) // a sync job: its GOTJOBs carry both incarnations
	}
	eventually(t, "the peers' incarnations", func() bool {
		origin.jobs.mu.Lock()
		defer origin.jobs.mu.Unlock()
		return origin.jobs.peerInc[b.id] != 0 && origin.jobs.peerInc[d.id] != 0
	})
	plan := origin.jobs.PlanMark()
	// b's incarnation changes after the plan (as after b restarted).
	newInc := b.st.ReplicaIncarnation() + 1
	origin.jobs.gotJobs(b.id, nil, newInc)
	j := &storage.Job{ID: storage.NewJobID(origin.id, 3600, 60), Queue: "q", Ctime: 1_000_000,
		Etime: time.Now().UnixMilli() + 3_600_000, Retry: 60, Repl: 3, Nodes: []string{origin.id, b.id, d.id}}
	seen0 := len(seen())
	origin.jobs.SendAsync([]queue.Replication{{Job: j, Body: []byte("b"), Plan: plan}})
	eventually(t, "the two REPLJOBs", func() bool { return len(seen()) >= seen0+2 })
	for _, s := range seen()[seen0:] {
		switch {
		case s.to == b.id && s.first != 0:
			t.Fatalf("REPLJOB to b stamped %d, learned after the plan", s.first)
		case s.to == d.id && s.first != d.st.ReplicaIncarnation():
			t.Fatalf("REPLJOB to d stamped %d, want %d (learned before the plan)", s.first, d.st.ReplicaIncarnation())
		}
	}
	// That REPLJOB asked b for a GOTJOB (no ASYNC one had yet), which
	// brings b's real incarnation back; a job planned after that is
	// marked with it.
	real := b.st.ReplicaIncarnation()
	eventually(t, "b's incarnation again", func() bool {
		origin.jobs.mu.Lock()
		defer origin.jobs.mu.Unlock()
		return origin.jobs.peerInc[b.id] == real
	})
	j2 := *j
	j2.ID = storage.NewJobID(origin.id, 3600, 60)
	seen0 = len(seen())
	origin.jobs.SendAsync([]queue.Replication{{Job: &j2, Body: []byte("b"), Plan: origin.jobs.PlanMark()}})
	eventually(t, "the two REPLJOBs", func() bool { return len(seen()) >= seen0+2 })
	for _, s := range seen()[seen0:] {
		if s.to == b.id && s.first != real {
			t.Fatalf("REPLJOB to b planned after the change stamped %d, want %d", s.first, real)
		}
	}
}

// TestAsyncRoundReadsMembershipOnce: the ASYNC jobs of one add round get
// their nodes from one AsyncNodes call, which reads membership once (it
// was once per job: Membership.Reachable sorts and copies every peer), and
// each still gets its own Repl−1 nodes.
func TestAsyncRoundReadsMembershipOnce(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	origin := c.nodes[0]
	reqs := make([]queue.AddRequest, 16)
	for i := range reqs {
		reqs[i] = queue.AddRequest{Queue: "q", Body: []byte("b"), TTL: 3600, Retry: 60, Replicate: 2 + i%2, Async: true}
	}
	before := c.reachableCalls.Load()
	res := origin.broker.AddJobs(reqs)
	calls := c.reachableCalls.Load() - before
	for i, r := range res {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		j, err := origin.st.Job(r.ID)
		if err != nil {
			t.Fatal(err)
		}
		if len(j.Nodes) != reqs[i].Replicate {
			t.Fatalf("job %d: nodes %v, want %d", i, j.Nodes, reqs[i].Replicate)
		}
	}
	// ReachablePeers once, AsyncNodes once (a GOTJOB handled meanwhile
	// reads none).
	if calls > 2 {
		t.Fatalf("one round of 16 ASYNC jobs read membership %d times, want 2", calls)
	}
}
