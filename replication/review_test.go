package replication

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
	"github.com/diskque/diskque/wal"
)

// The review's findings on the write path (branch creview): each test
// fails without its fix.

// gatedCluster is the real job protocol with ReplicateAsync held after
// its REPLJOBs are sent, until the test opens gate: the window between an
// ASYNC job's copies leaving and the origin recording where they went,
// which a consumer already waiting on the queue falls into.
type gatedCluster struct {
	*Jobs
	sent chan struct{}
	gate chan struct{}
	// onReplicateAsync, if set, is called by ReplicateAsync.
	onReplicateAsync func()
}

func (g *gatedCluster) ReplicateAsync(jobs []queue.Replication) [][]string {
	if g.onReplicateAsync != nil {
		g.onReplicateAsync()
	}
	nodes := g.Jobs.ReplicateAsync(jobs)
	close(g.sent)
	<-g.gate
	return nodes
}

// SendAsync is the same window where the nodes are chosen before the job
// is stored (queue.AsyncPlanner): the job, queued already, is deliverable
// in it, and must carry its nodes.
func (g *gatedCluster) SendAsync(jobs []queue.Replication) {
	g.Jobs.SendAsync(jobs)
	close(g.sent)
	<-g.gate
}

// reopenGated reopens nd with its broker's cluster held by a gatedCluster.
func (c *testCluster) reopenGated(nd *jobsNode) *gatedCluster {
	t := c.t
	t.Helper()
	c.close(nd)
	opts := storage.TestingOptions()
	opts.FS, opts.Sync = vfs.Default, wal.SyncAlways
	opts.Logger = quietLog()
	st, err := storage.Open(nd.dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	nd.st = st
	nd.jobs, err = NewJobs(JobsConfig{ID: nd.id, Peers: staticPeers{c, nd.id}, Logger: quietLog(), AckRetryTick: c.ackTick})
	if err != nil {
		t.Fatal(err)
	}
	g := &gatedCluster{Jobs: nd.jobs, sent: make(chan struct{}), gate: make(chan struct{})}
	nd.tr = c.net.Join(nd.id, nd.jobs.Handle)
	nd.broker, err = queue.New(queue.Options{Store: st, Cluster: g, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	go nd.broker.Run()
	c.setPeers()
	if err := nd.jobs.Start(nd.broker, nd.tr); err != nil {
		t.Fatal(err)
	}
	return g
}

// noCopyLeft fails unless, within d, no node holds the job (or holds it
// other than acked): a copy left active is requeued at its RETRY and
// delivered again although it was acked.
func noCopyLeft(t *testing.T, c *testCluster, id string, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		var left []string
		for _, nd := range c.nodes {
			if s := nd.state(t, id); s != "" && s != "acked" {
				left = append(left, nd.id[:8]+":"+s)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("acked job %s still live on %v: it will be requeued at its RETRY and delivered again", id[:12], left)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestAsyncJobAckedBeforeItsNodesAreRecorded: an ASYNC job is queued at
// once, before the origin records the nodes its copies went to. A consumer
// waiting on the queue gets it and acks it in that window: the origin sees
// a job only it holds and deletes it at once, and the copies on the other
// nodes are never collected (resurrected at their RETRY).
func TestAsyncJobAckedBeforeItsNodesAreRecorded(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	origin := c.nodes[0]
	g := c.reopenGated(origin)

	added := make(chan queue.AddResult, 1)
	go func() { added <- addJob(t, origin, queue.AddRequest{Replicate: 3, Async: true}) }()
	<-g.sent
	get := func() []queue.Delivered {
		d, err := origin.broker.GetJobs(context.Background(), queue.GetRequest{Queues: []string{"q"}, Count: 1, NoHang: true})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	// A consumer, while the copies are on their way.
	d := get()
	var id string
	if len(d) == 1 {
		id = d[0].ID
		for _, nd := range c.nodes[1:] {
			eventually(t, "the async copies", func() bool { return nd.state(t, id) == "active" })
		}
		if _, err := origin.broker.Ack([]string{id}); err != nil {
			t.Fatal(err)
		}
	}
	close(g.gate)
	r := <-added
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	if id == "" { // not deliverable before its nodes were recorded: now it is
		if d = get(); len(d) != 1 || d[0].ID != r.ID {
			t.Fatalf("GETJOB after the ASYNC ADDJOB: %+v", d)
		}
		id = d[0].ID
		if _, err := origin.broker.Ack([]string{id}); err != nil {
			t.Fatal(err)
		}
	}
	noCopyLeft(t, c, id, 3*time.Second)
}

// TestReplJobAgainMergesTheNodes: a REPLJOB sent again while the origin is
// short of confirmations names one more node (Replicate adds one every
// 50 ms); a copy received first with the shorter list must learn the
// longer one (Disque's updateJobNodes), or an ACKJOB on that replica
// collects every copy but the new node's, which is requeued at its RETRY.
func TestReplJobAgainMergesTheNodes(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	a, b, late := c.nodes[0], c.nodes[1], c.nodes[2]
	job := &storage.Job{ID: storage.NewJobID(a.id, 3600, 60), Queue: "q", Ctime: 1_000_000,
		Etime: time.Now().UnixMilli() + 3_600_000, Retry: 60, Repl: 2, Nodes: []string{a.id, b.id}}
	first := Message{Type: MsgReplJob, Payload: encodeReplJobs(false, []replJob{{Job: job, Body: []byte("b")}})}
	more := *job
	more.Nodes = []string{a.id, b.id, late.id}
	again := Message{Type: MsgReplJob, Payload: encodeReplJobs(false, []replJob{{Job: &more, Body: []byte("b")}})}
	b.jobs.Handle(a.id, first)
	b.jobs.Handle(a.id, again)
	late.jobs.Handle(a.id, again)

	j, err := b.st.Job(job.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(j.Nodes, late.id) {
		t.Errorf("the copy received twice still names %d nodes, not the one added", len(j.Nodes))
	}
	// The consequence: ACKJOB on b.
	if _, err := b.broker.Ack([]string{job.ID}); err != nil {
		t.Fatal(err)
	}
	noCopyLeft(t, c, job.ID, 3*time.Second)
}

// TestAckJobOnAStrangerCollectsTheCopies: ACKJOB on a node that never had
// the job leaves a dummy ack whose SETACK acks every copy; the holders
// answer known and the dummy goes, but nobody then collects the copies
// (Disque: the holder that knows more nodes than the SETACK's sender
// starts the collection, tryJobGC): they stay acked on every holder until
// their TTL.
func TestAckJobOnAStrangerCollectsTheCopies(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	origin := c.nodes[0]
	c.setDown(c.nodes[2].id, true)
	res := addJob(t, origin, queue.AddRequest{Replicate: 2, Timeout: 5000})
	c.setDown(c.nodes[2].id, false)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	stranger := c.nodes[2]
	if n, err := stranger.broker.Ack([]string{res.ID}); err != nil || n != 0 {
		t.Fatalf("Ack of an unknown id: %d, %v", n, err)
	}
	// Every copy is collected: none is left acked with its body until its
	// TTL (a dummy ack may stay, bodiless, as it may after any SETACK that
	// arrives once a job is gone).
	deadline := time.Now().Add(3 * time.Second)
	for {
		var left []string
		for _, nd := range c.nodes {
			if j, err := nd.st.Job(res.ID); err == nil && !j.IsDummyAck() {
				left = append(left, fmt.Sprintf("node %d: %s", slices.Index(c.nodes, nd), j.State))
			}
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after an ACKJOB on a stranger the job is still on %v: its collection never ran", left)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestCloseAfterAFailedResume: Start whose resume fails (here the store is
// closed; in the daemon a corrupt index met by the scan, which then
// reopens the node) must still let Close return: it waited for an
// ack-retry loop that was never started, and the node's reopen hung.
func TestCloseAfterAFailedResume(t *testing.T) {
	// One other node known: a lone node has nothing to resume and skips it.
	st, j, b := jobsOverMemStore(t, func(self string) Peers { return onePeer{self, storage.NewNodeID()} })
	closeUnder(t, st, b)
	if err := j.Start(b, NewMemNetwork().Join(st.NodeID(), j.Handle)); err == nil {
		t.Fatal("Start over a closed store resumed nothing and said nothing")
	}
	closed := make(chan struct{})
	go func() { j.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close after a failed Start did not return")
	}
}
