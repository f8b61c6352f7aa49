package replication

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
)

// testClock is the clock of an in-process cluster: it moves only when the
// test says, so a RETRY passes in no real time and each node's timers fire
// when the test calls Tick (the brokers' Run loops tick with it too).
type testClock struct {
	mu sync.Mutex
	t  time.Time
}

func newTestClock() *testClock {
	return &testClock{t: time.UnixMilli(1_800_000_000_000)}
}

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *testClock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	return c.t
}

// tickAll fires every node's due timers at the clock's time.
func (c *testCluster) tickAll(clock *testClock) {
	c.t.Helper()
	now := clock.Now().UnixMilli()
	for _, nd := range c.nodes {
		if nd.st == nil {
			continue
		}
		if err := nd.broker.Tick(now); err != nil {
			c.t.Fatal(err)
		}
	}
}

// job returns node nd's copy of id (nil if it has none).
func (nd *jobsNode) job(t *testing.T, id string) *storage.Job {
	t.Helper()
	j, err := nd.st.Job(id)
	if err != nil {
		return nil
	}
	return j
}

// queuedOn returns the nodes (of those open) that have id queued.
func (c *testCluster) queuedOn(id string) []int {
	var on []int
	for i, nd := range c.nodes {
		if nd.st == nil {
			continue
		}
		if j, err := nd.st.Job(id); err == nil && j.State == storage.StateQueued {
			on = append(on, i)
		}
	}
	return on
}

// settled reports whether no open node has a timer of id due: each has it
// queued (a queued copy has no requeue timer) or its requeue after now. From
// then on copies only leave queues (QUEUED, WORKING), none joins one.
func (c *testCluster) settled(id string, now time.Time) bool {
	for _, nd := range c.nodes {
		if nd.st == nil {
			continue
		}
		j, err := nd.st.Job(id)
		if err != nil {
			return false
		}
		if j.State != storage.StateQueued && j.QueueTime <= now.UnixMilli() {
			return false
		}
	}
	return true
}

func getOne(t *testing.T, nd *jobsNode, q string) queue.Delivered {
	t.Helper()
	got, err := nd.broker.GetJobs(context.Background(), queue.GetRequest{Queues: []string{q}, Count: 1, NoHang: true})
	if err != nil || len(got) != 1 {
		t.Fatalf("GETJOB on %s: %v, %d jobs", nd.id[:8], err, len(got))
	}
	return got[0]
}

// TestOneCopyQueuedAfterRetry: jobs replicated to 3 nodes, delivered at the
// origin and never acked: once their RETRY passed on every node, exactly
// one node has each queued (WILLQUEUE, QUEUED and the tie-break), and every
// copy counts the same additional deliveries.
func TestOneCopyQueuedAfterRetry(t *testing.T) {
	clock := newTestClock()
	c := newTestClusterClock(t, 3, -1, clock.Now)
	const jobs = 8
	var ids []string
	for range jobs {
		res := addJob(t, c.nodes[0], queue.AddRequest{Replicate: 3, Retry: 1})
		if res.Err != nil {
			t.Fatal(res.Err)
		}
		ids = append(ids, res.ID)
		getOne(t, c.nodes[0], "q")
	}
	// RETRY 1 s ± 500 ms: past every holder's requeue time.
	now := clock.Advance(1600 * time.Millisecond)
	c.tickAll(clock)
	for _, id := range ids {
		eventually(t, "every holder's timer of "+id+" done", func() bool { return c.settled(id, now) })
		eventually(t, "one queued copy of "+id, func() bool { return len(c.queuedOn(id)) == 1 })
		var counts []uint32
		for _, nd := range c.nodes {
			counts = append(counts, nd.job(t, id).AdditionalDeliveries)
		}
		eventually(t, "agreeing counters", func() bool {
			for i, nd := range c.nodes {
				counts[i] = nd.job(t, id).AdditionalDeliveries
			}
			return counts[0] >= 1 && counts[0] == counts[1] && counts[1] == counts[2]
		})
	}
	for _, id := range ids {
		if on := c.queuedOn(id); len(on) != 1 {
			t.Fatalf("job %s queued on nodes %v after the settle, want exactly one", id, on)
		}
	}
	// The requeues were announced to the other holders (QUEUED), by
	// whichever nodes queued them: which one wins depends on the
	// tie-break and on the goroutines' order, so asking it of one given
	// node failed 2 runs in 10 under -race. (One message carries every job
	// a node queued in a tick.)
	var sent int64
	for _, nd := range c.nodes {
		sent += nd.jobs.Stats().QueuedSent
	}
	if sent == 0 {
		t.Fatal("no node announced its requeues with QUEUED")
	}
}

// TestWillQueueAnsweredByTheQueuedCopy: a replica whose requeue is near
// sends WILLQUEUE; the origin, which has the job queued, answers QUEUED, so
// the replica postpones its requeue and never queues a second copy.
func TestWillQueueAnsweredByTheQueuedCopy(t *testing.T) {
	clock := newTestClock()
	c := newTestClusterClock(t, 2, -1, clock.Now)
	res := addJob(t, c.nodes[0], queue.AddRequest{Replicate: 2, Retry: 2})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	id := res.ID
	rep := c.nodes[1]
	qt := rep.job(t, id).QueueTime
	// Inside the WILLQUEUE advance, before the requeue.
	clock.Advance(time.Duration(qt-clock.Now().UnixMilli()-400) * time.Millisecond)
	c.tickAll(clock)
	if s := rep.jobs.Stats(); s.WillQueuesSent != 1 {
		t.Fatalf("WILLQUEUE messages sent: %d, want 1", s.WillQueuesSent)
	}
	eventually(t, "the replica's requeue postponed", func() bool { return rep.job(t, id).QueueTime > qt })
	// Past the replica's first requeue time: nothing is due any more.
	clock.Advance(time.Second)
	c.tickAll(clock)
	if on := c.queuedOn(id); len(on) != 1 || on[0] != 0 {
		t.Fatalf("queued on %v, want only on the origin", on)
	}
	if j := rep.job(t, id); j.AdditionalDeliveries != 0 || j.Nacks != 0 {
		t.Fatalf("an answer to WILLQUEUE bumped counters: %+v", j)
	}
}

// TestQueuedCopyHolderDies: the node that has the job queued dies; the
// others requeue it after RETRY, and one of them keeps it queued.
func TestQueuedCopyHolderDies(t *testing.T) {
	clock := newTestClock()
	c := newTestClusterClock(t, 3, -1, clock.Now)
	res := addJob(t, c.nodes[0], queue.AddRequest{Replicate: 3, Retry: 1})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	c.close(c.nodes[0])
	c.setDown(c.nodes[0].id, true)
	now := clock.Advance(1600 * time.Millisecond)
	c.tickAll(clock)
	eventually(t, "the survivors' timers done", func() bool { return c.settled(res.ID, now) })
	eventually(t, "one queued copy", func() bool { return len(c.queuedOn(res.ID)) == 1 })
	d := getOne(t, c.nodes[c.queuedOn(res.ID)[0]], "q")
	if d.ID != res.ID || string(d.Body) != "body" {
		t.Fatalf("delivered %+v", d)
	}
}

// TestWorkingPostponesEveryHolder: WORKING at the node that delivered the
// job postpones every holder's requeue, so no copy is queued when the
// RETRY after the delivery passes.
func TestWorkingPostponesEveryHolder(t *testing.T) {
	clock := newTestClock()
	c := newTestClusterClock(t, 3, -1, clock.Now)
	res := addJob(t, c.nodes[0], queue.AddRequest{Replicate: 3, Retry: 2})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	getOne(t, c.nodes[0], "q")
	before := map[int]int64{}
	for i, nd := range c.nodes {
		before[i] = nd.job(t, res.ID).QueueTime
	}
	clock.Advance(time.Second)
	if retry, err := c.nodes[0].broker.Working(res.ID); err != nil || retry != 2 {
		t.Fatalf("WORKING: %d, %v", retry, err)
	}
	for i, nd := range c.nodes[1:] {
		eventually(t, "a replica's requeue postponed", func() bool { return nd.job(t, res.ID).QueueTime > before[i+1] })
	}
	// Past every original requeue time (≤ 2.5 s), before the new ones
	// (≥ 1 s + 1.5 s).
	clock.Advance(1400 * time.Millisecond)
	c.tickAll(clock)
	if on := c.queuedOn(res.ID); len(on) != 0 {
		t.Fatalf("queued on %v while a consumer works on it", on)
	}
	// And WORKING dequeues a copy queued elsewhere.
	clock.Advance(2 * time.Second)
	c.tickAll(clock)
	eventually(t, "a requeued copy", func() bool { return len(c.queuedOn(res.ID)) == 1 })
	on := c.queuedOn(res.ID)[0]
	other := c.nodes[(on+1)%3]
	if _, err := other.broker.Working(res.ID); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the queued copy dequeued by WORKING", func() bool { return len(c.queuedOn(res.ID)) == 0 })
}

// TestNackCountsOnEveryHolder: a NACK at the origin shows nacks=1 on the
// replicas too (SHOW), and they postpone their requeue.
func TestNackCountsOnEveryHolder(t *testing.T) {
	clock := newTestClock()
	c := newTestClusterClock(t, 3, -1, clock.Now)
	res := addJob(t, c.nodes[0], queue.AddRequest{Replicate: 3, Retry: 3})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	getOne(t, c.nodes[0], "q")
	qt := c.nodes[1].job(t, res.ID).QueueTime
	clock.Advance(time.Second)
	if n, err := c.nodes[0].broker.Nack([]string{res.ID}, 0); err != nil || n != 1 {
		t.Fatalf("NACK: %d, %v", n, err)
	}
	for _, nd := range c.nodes[1:] {
		eventually(t, "nacks=1 on a replica", func() bool {
			j := nd.job(t, res.ID)
			return j.Nacks == 1 && j.QueueTime > qt-500
		})
	}
	if on := c.queuedOn(res.ID); len(on) != 1 || on[0] != 0 {
		t.Fatalf("queued on %v, want the origin only", on)
	}
	if d := getOne(t, c.nodes[0], "q"); d.Nacks != 1 {
		t.Fatalf("GETJOB WITHCOUNTERS at the origin: nacks %d", d.Nacks)
	}
	// ENQUEUE elsewhere: one more additional delivery on every holder.
	if n, err := c.nodes[2].broker.Enqueue([]string{res.ID}); err != nil || n != 1 {
		t.Fatalf("ENQUEUE: %d, %v", n, err)
	}
	for _, nd := range c.nodes {
		eventually(t, "additional-deliveries=1 everywhere", func() bool { return nd.job(t, res.ID).AdditionalDeliveries == 1 })
	}
}

// TestPauseBroadcastReachesEveryNode: PAUSE … BCAST sets the state on every
// node, and receivers do not send it on.
func TestPauseBroadcastReachesEveryNode(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	for _, want := range []storage.PauseState{storage.PauseAll, storage.PauseNone} {
		if _, err := c.nodes[0].broker.Pause("pq", want); err != nil {
			t.Fatal(err)
		}
		c.nodes[0].broker.BroadcastPause("pq", want)
		for _, nd := range c.nodes {
			eventually(t, "pause "+want.String()+" on every node", func() bool { return nd.broker.PauseState("pq") == want })
		}
	}
	for _, nd := range c.nodes[1:] {
		if s := nd.jobs.Stats(); s.PausesSent != 0 {
			t.Fatalf("a receiver sent PAUSE on: %+v", s)
		}
	}
	if s := c.nodes[0].jobs.Stats(); s.PausesSent != 4 {
		t.Fatalf("PAUSE messages sent: %d, want 2 × 2", s.PausesSent)
	}
}

// TestQueuedForAnAckedJobGetsSetAck: a node that queues a job another node
// has acked is told so (SETACK) and acks its copy.
func TestQueuedForAnAckedJobGetsSetAck(t *testing.T) {
	clock := newTestClock()
	c := newTestClusterClock(t, 2, -1, clock.Now)
	res := addJob(t, c.nodes[0], queue.AddRequest{Replicate: 2, Retry: 1})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	// The ack's SETACK is lost: node 1 never hears of it.
	c.net.Cut(c.nodes[0].id, c.nodes[1].id)
	if _, err := c.nodes[0].broker.Ack([]string{res.ID}); err != nil {
		t.Fatal(err)
	}
	c.net.Heal(c.nodes[0].id, c.nodes[1].id)
	clock.Advance(1600 * time.Millisecond)
	c.tickAll(clock)
	eventually(t, "node 1's copy acked", func() bool { return c.nodes[1].state(t, res.ID) == "acked" || c.nodes[1].state(t, res.ID) == "" })
}

// TestTieBreak: Disque's order of two nodes for a job.
func TestTieBreak(t *testing.T) {
	id := storage.NewJobID(strings.Repeat("a", 40), 3600, 60)
	a, b := strings.Repeat("0", 40), strings.Repeat("f", 40)
	if queue.TieBreak(a, a, id) != 0 {
		t.Fatal("a node is not equal to itself")
	}
	if x, y := queue.TieBreak(a, b, id), queue.TieBreak(b, a, id); x == 0 || x != -y {
		t.Fatalf("not antisymmetric: %d, %d", x, y)
	}
	// The first differing byte decides, after the XOR with the id's
	// random characters: id[11] for byte 0.
	k := id[11]
	want := -1
	if '0'^k > 'f'^k {
		want = 1
	}
	if got := queue.TieBreak(a, b, id); got != want {
		t.Fatalf("TieBreak = %d, want %d (key byte %q)", got, want, k)
	}
	// Not plain string order: with a key byte that flips the order of two
	// ids, the XOR decides.
	x, y := "1"+strings.Repeat("0", 39), "2"+strings.Repeat("0", 39)
	fake := id[:11] + "3" + id[12:] // '1'^'3' = 2 > '2'^'3' = 1
	if queue.TieBreak(x, y, fake) != 1 {
		t.Fatalf("TieBreak(%s, %s) = %d, want 1", x[:1], y[:1], queue.TieBreak(x, y, fake))
	}
}

// TestSetAckToIsUnderstood: the SETACK a node answers a WILLQUEUE, QUEUED
// or WORKING with, for a job it has acked, is a well-formed SETACK (with
// mayhave): it was sent with an ids-only payload, which every receiver
// dropped as malformed. With no ack-retry loop, only it can ack the copy.
func TestSetAckToIsUnderstood(t *testing.T) {
	c := newTestCluster(t, 2, -1)
	res := addJob(t, c.nodes[0], queue.AddRequest{Replicate: 2, Retry: 60})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	c.net.Cut(c.nodes[0].id, c.nodes[1].id) // the ACKJOB's own SETACK is lost
	if _, err := c.nodes[0].broker.Ack([]string{res.ID}); err != nil {
		t.Fatal(err)
	}
	c.net.Heal(c.nodes[0].id, c.nodes[1].id)
	c.nodes[0].jobs.setAckTo(c.nodes[1].id, []string{res.ID})
	eventually(t, "node 1's copy acked", func() bool { s := c.nodes[1].state(t, res.ID); return s == "acked" || s == "" })
	if n := c.nodes[1].jobs.Stats().BadPayloads; n != 0 {
		t.Fatalf("node 1 dropped %d malformed payloads", n)
	}
}
