package storage

import (
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// spanScenario: 40 jobs of queue q in Pebble, and x, whose ctime sorts
// between the 11th and the 12th, delivered (so not queued) and its
// deletion flushed too.
func spanScenario(t *testing.T) (s *Store, as []*Job, x *Job) {
	t.Helper()
	s = mustOpen(t, vfs.NewMem())
	self := s.NodeID()
	for i := range 40 {
		j := newTestJob(self, "q", uint64(1000+100*i), 60)
		if err := s.Add(j, []byte("body")); err != nil {
			t.Fatal(err)
		}
		as = append(as, j)
	}
	x = newTestJob(self, "q", 1000+100*10+50, 60)
	if err := s.Add(x, []byte("body")); err != nil {
		t.Fatal(err)
	}
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Deliver(x.ID, 9000); err != nil {
		t.Fatal(err)
	}
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	return s, as, x
}

func deliverAll(t *testing.T, s *Store, jobs []*Job) {
	t.Helper()
	b := s.NewBatch()
	for _, j := range jobs {
		b.DeliverAt(j.Queue, QueuePos{Ctime: j.Ctime, ID: j.ID}, func(*Job) int64 { return 9000 })
	}
	for k, r := range s.Commit(b) {
		if r.Err != nil {
			t.Fatalf("delivery %d: %v", k, r.Err)
		}
	}
}

func queued(t *testing.T, s *Store) []QueuePos {
	t.Helper()
	got, err := s.QueueRange("q", QueuePos{}, 100)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestDeletionRunsFromARefillsSpan: deletions of keys a refill read since
// the last flush are cut into runs from what it read, without walking
// Pebble, and delete exactly those keys.
func TestDeletionRunsFromARefillsSpan(t *testing.T) {
	s, as, _ := spanScenario(t)
	defer s.Close()
	if got, err := s.QueueHead("q", QueuePos{}, 100); err != nil || len(got) != 40 {
		t.Fatalf("refill: %d entries, %v", len(got), err)
	}
	used, ranged := s.buf.spanRunsUsed, s.Stats().RangedDeletions
	deliverAll(t, s, as[:30])
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	if s.buf.spanRunsUsed == used {
		t.Fatal("the deletions' runs were walked, not cut from the refill's span")
	}
	if n := s.Stats().RangedDeletions - ranged; n < 30 {
		t.Fatalf("%d deletions went in ranges, want the 30 deliveries' queue keys", n)
	}
	got := queued(t, s)
	if len(got) != 10 || got[0].ID != as[30].ID {
		t.Fatalf("queued after the deliveries: %v", got)
	}
}

// TestDeletionRunsAfterAFlushWalkPebble: a refill's span is forgotten at
// the next flush, which may write keys inside it — here x, NACKed after
// the refill and so queued again at its old ctime, between the jobs the
// refill read. The deliveries of all of those, flushed later, must leave
// x's queue key alone: a range cut from the stale span would delete it,
// and x would be lost from its queue.
func TestDeletionRunsAfterAFlushWalkPebble(t *testing.T) {
	s, as, x := spanScenario(t)
	defer s.Close()
	if got, err := s.QueueHead("q", QueuePos{}, 100); err != nil || len(got) != 40 {
		t.Fatalf("refill: %d entries, %v", len(got), err)
	}
	if _, err := s.Nack(x.ID, 9000, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.Checkpoint(); err != nil { // x's queue key reaches Pebble
		t.Fatal(err)
	}
	deliverAll(t, s, as)
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	if got := queued(t, s); len(got) != 1 || got[0].ID != x.ID {
		t.Fatalf("queued after the deliveries: %v, want x (%s) alone", got, x.ID)
	}
	if j, err := s.Job(x.ID); err != nil || j.State != StateQueued {
		t.Fatalf("x: %+v, %v", j, err)
	}
}
