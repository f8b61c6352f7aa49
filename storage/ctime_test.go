package storage

import (
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/wal"
)

// TestMaxCtimeSurvivesRestarts: the highest ctime of any job added is kept
// with the counters — across a clean restart, a crash (the replay
// recomputes it), a delete of the job that set it and a FlushAll — so that
// a broker started under a clock stepped back still sorts new jobs last.
func TestMaxCtimeSurvivesRestarts(t *testing.T) {
	fs := vfs.NewCrashableMem()
	s := openCrash(t, fs, wal.SyncAlways)
	high := newTestJob(s.NodeID(), "q", 5_000_000_000_000_000, 60)
	low := newTestJob(s.NodeID(), "q", 3_000_000_000_000_000, 60)
	for _, j := range []*Job{high, low} {
		if err := s.Add(j, []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	if got := s.MaxCtime(); got != high.Ctime {
		t.Fatalf("MaxCtime %d, want %d", got, high.Ctime)
	}
	if err := s.Delete(high.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openCrash(t, fs, wal.SyncAlways)
	if got := s.MaxCtime(); got != high.Ctime {
		t.Fatalf("after a clean restart: MaxCtime %d, want %d (deleting a job does not lower it)", got, high.Ctime)
	}
	// Added after the checkpoint, lost with the crash except in the AOF.
	higher := newTestJob(s.NodeID(), "q", 7_000_000_000_000_000, 60)
	if err := s.Add(higher, []byte("y")); err != nil {
		t.Fatal(err)
	}
	crashed := fs.CrashClone(vfs.CrashCloneCfg{})
	s.Close()
	s = openCrash(t, crashed, wal.SyncAlways)
	if got := s.MaxCtime(); got != higher.Ctime {
		t.Fatalf("after a crash: MaxCtime %d, want %d (replayed)", got, higher.Ctime)
	}
	if err := s.FlushAll().Wait(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openCrash(t, crashed, wal.SyncAlways)
	defer s.Close()
	if got := s.MaxCtime(); got != higher.Ctime {
		t.Fatalf("after FLUSHALL and a restart: MaxCtime %d, want %d", got, higher.Ctime)
	}
}

// TestMaxCtimeOfAnOlderIndex: an index whose state value predates the
// highest ctime (applied LSN and job count only) still opens, and the store
// finds the highest ctime among its jobs.
func TestMaxCtimeOfAnOlderIndex(t *testing.T) {
	fs := vfs.NewCrashableMem()
	s := openCrash(t, fs, wal.SyncAlways)
	var want uint64
	for i := range 5 {
		j := newTestJob(s.NodeID(), "q", uint64(i+1)*1_000_000_000_000_000, 60)
		if err := s.Add(j, []byte("x")); err != nil {
			t.Fatal(err)
		}
		want = j.Ctime
	}
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	// Rewrite the state value as an older build wrote it, make it durable
	// and close without the checkpoint that would rewrite it again.
	close(s.ckptStop)
	<-s.ckptDone
	s.mu.Lock()
	v := encodeState(indexState{applied: s.applied, jobs: s.jobs})
	s.mu.Unlock()
	v = v[:len(v)-1] // the ctime uvarint of 0 is one byte
	if err := s.db.Set(keyState, v, pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	if err := s.db.Flush(); err != nil {
		t.Fatal(err)
	}
	s.closed = true
	if err := s.closeFiles(); err != nil {
		t.Fatal(err)
	}
	s = openCrash(t, fs, wal.SyncAlways)
	defer s.Close()
	if got := s.MaxCtime(); got != want {
		t.Fatalf("MaxCtime of an older index %d, want %d", got, want)
	}
}

func TestDecodeState(t *testing.T) {
	st := indexState{applied: 1 << 40, jobs: 12345, maxCtime: 1_700_000_000_000_000_001, hasMaxCtime: true}
	if got, err := decodeState(encodeState(st)); err != nil || got != st {
		t.Fatalf("round trip: %+v %v, want %+v", got, err, st)
	}
	old := encodeState(indexState{applied: 7, jobs: 3})
	old = old[:len(old)-1]
	if got, err := decodeState(old); err != nil || got != (indexState{applied: 7, jobs: 3}) {
		t.Fatalf("older value: %+v %v", got, err)
	}
	for _, bad := range [][]byte{nil, make([]byte, 8), append(encodeState(st), 0x80)} {
		if _, err := decodeState(bad); err == nil {
			t.Errorf("decodeState(%x) accepted a malformed value", bad)
		}
	}
}
