package storage

import (
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestJobReadByIDThenAckedReadsPebbleOnce: a clustered ACKJOB reads the job
// by id to decide (acked already? only this node's?) and then applies the
// ack, whose resolve reads it again. For a job only Pebble holds, the first
// read's Get leaves it in the job cache, so the ack costs no second one.
func TestJobReadByIDThenAckedReadsPebbleOnce(t *testing.T) {
	fs := vfs.NewMem()
	s := mustOpen(t, fs)
	j := newTestJob(s.NodeID(), "q", 1e15, 60)
	if err := s.Add(j, []byte("body")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Deliver(j.ID, 1<<40); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil { // checkpoints: Pebble holds the job
		t.Fatal(err)
	}
	s = mustOpen(t, fs) // with an empty cache and buffer
	defer s.Close()
	before := s.Stats().IndexGets
	got, err := s.Job(j.ID)
	if err != nil || got.State != StateActive {
		t.Fatalf("Job: %+v, %v", got, err)
	}
	if n := s.Stats().IndexGets - before; n != 1 {
		t.Fatalf("Job of a job only Pebble holds made %d Gets, want 1", n)
	}
	acked, err := s.Ack(j.ID)
	if err != nil || acked.State != StateAcked {
		t.Fatalf("Ack: %+v, %v", acked, err)
	}
	if n := s.Stats().IndexGets - before; n != 1 {
		t.Errorf("Job then Ack made %d Pebble Gets, want 1 (the ack's resolve read it again)", n)
	}
	if again, err := s.Job(j.ID); err != nil || again.State != StateAcked {
		t.Errorf("Job after the ack: %+v, %v", again, err)
	}
}

// TestJobReadIsCachedOnlyIfNothingChangedSince: the job Job read from
// Pebble after releasing the lock goes to the cache only if no write of it
// and no buffer flush happened in between; otherwise the cache would hold
// a state older than the index's.
func TestJobReadIsCachedOnlyIfNothingChangedSince(t *testing.T) {
	fs := vfs.NewMem()
	s := mustOpen(t, fs)
	j := newTestJob(s.NodeID(), "q", 1e15, 60)
	if err := s.Add(j, []byte("body")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, fs)
	defer s.Close()
	stale, err := s.getJob(s.db, j.ID) // what a Job racing the writes below read
	if err != nil || stale == nil || stale.State != StateQueued {
		t.Fatalf("getJob: %+v, %v", stale, err)
	}
	cached := func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		_, ok := s.cache.get(j.ID)
		return ok
	}
	s.mu.Lock()
	flushes := s.buf.flushes
	s.mu.Unlock()

	// A write of the job in between, not flushed: the buffer knows it
	// (and the cache has its new state, which must stay).
	if _, err := s.Deliver(j.ID, 1<<40); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	s.cache.drop(j.ID) // as if evicted: the buffer alone knows the write
	s.mu.Unlock()
	s.cacheRead(stale, flushes)
	if cached() {
		t.Fatal("a read older than a buffered write of the job was cached")
	}
	// The write flushed in between: the buffer no longer knows it.
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	s.cacheRead(stale, flushes)
	if cached() {
		t.Fatal("a read older than a flush was cached")
	}
	if got, err := s.Job(j.ID); err != nil || got.State != StateActive {
		t.Fatalf("Job after the delivery: %+v, %v", got, err)
	}
	// Nothing in between: cached.
	if !cached() {
		t.Error("a job read from Pebble with nothing written since was not cached")
	}
}
