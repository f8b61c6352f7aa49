package storage

import (
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/internal/spacefs"
	"github.com/diskque/diskque/wal"
)

// TestDiskWritesCoverWhatTheDiskHolds: between two readings, the growth of
// what the store's files hold is never more than DiskWrites' Queued at the
// second less Written at the first — the AOF's records and the index's
// files (a checkpoint's flush) both counted — which is what lets a server
// subtract it from a free-space reading taken before.
func TestDiskWritesCoverWhatTheDiskHolds(t *testing.T) {
	fs := spacefs.New(vfs.Default, 1<<40)
	opts := TestingOptions()
	opts.FS = fs
	opts.Sync = wal.SyncNever
	opts.Logger = quietLogger()
	s, err := Open(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	before, used := s.DiskWrites(), fs.Used()
	aofBefore := s.Stats().AOFEnd
	body := make([]byte, 4000)
	for i := range 200 {
		body[0], body[1] = byte(i), byte(i>>8)
		j := newTestJob(s.NodeID(), "q", uint64(1000+i)*1_000_000, 60)
		if err := s.Add(j, body); err != nil {
			t.Fatal(err)
		}
		if i%50 == 49 {
			if err := s.Checkpoint(); err != nil { // the index's files
				t.Fatal(err)
			}
		}
		now := s.DiskWrites()
		if grew := fs.Used() - used; grew > now.Queued-before.Written {
			t.Fatalf("after %d jobs the files grew by %d bytes, DiskWrites counts %d", i+1, grew, now.Queued-before.Written)
		}
	}
	after := s.DiskWrites()
	if aof := int64(s.Stats().AOFEnd - aofBefore); after.Written-before.Written <= aof {
		t.Fatalf("DiskWrites counted %d bytes, the AOF alone %d: the index's files are not counted", after.Written-before.Written, aof)
	}
}
