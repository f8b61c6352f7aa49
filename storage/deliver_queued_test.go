package storage

import (
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestDeliverQueuedTrustsOnlyAnUnchangedStore: a delivery of the jobs a
// QueuedJobs returned (Batch.DeliverQueued) takes them as they were read
// only while the store has applied nothing since; after any write (here a
// DEQUEUE of one of them) it reads them again, and the dequeued job is
// refused rather than delivered from its stale queued state.
func TestDeliverQueuedTrustsOnlyAnUnchangedStore(t *testing.T) {
	s := mustOpen(t, vfs.NewMem())
	defer s.Close()
	self := s.NodeID()
	var entries []QueueEntry
	for i := range 4 {
		j := newTestJob(self, "q", uint64(1_000_000_000+i), 60)
		if err := s.Add(j, []byte("body")); err != nil {
			t.Fatal(err)
		}
		entries = append(entries, QueueEntry{Queue: "q", Pos: QueuePos{Ctime: j.Ctime, ID: j.ID}})
	}
	qtime := func(*Job) int64 { return 9000 }
	deliver := func(jobs []*Job, m WriteMark) []Result {
		t.Helper()
		b := s.NewBatch()
		for _, j := range jobs {
			b.DeliverQueued(j, m, qtime, nil)
		}
		return s.Commit(b)
	}

	// Unchanged since the read: both delivered.
	jobs, mark, err := s.QueuedJobs(entries[:2])
	if err != nil {
		t.Fatal(err)
	}
	for k, r := range deliver(jobs, mark) {
		if r.Err != nil || r.Job.State != StateActive {
			t.Fatalf("delivery %d: %+v", k, r)
		}
	}

	// A write since the read: the dequeued job is not delivered.
	jobs, mark, err = s.QueuedJobs(entries[2:])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Dequeue(entries[2].Pos.ID); err != nil {
		t.Fatal(err)
	}
	res := deliver(jobs, mark)
	if res[0].Err == nil {
		t.Fatalf("a job dequeued after the read was delivered: %+v", res[0].Job)
	}
	if res[1].Err != nil || res[1].Job.State != StateActive {
		t.Fatalf("the other job: %+v", res[1])
	}
	if j, err := s.Job(entries[2].Pos.ID); err != nil || j.State == StateActive && j.Deliveries > 0 {
		t.Fatalf("dequeued job after the batch: %+v, %v", j, err)
	}
}
