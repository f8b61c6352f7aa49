package storage

import (
	"errors"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// diskFS reports free space as set, on an otherwise ordinary filesystem:
// a disk that is full, then is not.
type diskFS struct {
	vfs.FS
	free atomic.Uint64
}

func (d *diskFS) GetDiskUsage(string) (vfs.DiskUsage, error) {
	return vfs.DiskUsage{AvailBytes: d.free.Load(), TotalBytes: 1 << 40}, nil
}

func (d *diskFS) Unwrap() vfs.FS { return d.FS }

// TestOpenOnFullDiskIsReadOnly: a store opened with less free space than
// ReadOnlyBelow (on a full disk a read-write Pebble dies at Open writing
// its MANIFEST) opens read-only: nothing in the index directory changes,
// the jobs in the index and in the AOF's unflushed tail are read, every
// write returns ErrNoSpace (inside ErrFailed), Close returns; reopened with
// room it is writable and has every job.
func TestOpenOnFullDiskIsReadOnly(t *testing.T) {
	mem := vfs.NewMem()
	disk := &diskFS{FS: mem}
	disk.free.Store(1 << 40)
	opts := TestingOptions()
	opts.FS = disk
	opts.Logger = quietLogger()
	s, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	node := s.NodeID()
	var ids []string
	add := func(s *Store, n int) {
		for range n {
			j := newTestJob(node, "q", uint64(1000+len(ids))*1_000_000, 60)
			if err := s.Add(j, []byte("body")); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, j.ID)
		}
	}
	add(s, 100)
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	add(s, 100) // the AOF's tail: in no index table
	// A crash: the tail is durable in the AOF only.
	close(s.ckptStop)
	<-s.ckptDone
	s.stopVerify()
	s.fence.fence(errors.New("test: crash"))
	s.room.stopMeasuring()
	s.fence.release()
	s.db.Close()
	s.log.Close()
	s.lock.Close()

	indexFiles := func() []string {
		names, err := mem.List("db/" + indexDir)
		if err != nil {
			t.Fatal(err)
		}
		slices.Sort(names)
		return names
	}
	before := indexFiles()
	disk.free.Store(uint64(opts.ReadOnlyBelow) - 1)
	if RoomToWrite("db", opts) {
		t.Fatal("RoomToWrite on a full disk")
	}
	s, err = Open("db", opts)
	if err != nil {
		t.Fatalf("Open on a full disk: %v", err)
	}
	if !s.ReadOnly() || !s.Failing() || !errors.Is(s.Err(), ErrNoSpace) {
		t.Fatalf("ReadOnly %v, Failing %v, Err %v; want read-only, failing with ErrNoSpace", s.ReadOnly(), s.Failing(), s.Err())
	}
	for _, id := range ids {
		if _, err := s.Job(id); err != nil {
			t.Fatalf("Job(%s) on the read-only store: %v", id, err)
		}
	}
	if n := s.QueueLen("q"); n != int64(len(ids)) {
		t.Fatalf("QueueLen %d, want %d", n, len(ids))
	}
	if page, err := s.QueueRange("q", QueuePos{}, 1000); err != nil || len(page) != len(ids) {
		t.Fatalf("QueueRange: %d entries, %v; want %d", len(page), err, len(ids))
	}
	j := newTestJob(node, "q", 9_000_000_000, 60)
	if err := s.Add(j, []byte("x")); !errors.Is(err, ErrFailed) || !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Add on the read-only store: %v, want ErrNoSpace", err)
	}
	if _, err := s.Ack(ids[0]); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("Ack on the read-only store: %v, want ErrNoSpace", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close of the read-only store: %v", err)
	}
	if after := indexFiles(); !slices.Equal(before, after) {
		t.Fatalf("the read-only store changed the index directory:\nbefore %v\nafter  %v", before, after)
	}

	disk.free.Store(1 << 40)
	if !RoomToWrite("db", opts) {
		t.Fatal("no RoomToWrite once the disk has room")
	}
	s, err = Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.ReadOnly() || s.Failing() {
		t.Fatalf("reopened with room: ReadOnly %v, Failing %v", s.ReadOnly(), s.Failing())
	}
	add(s, 1)
	for _, id := range ids {
		if _, err := s.Job(id); err != nil {
			t.Fatalf("Job(%s) after the reopen: %v", id, err)
		}
	}
}
