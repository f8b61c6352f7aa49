package storage

import (
	"bytes"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/wal"
)

// TestForwardScanAllocatesNothingPerRecord: the checkpoint's scan of the
// segments it removes (forward) allocates a fixed number of times, however
// many records they hold. It converted every record's job id to a string
// and allocated a struct per job: under producers and consumers at once,
// whose segments hold an ADD and a DEL of each job and nothing to write
// forward but the META, that was the whole of forward's cost.
func TestForwardScanAllocatesNothingPerRecord(t *testing.T) {
	o := TestingOptions()
	o.FS = vfs.Default
	o.Sync = wal.SyncNever
	o.SegmentSize = 32 << 10
	s, err := Open(t.TempDir(), o)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	body := bytes.Repeat([]byte("x"), 100)
	const jobs = 3000
	for i := range jobs {
		j := newTestJob(s.NodeID(), "q", uint64(1000+i)*1_000_000, 60)
		if err := s.Add(j, body); err != nil {
			t.Fatal(err)
		}
		if err := s.Delete(j.ID); err != nil {
			t.Fatal(err)
		}
	}
	segs := s.log.Segments()
	var dead []wal.LSN
	for _, seg := range segs[:len(segs)-1] { // all but the active one
		dead = append(dead, seg.First)
	}
	records := 0
	for _, first := range dead {
		if err := s.log.ScanSegment(first, func(wal.LSN, wal.Record) error { records++; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	if records < jobs {
		t.Fatalf("only %d records in %d sealed segments", records, len(dead))
	}
	if err := s.pin(); err != nil {
		t.Fatal(err)
	}
	defer s.unpin()
	s.ckptMu.Lock()
	defer s.ckptMu.Unlock()
	var ferr error
	allocs := testing.AllocsPerRun(5, func() {
		if err := s.forward(dead); err != nil {
			ferr = err
		}
	})
	if ferr != nil {
		t.Fatal(ferr)
	}
	// A fixed cost per segment (its file, reader and buffers) and per call
	// (the META written): here about 15 a segment of 280 records.
	if max := float64(50 + 20*len(dead)); allocs > max {
		t.Fatalf("forward over %d records in %d segments allocates %v times, want at most %v",
			records, len(dead), allocs, max)
	}
	t.Logf("forward over %d records in %d segments: %v allocations", records, len(dead), allocs)
}
