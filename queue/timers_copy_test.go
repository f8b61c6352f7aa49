package queue

import (
	"strings"
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
