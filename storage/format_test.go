package storage

import (
	"encoding/binary"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// rewriteIndex opens the index of the closed store in dir and lets fn
// rewrite it, as an older build would have left it.
func rewriteIndex(t *testing.T, fs vfs.FS, dir string, fn func(db *pebble.DB)) {
	t.Helper()
	db, err := pebble.Open(fs.PathJoin(dir, indexDir), &pebble.Options{FS: fs, DisableWAL: true, Logger: quietPebble{}})
	if err != nil {
		t.Fatal(err)
	}
	fn(db)
	if err := db.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestFormat1IndexOpens: an index written by a build of format 1 (full job
// values) opens, every job reads back as it was, its queue delivers from the
// old queue-order values, and the index is marked format 2 so that an
// older build refuses it once format-2 values are in it.
func TestFormat1IndexOpens(t *testing.T) {
	fs := vfs.NewMem()
	s := mustOpen(t, fs)
	node := s.NodeID()
	want := map[string]*Job{}
	var queued []QueuePos
	for i := range 20 {
		j := newTestJob(node, "q", uint64(1000+i)*1_000_000, 60)
		if i%5 == 4 {
			j.Nodes = []string{node, "another-node"}
		}
		if i == 7 {
			j.State, j.AwakeTime = StateActive, 5_000_000
		}
		if err := s.Add(j, []byte(fmt.Sprintf("body-%d", i))); err != nil {
			t.Fatal(err)
		}
	}
	jobs, err := s.ScanJobs("", 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, j := range jobs {
		want[j.ID] = j
		if j.State == StateQueued {
			queued = append(queued, QueuePos{Ctime: j.Ctime, ID: j.ID})
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	rewriteIndex(t, fs, "db", func(db *pebble.DB) {
		b := db.NewBatch()
		for _, p := range []byte{prefixJob, prefixQueue} {
			it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte{p}, UpperBound: []byte{p + 1}})
			if err != nil {
				t.Fatal(err)
			}
			for ok := it.First(); ok; ok = it.Next() {
				id := string(it.Key()[len(it.Key())-JobIDLen:])
				if it.Value()[0] != indexValueVersion {
					t.Fatalf("%s: a new index holds a format-%d value", id, it.Value()[0])
				}
				if err := b.Set(it.Key(), encodeJobV1(nil, want[id]), nil); err != nil {
					t.Fatal(err)
				}
			}
			if err := it.Close(); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Set(keyFormat, binary.AppendUvarint(nil, 1), nil); err != nil {
			t.Fatal(err)
		}
		if err := b.Commit(pebble.NoSync); err != nil {
			t.Fatal(err)
		}
	})

	s = mustOpen(t, fs)
	if v, err := s.get(s.db, keyFormat); err != nil || binary.AppendUvarint(nil, formatVersion)[0] != v[0] {
		t.Fatalf("format after opening a format-1 index: %x, %v", v, err)
	}
	for id, w := range want {
		got, err := s.Job(id)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, w) {
			t.Fatalf("%s reads back as\n%+v\nwant\n%+v", id, got, w)
		}
	}
	b := s.NewBatch()
	for _, p := range queued {
		b.DeliverAt("q", p, func(*Job) int64 { return 9_000_000 })
	}
	for i, r := range s.Commit(b) {
		if r.Err != nil || r.Job.State != StateActive || r.Job.Deliveries != 1 {
			t.Fatalf("delivery %d of a format-1 queue value: %+v, %v", i, r.Job, r.Err)
		}
		if !reflect.DeepEqual(r.Job.Nodes, want[queued[i].ID].Nodes) {
			t.Fatalf("delivered %s with nodes %q, want %q", r.Job.ID, r.Job.Nodes, want[queued[i].ID].Nodes)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	rewriteIndex(t, fs, "db", func(db *pebble.DB) {
		if err := db.Set(keyFormat, binary.AppendUvarint(nil, formatVersion+1), pebble.NoSync); err != nil {
			t.Fatal(err)
		}
	})
	opts := TestingOptions()
	opts.FS = fs
	if s, err := Open("db", opts); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("index format %d", formatVersion+1)) {
		if err == nil {
			s.Close()
		}
		t.Fatalf("opening an index of a newer format: %v", err)
	}
}
