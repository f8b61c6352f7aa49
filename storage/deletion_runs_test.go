package storage

import (
	"errors"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestConsumedHeadIsRangeDeleted: a queue's head delivered and deleted once
// Pebble holds it reaches Pebble as a few range deletions (its queue keys,
// and its TTL events, which lie together in the schedule), not a point
// tombstone per key; the jobs left queued in the middle of that head (every
// 50th) stay queued and readable, before and after a reopen.
func TestConsumedHeadIsRangeDeleted(t *testing.T) {
	fs := vfs.NewMem()
	s := mustOpen(t, fs)
	const n = 400
	var ids []string
	kept := map[string]bool{}
	for i := range n {
		j := newTestJob(s.NodeID(), "q", 1e15+uint64(i)*1e6, 60)
		if err := s.Add(j, []byte("body")); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, j.ID)
		if i%50 == 25 {
			kept[j.ID] = true
		}
	}
	if err := s.Checkpoint(); err != nil { // Pebble holds the jobs now
		t.Fatal(err)
	}
	before := s.Stats()
	b := s.NewBatch()
	for _, id := range ids {
		if !kept[id] {
			b.Deliver(id, 0)
			b.Delete(id)
		}
	}
	for i, r := range s.Commit(b) {
		if r.Err != nil {
			t.Fatalf("op %d: %v", i, r.Err)
		}
	}
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	ranged, ranges := st.RangedDeletions-before.RangedDeletions, st.DeletionRanges-before.DeletionRanges
	// Queue keys and TTL events of the n-len(kept) deleted jobs, in runs
	// cut by the kept ones: len(kept)+1 runs in each family.
	if want := int64(2 * (n - len(kept))); ranged != want {
		t.Errorf("%d deletions given as ranges, want %d (every queue key and TTL event)", ranged, want)
	}
	if max := int64(2 * (len(kept) + 1)); ranges == 0 || ranges > max {
		t.Errorf("%d ranges, want 1..%d", ranges, max)
	}
	check := func(s *Store) {
		t.Helper()
		if got := s.QueueLen("q"); got != int64(len(kept)) {
			t.Errorf("QueueLen %d, want %d", got, len(kept))
		}
		pos, err := s.QueueRange("q", QueuePos{}, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if len(pos) != len(kept) {
			t.Errorf("QueueRange holds %d jobs, want %d", len(pos), len(kept))
		}
		for _, p := range pos {
			if !kept[p.ID] {
				t.Errorf("QueueRange holds %s, which was deleted", p.ID)
			}
		}
		for _, id := range ids {
			j, err := s.Job(id)
			switch {
			case kept[id] && (err != nil || j.State != StateQueued):
				t.Errorf("kept job %s: %v, %v", id, j, err)
			case !kept[id] && !errors.Is(err, ErrNotFound):
				t.Errorf("deleted job %s: %v, %v", id, j, err)
			}
		}
		evs, err := s.DueEvents(1<<62, Event{}, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) != len(kept) { // each kept job's TTL event
			t.Errorf("%d schedule events, want %d: %v", len(evs), len(kept), evs)
		}
	}
	check(s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, fs)
	defer s.Close()
	check(s)
}
