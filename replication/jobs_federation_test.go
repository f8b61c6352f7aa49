package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
)

// fedCluster is an in-process cluster of n nodes on the MemNetwork whose
// brokers know they are clustered (a Tick each: Run's first may not have
// happened yet).
func fedCluster(t *testing.T, n int) *testCluster {
	t.Helper()
	c := newTestCluster(t, n, 20*time.Millisecond)
	for _, nd := range c.nodes {
		if err := nd.broker.Tick(time.Now().UnixMilli()); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// getWait is a blocking GETJOB of up to count jobs from q on nd.
func getWait(t *testing.T, nd *jobsNode, q string, count int, timeout time.Duration) []queue.Delivered {
	t.Helper()
	got, err := nd.broker.GetJobs(context.Background(), queue.GetRequest{Queues: []string{q}, Count: count, Timeout: timeout})
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("GETJOB on %s: %v", nd.id[:8], err)
	}
	return got
}

// TestFederationGetJobOnAnotherNode: jobs added on A (REPLICATE 1) are all
// delivered by GETJOBs on B, which block on B's empty queue while NEEDJOBS
// brings them; B's QSTAT names A in import-from with a rate; A keeps each
// at-least-once job active (its requeue timer) with B among its nodes, and
// an ACKJOB on B collects A's copy.
func TestFederationGetJobOnAnotherNode(t *testing.T) {
	c := fedCluster(t, 3)
	a, b := c.nodes[0], c.nodes[1]
	const n = 30
	var ids []string
	for i := range n {
		r := addJob(t, a, queue.AddRequest{Body: []byte(fmt.Sprint("job ", i)), Replicate: 1})
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		ids = append(ids, r.ID)
	}
	seen := map[string]bool{}
	deadline := time.Now().Add(10 * time.Second)
	for len(seen) < n && time.Now().Before(deadline) {
		for _, d := range getWait(t, b, "q", 10, 5*time.Second) {
			if seen[d.ID] {
				t.Fatalf("job %s delivered twice on B", d.ID)
			}
			seen[d.ID] = true
			// A's copy stays active, B among its holders.
			if aj := a.job(t, d.ID); aj == nil || aj.State != storage.StateActive || !slices.Contains(aj.Nodes, b.id) {
				t.Fatalf("A's copy of %s: %+v", d.ID, aj)
			}
			if bj := b.job(t, d.ID); bj == nil || !slices.Contains(bj.Nodes, a.id) || !slices.Contains(bj.Nodes, b.id) {
				t.Fatalf("B's copy of %s: %+v", d.ID, bj)
			}
		}
	}
	if len(seen) != n {
		t.Fatalf("B got %d of %d jobs", len(seen), n)
	}
	st, ok := b.broker.QueueStat("q")
	if !ok || !slices.Equal(st.ImportFrom, []string{a.id}) || st.ImportRate <= 0 {
		t.Fatalf("B's QSTAT: %+v", st)
	}
	if a.broker.ImportRate("q") != 0 {
		t.Fatalf("A imports?")
	}
	if s := b.jobs.Stats(); s.NeedJobsSent == 0 || s.YourJobsReceived != n {
		t.Fatalf("B's stats: %+v", s)
	}
	// ACKJOB on B: A's copy is collected too.
	ackCollected(t, b, ids, a, b)
}

// TestFederationRetryZeroMovedOnce: at-most-once jobs on A consumed by
// blocking GETJOBs on B and C at once are each delivered exactly once, and
// A keeps none of them.
func TestFederationRetryZeroMovedOnce(t *testing.T) {
	c := fedCluster(t, 3)
	a := c.nodes[0]
	const n = 40
	for i := range n {
		r := a.broker.AddJobs([]queue.AddRequest{{Queue: "q", Body: []byte(fmt.Sprint(i)), TTL: 3600, Retry: 0, Replicate: 1}})[0]
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	var mu sync.Mutex
	got := map[string]int{}
	total := 0
	var wg sync.WaitGroup
	for _, nd := range c.nodes[1:] {
		wg.Go(func() {
			for {
				mu.Lock()
				done := total >= n
				mu.Unlock()
				if done {
					return
				}
				ds := getWait(t, nd, "q", 3, 300*time.Millisecond)
				mu.Lock()
				for _, d := range ds {
					got[d.ID]++
					total++
				}
				mu.Unlock()
			}
		})
	}
	waitDone := make(chan struct{})
	go func() { wg.Wait(); close(waitDone) }()
	select {
	case <-waitDone:
	case <-time.After(20 * time.Second):
		mu.Lock()
		t.Fatalf("consumers got %d of %d jobs", total, n)
	}
	for id, k := range got {
		if k != 1 {
			t.Fatalf("%s delivered %d times", id, k)
		}
	}
	if len(got) != n {
		t.Fatalf("%d distinct jobs delivered, want %d", len(got), n)
	}
	eventually(t, "A holds none of them", func() bool {
		return a.st.Stats().Jobs == 0
	})
	// Nothing comes back anywhere: every node's queue is empty for good.
	for _, nd := range c.nodes {
		if l := nd.broker.QueueLen("q"); l != 0 {
			t.Fatalf("%s still has %d queued", nd.id[:8], l)
		}
	}
}

// TestNeedJobsGivesHalfAQueueShorterThanTwiceTheCount: the giver's rule
// (Disque's receiveNeedJobs): count jobs when it holds at least 2×count,
// else half of what it holds, at least 1; nothing from a queue paused for
// output, nor from a queue this node imports itself.
func TestNeedJobsGivesHalfAQueueShorterThanTwiceTheCount(t *testing.T) {
	c := fedCluster(t, 2)
	a, b := c.nodes[0], c.nodes[1]
	for range 23 {
		if r := addJob(t, a, queue.AddRequest{Replicate: 1}); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	for _, step := range []struct{ count, give, left int }{
		{5, 5, 18}, {10, 9, 9}, {5, 4, 5}, {5, 2, 3}, {5, 1, 2}, {5, 1, 1}, {100, 1, 0}, {5, 0, 0},
	} {
		jobs, err := a.broker.RemoteNeedJobs(b.id, "q", step.count)
		if err != nil {
			t.Fatal(err)
		}
		if len(jobs) != step.give || a.broker.QueueLen("q") != int64(step.left) {
			t.Fatalf("NEEDJOBS %d: gave %d (want %d), %d left (want %d)", step.count, len(jobs), step.give, a.broker.QueueLen("q"), step.left)
		}
		for _, r := range jobs {
			if !slices.Contains(r.Job.Nodes, b.id) || string(r.Body) != "body" {
				t.Fatalf("given %+v", r)
			}
		}
	}
	// Paused out: nothing; unpaused: it gives again.
	if r := addJob(t, a, queue.AddRequest{Replicate: 1}); r.Err != nil {
		t.Fatal(r.Err)
	}
	if _, err := a.broker.Pause("q", storage.PauseOut); err != nil {
		t.Fatal(err)
	}
	if jobs, _ := a.broker.RemoteNeedJobs(b.id, "q", 5); len(jobs) != 0 {
		t.Fatalf("a queue paused out gave %d jobs", len(jobs))
	}
	if _, err := a.broker.Pause("q", storage.PauseNone); err != nil {
		t.Fatal(err)
	}
	// Importing (a YOURJOBS came lately): nothing either.
	moved, err := b.broker.RemoteNeedJobs(a.id, "q", 5)
	if err != nil || len(moved) != 0 {
		t.Fatalf("B's queue is empty: %d, %v", len(moved), err)
	}
	if r := addJob(t, b, queue.AddRequest{Replicate: 1}); r.Err != nil {
		t.Fatal(r.Err)
	}
	give, err := b.broker.RemoteNeedJobs(a.id, "q", 5)
	if err != nil || len(give) != 1 {
		t.Fatalf("B gives %d, %v", len(give), err)
	}
	if _, err := a.broker.RemoteYourJobs(b.id, give); err != nil {
		t.Fatal(err)
	}
	if jobs, _ := a.broker.RemoteNeedJobs(b.id, "q", 5); len(jobs) != 0 {
		t.Fatalf("an importing queue gave %d jobs", len(jobs))
	}
}

// TestYourJobsKeepCtimeAndCounters: a job moved keeps its ctime (its place
// among the asker's jobs) and its counters (GETJOB WITHCOUNTERS agrees).
func TestYourJobsKeepCtimeAndCounters(t *testing.T) {
	c := fedCluster(t, 2)
	a, b := c.nodes[0], c.nodes[1]
	old := addJob(t, a, queue.AddRequest{Replicate: 1, Body: []byte("old")})
	if old.Err != nil {
		t.Fatal(old.Err)
	}
	d := getOne(t, a, "q")
	if n, err := a.broker.Nack([]string{d.ID}, 0); err != nil || n != 1 {
		t.Fatalf("NACK: %d, %v", n, err)
	}
	// B's job is younger by its ctime's millisecond (ctimes of two nodes
	// in the same millisecond would tie, and sort by id).
	oldCtime := a.job(t, old.ID).CtimeMillis()
	eventually(t, "the clock to pass the old job's millisecond", func() bool { return time.Now().UnixMilli() > oldCtime })
	if r := addJob(t, b, queue.AddRequest{Replicate: 1, Body: []byte("newer")}); r.Err != nil {
		t.Fatal(r.Err)
	}
	give, err := a.broker.RemoteNeedJobs(b.id, "q", 5)
	if err != nil || len(give) != 1 {
		t.Fatalf("A gives %d, %v", len(give), err)
	}
	if _, err := b.broker.RemoteYourJobs(a.id, give); err != nil {
		t.Fatal(err)
	}
	first := getOne(t, b, "q")
	if first.ID != old.ID || first.Nacks != 1 {
		t.Fatalf("B's first job: %+v, want %s with 1 nack", first, old.ID)
	}
	if got := getOne(t, b, "q"); string(got.Body) != "newer" {
		t.Fatalf("B's second job: %+v", got)
	}
	// A client blocked on B is served the job with its counters too.
	nacked := addJob(t, a, queue.AddRequest{Queue: "n", Replicate: 1})
	if nacked.Err != nil {
		t.Fatal(nacked.Err)
	}
	getOne(t, a, "n")
	if n, err := a.broker.Nack([]string{nacked.ID}, 0); err != nil || n != 1 {
		t.Fatalf("NACK: %d, %v", n, err)
	}
	served := make(chan []queue.Delivered, 1)
	go func() {
		got, _ := b.broker.GetJobs(context.Background(), queue.GetRequest{Queues: []string{"n"}, Count: 10, Timeout: 10 * time.Second})
		served <- got
	}()
	eventually(t, "the client blocked on B (or served already)", func() bool {
		st, _ := b.broker.QueueStat("n")
		return st.Blocked == 1 || len(served) == 1
	})
	// B's blocking GETJOB asked A already (its NEEDJOBS may have moved
	// the job by now); if not, move it by hand.
	give, err = a.broker.RemoteNeedJobs(b.id, "n", 5)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.broker.RemoteYourJobs(a.id, give); err != nil {
		t.Fatal(err)
	}
	if got := <-served; len(got) != 1 || got[0].ID != nacked.ID || got[0].Nacks != 1 {
		t.Fatalf("the blocked client got %+v, want %s with 1 nack", got, nacked.ID)
	}
	// An at-most-once job moved twice to the same node (a YOURJOBS
	// received again) is queued the first time only.
	once := a.broker.AddJobs([]queue.AddRequest{{Queue: "z", Body: []byte("once"), TTL: 3600, Replicate: 1}})[0]
	if once.Err != nil {
		t.Fatal(once.Err)
	}
	give, err = a.broker.RemoteNeedJobs(b.id, "z", 5)
	if err != nil || len(give) != 1 || a.state(t, once.ID) != "" {
		t.Fatalf("A gives %d, %v; A's copy %q", len(give), err, a.state(t, once.ID))
	}
	if _, err := b.broker.RemoteYourJobs(a.id, give); err != nil {
		t.Fatal(err)
	}
	if got := getOne(t, b, "z"); got.ID != once.ID {
		t.Fatalf("B's job: %+v", got)
	}
	if _, err := b.broker.RemoteYourJobs(a.id, give); err != nil {
		t.Fatal(err)
	}
	if l := b.broker.QueueLen("z"); l != 0 {
		t.Fatalf("an at-most-once job received twice is queued again: %d", l)
	}
	if bj := b.job(t, once.ID); bj == nil || !slices.Equal(bj.Nodes, []string{b.id}) {
		t.Fatalf("B's at-most-once job: %+v", bj)
	}
}

// TestLeavingNodeAsksNothingAndAnswersLeaving: a leaving node's GETJOB
// returns the jobs it has, then ErrLeaving instead of blocking (NOHANG
// still answers nothing), and it sends no NEEDJOBS, not even for clients
// that blocked before it began leaving; other nodes still drain it.
func TestLeavingNodeAsksNothingAndAnswersLeaving(t *testing.T) {
	c := fedCluster(t, 2)
	a, b := c.nodes[0], c.nodes[1]
	blocked := make(chan []queue.Delivered, 1)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		got, _ := a.broker.GetJobs(ctx, queue.GetRequest{Queues: []string{"w"}, Count: 1})
		blocked <- got
	}()
	eventually(t, "A's first NEEDJOBS", func() bool { return a.jobs.Stats().NeedJobsSent > 0 })
	c.mu.Lock()
	c.leaving = map[string]bool{a.id: true}
	c.mu.Unlock()
	sent := a.jobs.Stats().NeedJobsSent
	for range 3 {
		if r := addJob(t, a, queue.AddRequest{Replicate: 1}); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	leaving := queue.GetRequest{Queues: []string{"q"}, Count: 1, Leaving: true}
	if got, err := a.broker.GetJobs(context.Background(), leaving); err != nil || len(got) != 1 {
		t.Fatalf("leaving, with jobs: %d, %v", len(got), err)
	}
	// B drains the rest.
	for range 2 {
		if got := getWait(t, b, "q", 1, 5*time.Second); len(got) != 1 {
			t.Fatalf("B got %d", len(got))
		}
	}
	if _, err := a.broker.GetJobs(context.Background(), leaving); !errors.Is(err, queue.ErrLeaving) {
		t.Fatalf("leaving, empty: %v, want ErrLeaving", err)
	}
	leaving.NoHang = true
	if got, err := a.broker.GetJobs(context.Background(), leaving); err != nil || got != nil {
		t.Fatalf("leaving, NOHANG: %v, %v", got, err)
	}
	// The client blocked before: A's ticks ask nobody for it.
	for range 5 {
		if err := a.broker.Tick(time.Now().Add(time.Minute).UnixMilli()); err != nil {
			t.Fatal(err)
		}
	}
	if s := a.jobs.Stats().NeedJobsSent; s != sent {
		t.Fatalf("a leaving node sent %d NEEDJOBS", s-sent)
	}
	if st, _ := a.broker.QueueStat("w"); st.Blocked != 1 {
		t.Fatalf("the client blocked on w: %+v", st)
	}
	cancel()
	<-blocked
}

// TestBlockedGetJobKeepsAsking: a client blocked on B before any node had
// a job keeps B asking at the broadcast pace (Tick, driven here by a test
// clock): nothing more within the 4 s after the first broadcast, then one
// that finds the job added on A meanwhile and brings it to the client.
func TestBlockedGetJobKeepsAsking(t *testing.T) {
	clock := newTestClock()
	c := newTestClusterClock(t, 2, -1, clock.Now)
	a, b := c.nodes[0], c.nodes[1]
	c.tickAll(clock) // both know they are clustered
	served := make(chan []queue.Delivered, 1)
	go func() {
		got, _ := b.broker.GetJobs(context.Background(), queue.GetRequest{Queues: []string{"q"}, Count: 1, Timeout: 20 * time.Second})
		served <- got
	}()
	eventually(t, "B's first broadcast", func() bool { return b.jobs.Stats().NeedJobsSent == 1 })
	if r := addJob(t, a, queue.AddRequest{Replicate: 1}); r.Err != nil {
		t.Fatal(r.Err)
	}
	for range 4 { // 4 s: inside the pacing
		clock.Advance(time.Second)
		c.tickAll(clock)
	}
	if n := b.jobs.Stats().NeedJobsSent; n != 1 {
		t.Fatalf("B sent %d NEEDJOBS within 4 s of the first", n)
	}
	if len(served) != 0 || a.broker.QueueLen("q") != 1 {
		t.Fatalf("the job moved before B asked again")
	}
	clock.Advance(100 * time.Millisecond)
	c.tickAll(clock)
	select {
	case got := <-served:
		if len(got) != 1 {
			t.Fatalf("the blocked client got %d jobs", len(got))
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the blocked client was not served (B sent %d NEEDJOBS)", b.jobs.Stats().NeedJobsSent)
	}
}

// TestNeedJobsWritesOneRecordAJob: the giver records a job it moves to
// another node with one AOF record, its delivery carrying the asker in the
// job's nodes (storage.Batch.DeliverMoved), not a DELIVER and then a NODES
// record: the AOF grows by what a GETJOB's deliveries of as many jobs
// write plus the node lists. The giver's at-least-once copies keep the
// asker among their nodes, across a restart, and an at-most-once job
// still goes (with the asker in its list) and is deleted here.
func TestNeedJobsWritesOneRecordAJob(t *testing.T) {
	c := fedCluster(t, 2)
	a, b := c.nodes[0], c.nodes[1]
	const n = 10
	for _, q := range []string{"g", "m"} {
		for range n {
			if r := addJob(t, a, queue.AddRequest{Queue: q, Replicate: 1}); r.Err != nil {
				t.Fatal(r.Err)
			}
		}
	}
	var got []queue.Delivered
	get := aofGrowth(t, a, func() {
		var err error
		got, err = a.broker.GetJobs(context.Background(), queue.GetRequest{Queues: []string{"g"}, Count: n, NoHang: true})
		if err != nil {
			t.Fatal(err)
		}
	})
	var moved []queue.Replica
	need := aofGrowth(t, a, func() {
		var err error
		// n queued, fewer than 2×n: half of them go.
		if moved, err = a.broker.RemoteNeedJobs(b.id, "m", n); err != nil {
			t.Fatal(err)
		}
	})
	if len(got) != n || len(moved) != n/2 {
		t.Fatalf("GETJOB delivered %d, NEEDJOBS gave %d", len(got), len(moved))
	}
	// Per job, the node list of two ids (a count, and a length and 40
	// digits each) beside the delivery; a NODES record of its own would
	// add its framing and the job's id to that.
	// Background records (timers, the ack loop) land in either window
	// under load: CI saw ±10 bytes a job. A NODES record of its own would
	// add its frame and the job's id (≥ 52 bytes) beyond list+40.
	list := int64(1 + 2*(1+40))
	perGet, perMoved := get/n, need/int64(len(moved))
	if perMoved-perGet < list-24 || perMoved-perGet > list+40 {
		t.Fatalf("a moved job wrote %d bytes of AOF, a delivered one %d: want one record, the delivery with its %d-byte node list", perMoved, perGet, list)
	}
	want := []string{a.id, b.id}
	for _, r := range moved {
		if !slices.Equal(r.Job.Nodes, want) {
			t.Fatalf("sent %s with nodes %v, want %v", r.Job.ID, r.Job.Nodes, want)
		}
	}
	once := a.broker.AddJobs([]queue.AddRequest{{Queue: "z", Body: []byte("once"), TTL: 3600, Replicate: 1}})[0]
	if once.Err != nil {
		t.Fatal(once.Err)
	}
	give, err := a.broker.RemoteNeedJobs(b.id, "z", 5)
	if err != nil || len(give) != 1 || !slices.Equal(give[0].Job.Nodes, want) || a.state(t, once.ID) != "" {
		t.Fatalf("at-most-once: gave %+v, %v; A's copy %q", give, err, a.state(t, once.ID))
	}
	c.close(a)
	c.open(a)
	for _, r := range moved {
		j := a.job(t, r.Job.ID)
		if j == nil || j.State != storage.StateActive || j.Deliveries != 1 || !slices.Equal(j.Nodes, want) {
			t.Fatalf("A's copy of %s after a restart: %+v", r.Job.ID, j)
		}
	}
}

// ackCollected acks ids on node on and waits until none of nodes holds a
// copy of them: the ack collection reached every holder.
func ackCollected(t *testing.T, on *jobsNode, ids []string, nodes ...*jobsNode) {
	t.Helper()
	if _, err := on.broker.Ack(ids); err != nil {
		t.Fatal(err)
	}
	eventually(t, "every copy collected", func() bool {
		for _, id := range ids {
			for _, nd := range nodes {
				if nd.state(t, id) != "" {
					return false
				}
			}
		}
		return true
	})
}
