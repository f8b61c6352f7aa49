package storage

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/diskque/diskque/wal"
)

// TestBodyOfAStaleCopyFollowsTheCollector (issue 12, item 1): a reader
// that read a job, released every lock and only then reads its body — a
// GETJOB, SHOW, QPEEK or JSCAN — may find that the collector has moved
// the body (RewriteSegment) and a checkpoint removed its segment
// meanwhile. Body and Bodies follow the job to where its body is now; a
// job deleted meanwhile reports ErrNotFound. The read used to fail with
// "wal: no record at lsn … below the first segment".
func TestBodyOfAStaleCopyFollowsTheCollector(t *testing.T) {
	s, err := Open(t.TempDir(), diskOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var stale []*Job
	for i := range 3 {
		j := newTestJob(s.NodeID(), "q", uint64(i+1), 60)
		if err := s.Add(j, []byte(fmt.Sprint("body ", i))); err != nil {
			t.Fatal(err)
		}
		stale = append(stale, j)
	}
	churn(t, s, 100) // seal the first segment
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	first := s.Stats().Segments[0]
	if first.LiveBodies != 3 {
		t.Fatalf("first segment %+v, want the 3 jobs' bodies", first)
	}
	if _, err := s.RewriteSegment(context.Background(), first.First); err != nil {
		t.Fatal(err)
	}
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	if segs := s.Stats().Segments; segs[0].First == first.First {
		t.Fatalf("the rewritten segment %s is still there", first.Name)
	}
	for i, j := range stale {
		if b, err := s.Body(j); err != nil || string(b) != fmt.Sprint("body ", i) {
			t.Fatalf("Body of a stale copy of %s: %q, %v", j.ID, b, err)
		}
	}
	if err := s.Delete(stale[1].ID); err != nil {
		t.Fatal(err)
	}
	res := s.Bodies(stale)
	for i, r := range res {
		switch {
		case i == 1 && !errors.Is(r.Err, ErrNotFound):
			t.Fatalf("Bodies: deleted job: %+v, want ErrNotFound", r)
		case i != 1 && (r.Err != nil || string(r.Body) != fmt.Sprint("body ", i)):
			t.Fatalf("Bodies: job %d: %q, %v", i, r.Body, r.Err)
		}
	}
}

// TestBodiesReportEachJob (issue 12, item 2): one body that cannot be read
// fails only its own job in Bodies; the others are read. A body missing
// where the job says it is (its segment deleted by hand) is not taken for
// a move: the error stands.
func TestBodiesReportEachJob(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, diskOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	lost := newTestJob(s.NodeID(), "q", 1, 60)
	if err := s.Add(lost, []byte("in the first segment")); err != nil {
		t.Fatal(err)
	}
	churn(t, s, 100)
	var kept []*Job
	for i := range 3 {
		j := newTestJob(s.NodeID(), "q", uint64(10+i), 60)
		if err := s.Add(j, []byte(fmt.Sprint("kept ", i))); err != nil {
			t.Fatal(err)
		}
		kept = append(kept, j)
	}
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	// The lost job's segment goes behind the store's back; the wal's
	// segment list still names it, so the read fails at the file.
	first := s.Stats().Segments[0]
	if err := s.log.RemoveSegments([]wal.LSN{first.First}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, walDir, first.Name)); !os.IsNotExist(err) {
		t.Fatalf("segment %s still there: %v", first.Name, err)
	}
	jobs := []*Job{kept[0], lost, kept[1], kept[2]}
	res := s.Bodies(jobs)
	for i, r := range res {
		if jobs[i] == lost {
			if r.Err == nil || errors.Is(r.Err, ErrNotFound) {
				t.Fatalf("the lost body: %+v, want the read error", r)
			}
			continue
		}
		if r.Err != nil || string(r.Body) != fmt.Sprint("kept ", i-min(i, 1)) {
			t.Fatalf("job %d: %q, %v", i, r.Body, r.Err)
		}
	}
}
