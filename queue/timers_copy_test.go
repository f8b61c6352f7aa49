package queue

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/diskque/diskque/storage"
)

// The requeue of a copy this node never delivered (a replica's, after its
// RETRY) is two records in one timer batch: the requeue and the bump of
// additional-deliveries that every holder's requeue counts. A GETJOB
// blocked on the queue takes the job as soon as the requeue is handled:
// it is delivered, active again, with a new retry event. Handling the
// bump's result afterwards, with the job as the bump left it (queued),
// replaced the delivered job's events by a queued job's, none: its retry
// was lost, and the copy stayed active, delivered once and never
// requeued, until its TTL (the checker's NotCollected, seed 9 with
// partitions: the copy, acked elsewhere by a collection that never knew
// it, was never delivered again to be acked here).
func TestRequeuedCopyHandedToAWaiterKeepsItsRetry(t *testing.T) {
	f := newFixture(t, 100)
	now := f.clock.ms.Load()
	origin := strings.Repeat("b", 40)
	id := storage.NewJobID(origin, 3600, 1)
	copyOf := &storage.Job{ID: id, Queue: "q", Ctime: uint64(now) * 1_000_000, Etime: now + 3_600_000,
		Retry: 1, Repl: 2, Nodes: []string{origin, f.b.NodeID()}}
	if errs := f.b.ReplicaAdd([]Replica{{Job: copyOf, Body: []byte("copy")}}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	got := f.blockedGet(GetRequest{Queues: []string{"q"}, Count: 1, Timeout: time.Minute})

	// Past the copy's requeue (RETRY 1 s ± 500 ms after it arrived): the
	// timer requeues it and hands it to the GETJOB.
	if err := f.b.Tick(f.clock.advance(2 * time.Second)); err != nil {
		t.Fatal(err)
	}
	select {
	case d := <-got:
		if len(d) != 1 || d[0].ID != id {
			t.Fatalf("the GETJOB got %v, want the copy", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the requeued copy never reached the blocked GETJOB")
	}
	j, err := f.st.Job(id)
	if err != nil {
		t.Fatal(err)
	}
	if j.State != storage.StateActive || j.AdditionalDeliveries != 1 {
		t.Fatalf("after its delivery the copy is %v with additional-deliveries %d, want active and 1", j.State, j.AdditionalDeliveries)
	}
	f.b.mu.Lock()
	held := f.b.wheel.Holds(id, storage.EventRetry)
	f.b.mu.Unlock()
	if !held {
		t.Errorf("the delivered copy has no retry event in the wheel (its requeue at %d is lost)", j.QueueTime)
	}

	// Not acked: requeued again at its RETRY after the delivery.
	if err := f.b.Tick(f.clock.advance(2 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if j, err = f.st.Job(id); err != nil {
		t.Fatal(err)
	}
	if j.State != storage.StateQueued {
		t.Fatalf("2 s after its delivery the copy (RETRY 1) is %v, want queued again", j.State)
	}
}

// TestEnqueuedCopyHandedToAWaiterKeepsItsRetry: ENQUEUE of a copy other
// nodes hold is the same two records (the queueing, then the bump of
// additional-deliveries), and a blocked GETJOB takes the job between
// their results: the delivered copy must keep its retry event.
func TestEnqueuedCopyHandedToAWaiterKeepsItsRetry(t *testing.T) {
	f := newFixture(t, 100)
	now := f.clock.ms.Load()
	origin := strings.Repeat("b", 40)
	id := storage.NewJobID(origin, 3600, 1)
	copyOf := &storage.Job{ID: id, Queue: "q", Ctime: uint64(now) * 1_000_000, Etime: now + 3_600_000,
		Retry: 1, Repl: 2, Nodes: []string{origin, f.b.NodeID()}}
	if errs := f.b.ReplicaAdd([]Replica{{Job: copyOf, Body: []byte("copy")}}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	got := f.blockedGet(GetRequest{Queues: []string{"q"}, Count: 1, Timeout: time.Minute})
	if n, err := f.b.Enqueue([]string{id}); err != nil || n != 1 {
		t.Fatalf("ENQUEUE: %d, %v", n, err)
	}
	select {
	case d := <-got:
		if len(d) != 1 || d[0].ID != id {
			t.Fatalf("the GETJOB got %v, want the copy", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the enqueued copy never reached the blocked GETJOB")
	}
	f.b.mu.Lock()
	held := f.b.wheel.Holds(id, storage.EventRetry)
	f.b.mu.Unlock()
	if !held {
		t.Error("the delivered copy has no retry event in the wheel")
	}
	if err := f.b.Tick(f.clock.advance(2 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if j, err := f.st.Job(id); err != nil || j.State != storage.StateQueued {
		t.Fatalf("2 s after its delivery the copy (RETRY 1) is %+v (%v), want queued again", j, err)
	}
}

// recCluster is a node of a cluster as the broker's timers see it: other
// nodes exist (Clustered, so WILLQUEUE companions are scheduled), and the
// WILLQUEUE and QUEUED it would send are counted per job.
type recCluster struct {
	loneNode
	mu        sync.Mutex
	willQueue map[string]int
	queued    map[string]int
}

func (c *recCluster) KnownNodes() int { return 3 }

func (c *recCluster) WillQueue(jobs []*storage.Job) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, j := range jobs {
		c.willQueue[j.ID]++
	}
}

func (c *recCluster) Queued(jobs []QueuedJob) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, q := range jobs {
		c.queued[q.Job.ID]++
	}
}

// TestCursorMovedBackRefiresNothing settles whether the wheel bound's
// cursor move can make an event fire twice. A full wheel moves the loader's
// cursor back before an event that arrives (syncTimersLocked), so the next
// chunk's loader reads the schedule again from there, events the wheel
// fired already included in range. It cannot bring one back: a fired
// event's op changed its job in the same lock hold (a requeued copy has no
// retry event left on disk), and a WILLQUEUE companion is made only with a
// retry event the wheel does not hold yet, which it holds until the retry
// fires. Copies of a cluster's jobs arrive while the timers fire in small
// chunks under a small MaxTimers: each announces its requeue once
// (WILLQUEUE) and is requeued once (QUEUED), and the cursor did move back.
func TestCursorMovedBackRefiresNothing(t *testing.T) {
	const maxTimers, copies, perHook = 40, 200, 8
	rc := &recCluster{willQueue: map[string]int{}, queued: map[string]int{}}
	f := newFixture(t, 64)
	f.mod = func(o *Options) { o.MaxTimers, o.Cluster = maxTimers, rc }
	f.restart()
	f.b.fireChunk = 8
	origin := strings.Repeat("b", 40)
	var ids []string
	var expired []string
	// addCopies adds n copies, and late more that expired on their way (a
	// REPLJOB resent after a partition near the job's TTL): their TTL
	// events, due already, fill the wheel, and the first that finds it
	// full moves the cursor back before every event this Tick fired.
	addCopies := func(n, late int) {
		now := f.clock.ms.Load()
		reps := make([]Replica, n, n+late)
		for i := range reps {
			id := storage.NewJobID(origin, 3600, 1)
			ids = append(ids, id)
			reps[i] = Replica{Job: &storage.Job{ID: id, Queue: "q", Ctime: uint64(now)*1_000_000 + uint64(len(ids)),
				Etime: now + 3_600_000, Retry: 1, Repl: 2, Nodes: []string{origin, f.b.NodeID()}}, Body: []byte("c")}
		}
		for range late {
			id := storage.NewJobID(origin, 60, 1)
			expired = append(expired, id)
			reps = append(reps, Replica{Job: &storage.Job{ID: id, Queue: "q", Ctime: uint64(now-60_000)*1_000_000 + uint64(len(expired)),
				Etime: now - 5_000, Retry: 1, Repl: 2, Nodes: []string{origin, f.b.NodeID()}}, Body: []byte("late")})
		}
		for _, err := range f.b.ReplicaAdd(reps) {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := f.b.Tick(f.clock.ms.Load()); err != nil {
		t.Fatal(err)
	}
	addCopies(copies, 0)
	cursor := func() int64 {
		f.b.mu.Lock()
		defer f.b.mu.Unlock()
		return f.b.cursor.Due
	}
	// movedBack: the copies added between chunks moved the cursor back
	// before events the wheel had fired already (due by the Tick's now).
	movedBack := 0
	f.b.testChunkHook = func(int) {
		if len(ids) >= 3*copies {
			return
		}
		before := cursor()
		addCopies(perHook, perHook) // arrive between chunks, the wheel full
		if c := cursor(); c < before && c < f.clock.ms.Load() {
			movedBack++
		}
	}
	// Ticks every 100 ms until every copy is queued.
	for step := 0; f.st.QueueLen("q") < int64(len(ids)); step++ {
		if step > 400 {
			t.Fatalf("after 40 s %d of %d copies queued", f.st.QueueLen("q"), len(ids))
		}
		if err := f.b.Tick(f.clock.advance(100 * time.Millisecond)); err != nil {
			t.Fatal(err)
		}
	}
	if movedBack == 0 {
		t.Fatal("the cursor never moved back: the test did not test the move")
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, id := range ids {
		if rc.willQueue[id] != 1 || rc.queued[id] != 1 {
			t.Errorf("copy %s: %d WILLQUEUE and %d QUEUED, want one each", id, rc.willQueue[id], rc.queued[id])
		}
	}
	for _, id := range expired {
		if _, err := f.st.Job(id); !errors.Is(err, storage.ErrNotFound) {
			t.Errorf("the copy %s that expired on its way is still held (err %v)", id, err)
		}
	}
	t.Logf("%d copies, the cursor moved back before fired events %d times", len(ids), movedBack)
}
