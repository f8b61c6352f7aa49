package storage

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/wal"
)

// corruptIndexStore writes n jobs into a store on a real directory, makes
// the index durable in one table, closes it, and flips a byte in one of
// that table's data blocks among the job keys (a seventh into it, after the
// few count and segment keys). It returns the directory and the job ids.
func corruptIndexStore(t *testing.T, n int) (string, []string) {
	t.Helper()
	dir := t.TempDir()
	opts := TestingOptions()
	opts.FS = vfs.Default
	opts.MemTableSize = 8 << 20 // one flush, one table
	opts.Sync = wal.SyncNever   // Close syncs
	opts.Logger = quietLogger()
	s, err := Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range n {
		j := newTestJob(s.NodeID(), "q", uint64(1000+i)*1_000_000, 60)
		if err := s.Add(j, fmt.Appendf(nil, "body-%d", i)); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, j.ID)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	tables, err := filepath.Glob(filepath.Join(dir, indexDir, "*.sst"))
	if err != nil || len(tables) != 1 {
		t.Fatalf("index tables %v (%v), want one", tables, err)
	}
	b, err := os.ReadFile(tables[0])
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/7] ^= 0xff
	if err := os.WriteFile(tables[0], b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, ids
}

// TestCorruptIndexFailsStore: reading a job whose index block is corrupt
// does not end the process (Pebble's default corruption handler is fatal):
// the read returns ErrIndexCorrupt naming the file, the store fails with
// it — writes are refused with ErrFailed, the other jobs are still read —
// and a reopen finds the same corruption rather than hiding it.
func TestCorruptIndexFailsStore(t *testing.T) {
	dir, ids := corruptIndexStore(t, 2000)
	opts := TestingOptions()
	opts.FS = vfs.Default
	opts.Logger = quietLogger()
	s, err := Open(dir, opts)
	if err != nil {
		t.Fatalf("Open (the corruption is in job keys, which Open does not read): %v", err)
	}
	defer s.Close()
	var corrupt, readable []string
	func() {
		defer func() {
			if r := recover(); r != nil {
				t.Fatalf("a read of a corrupt index panicked: %v\n%s", r, debug.Stack())
			}
		}()
		for _, id := range ids {
			switch _, err := s.Job(id); {
			case err == nil:
				readable = append(readable, id)
			case errors.Is(err, ErrIndexCorrupt):
				if len(corrupt) == 0 {
					t.Logf("Job: %v", err)
					if !strings.Contains(err.Error(), ".sst") {
						t.Errorf("the error does not name the table: %v", err)
					}
				}
				corrupt = append(corrupt, id)
			default:
				t.Fatalf("Job(%s): %v, want nil or ErrIndexCorrupt", id, err)
			}
		}
		if _, err := s.ScanJobs("", len(ids)); !errors.Is(err, ErrIndexCorrupt) {
			t.Errorf("ScanJobs over the corrupt block: %v, want ErrIndexCorrupt", err)
		}
	}()
	if len(corrupt) == 0 || len(readable) == 0 {
		t.Fatalf("%d corrupt and %d readable jobs: the test corrupted the wrong place", len(corrupt), len(readable))
	}
	t.Logf("%d jobs unreadable, %d readable", len(corrupt), len(readable))
	<-s.Failed()
	if err := s.Err(); !errors.Is(err, ErrIndexCorrupt) {
		t.Fatalf("Err: %v, want ErrIndexCorrupt", err)
	}
	j := newTestJob(s.NodeID(), "q", 9_000_000_000, 60)
	if err := s.Add(j, []byte("x")); !errors.Is(err, ErrFailed) || !errors.Is(err, ErrIndexCorrupt) {
		t.Fatalf("Add on a store with a corrupt index: %v, want ErrFailed and ErrIndexCorrupt", err)
	}
	if _, err := s.Ack(readable[0]); !errors.Is(err, ErrFailed) {
		t.Fatalf("Ack on a store with a corrupt index: %v, want ErrFailed", err)
	}
	if _, err := s.Job(readable[0]); err != nil {
		t.Fatalf("reading a healthy job of the failed store: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Logf("close: %v", err)
	}
	s, err = Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Job(corrupt[0]); !errors.Is(err, ErrIndexCorrupt) {
		t.Fatalf("after a reopen: %v, want ErrIndexCorrupt again", err)
	}
}
