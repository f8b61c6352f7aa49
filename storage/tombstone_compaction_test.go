package storage

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/wal"
)

// TestConsumedBacklogIsNotRewrittenForItsTombstones: a backlog Pebble holds
// in its bottom level, consumed, leaves a point tombstone per job key in the
// tables its flushes write to L0 — tombstone-dense tables that overlap the
// whole backlog (job keys are random). Pebble's tombstone-density compaction
// would rewrite the backlog's tables with each of them; the store turns it
// off (store.go), so the tombstones wait in L0 for the next L0 compaction.
//
// The check of an absence needs a window: once Pebble has loaded the new
// tables' statistics (which is what makes them candidates) the test watches
// the compaction counts for a second, ten times the compaction gate's
// period (compaction_gate.go). With Pebble's default the compaction starts
// within a few milliseconds of the statistics.
func TestConsumedBacklogIsNotRewrittenForItsTombstones(t *testing.T) {
	opts := TestingOptions()
	opts.FS = vfs.Default
	opts.Sync = wal.SyncNever
	opts.WriteBufferSize = 256 << 10
	opts.JobCacheSize = -1
	s, err := Open(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const n = 20000
	var ids []string
	b := s.NewBatch()
	for i := range n {
		j := newTestJob(s.NodeID(), "q", 1e15+uint64(i)*1e6, 60)
		if err := b.Add(j, []byte("body of a queued job")); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, j.ID)
		if b.Len() == 500 || i == n-1 {
			commitAll(t, s, b)
			b = s.NewBatch()
		}
	}
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	// The backlog in the bottom level, as after a fill and its compactions.
	if err := s.db.Compact(context.Background(), []byte{0}, []byte{0xff}, true); err != nil {
		t.Fatal(err)
	}
	m := s.db.Metrics()
	if m.Levels[6].TablesCount == 0 || m.Levels[0].TablesCount != 0 {
		t.Fatalf("after the compaction: L0 %d tables, L6 %d, want the backlog in L6 only", m.Levels[0].TablesCount, m.Levels[6].TablesCount)
	}
	l6Before := m.Levels[6].TableBytesCompacted
	for i, id := range ids {
		b.Deliver(id, 0)
		b.Delete(id)
		if b.Len() >= 200 || i == n-1 {
			commitAll(t, s, b)
			b = s.NewBatch()
		}
	}
	if err := s.Checkpoint(); err != nil { // the tombstones' tables in L0
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		m = s.db.Metrics()
		if m.Table.PendingStatsCollectionCount == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Pebble did not load the new tables' statistics in 10 s (%d pending)", m.Table.PendingStatsCollectionCount)
		}
		time.Sleep(time.Millisecond)
	}
	for watch := time.Now().Add(time.Second); time.Now().Before(watch); time.Sleep(5 * time.Millisecond) {
		m = s.db.Metrics()
		if m.Compact.TombstoneDensityCount > 0 || m.Levels[6].TableBytesCompacted != l6Before {
			t.Fatalf("the consumed backlog was rewritten for its tombstones: %d tombstone-density compactions, %d bytes written into L6",
				m.Compact.TombstoneDensityCount, m.Levels[6].TableBytesCompacted-l6Before)
		}
	}
	if m.Levels[0].TablesCount == 0 {
		t.Errorf("L0 is empty: the tombstones' tables went somewhere")
	}
	if s.QueueLen("q") != 0 {
		t.Errorf("QueueLen %d after the consume, want 0", s.QueueLen("q"))
	}
}

func commitAll(t *testing.T, s *Store, b *Batch) {
	t.Helper()
	for i, r := range s.Commit(b) {
		if r.Err != nil {
			t.Fatalf("op %d: %v", i, r.Err)
		}
	}
}
