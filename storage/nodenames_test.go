package storage

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// indexValues returns the closed store's j/ values by id, and its node
// table keys.
func indexValues(t *testing.T, fs vfs.FS) (values map[string][]byte, table []string) {
	t.Helper()
	values = map[string][]byte{}
	rewriteIndex(t, fs, "db", func(db *pebble.DB) {
		for _, p := range []byte{prefixJob, prefixNodeName} {
			it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte{p}, UpperBound: []byte{p + 1}})
			if err != nil {
				t.Fatal(err)
			}
			for ok := it.First(); ok; ok = it.Next() {
				if p == prefixJob {
					values[string(it.Key()[1:])] = slices.Clone(it.Value())
				} else {
					table = append(table, string(it.Value()))
				}
			}
			if err := it.Close(); err != nil {
				t.Fatal(err)
			}
		}
	})
	return values, table
}

// TestNodeIDsInterned: a replicated job's index value lists node numbers,
// not ids (a value about the size of a lone node's job, against 120 bytes
// more spelled out), every node list reads back as written across a
// restart, a crash and a rebuild from the log (which numbers afresh), and
// numbers are never reused: after FLUSHALL the same ids keep theirs and
// the table does not grow.
func TestNodeIDsInterned(t *testing.T) {
	fs := vfs.NewCrashableMem()
	s := mustOpen(t, fs)
	self := s.NodeID()
	other := []string{otherNode, strings.Repeat("e", 40), strings.Repeat("d", 40), strings.Repeat("c", 40)}
	lone := newTestJob(self, "q", 1_000*1_000_000, 60)
	lone.Nodes = []string{self}
	if err := s.Add(lone, []byte("lone")); err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{lone.ID: lone.Nodes}
	b := s.NewBatch()
	for i := range 30 {
		j := replicaJob(self)
		j.Ctime += uint64(i)
		j.Nodes = []string{other[i%4], self, other[(i+1)%4]}
		if err := b.AddReplica(j, []byte(fmt.Sprintf("copy-%d", i))); err != nil {
			t.Fatal(err)
		}
		want[j.ID] = j.Nodes
		if i%7 == 0 {
			// The origin records where it sent a job: a new list.
			nodes := []string{self, other[(i+2)%4]}
			b.SetNodes(j.ID, nodes)
			want[j.ID] = nodes
		}
	}
	for _, r := range s.Commit(b) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	crashed := fs.CrashClone(vfs.CrashCloneCfg{})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	values, table := indexValues(t, fs)
	if len(table) != 5 {
		t.Fatalf("the node table holds %d ids, want 5 (self and four others): %v", len(table), table)
	}
	loneSize := len(values[lone.ID])
	for id, nodes := range want {
		v := values[id]
		if id == lone.ID {
			continue
		}
		if v[1]&indexFlagNodeNums == 0 {
			t.Fatalf("job %s: its value spells its nodes out (flags %#x)", id, v[1])
		}
		// The node list costs a count and a byte per node; the lone job's
		// is a flag. Queue and body location may differ by a few bytes.
		if len(v) > loneSize+1+len(nodes)+4 {
			t.Fatalf("job %s with %d nodes: a value of %d bytes, the lone node's job %d", id, len(nodes), len(v), loneSize)
		}
	}
	readAll := func(name string, s *Store) {
		t.Helper()
		for id, nodes := range want {
			j, err := s.Job(id)
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if !slices.Equal(j.Nodes, nodes) {
				t.Fatalf("%s: job %s has nodes %v, want %v", name, id, j.Nodes, nodes)
			}
		}
	}
	for name, fs := range map[string]vfs.FS{"crash": crashed, "restart": fs} {
		s := mustOpen(t, fs)
		readAll(name, s)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	opts := TestingOptions()
	opts.FS, opts.Rebuild = fs, RebuildAlways
	if s, err := Open("db", opts); err != nil {
		t.Fatal(err)
	} else {
		readAll("rebuilt", s)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	checkOK(t, fs)
	_, rebuilt := indexValues(t, fs)
	s = mustOpen(t, fs)
	if err := s.FlushAll().Wait(); err != nil {
		t.Fatal(err)
	}
	j := replicaJob(self)
	j.Nodes = []string{other[3], other[0], self}
	commitReplica(t, s, j, []byte("after flushall"))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	checkOK(t, fs)
	values, after := indexValues(t, fs)
	if !slices.Equal(after, rebuilt) {
		t.Fatalf("after FLUSHALL the node table is %v, before %v", after, rebuilt)
	}
	if v := values[j.ID]; v[1]&indexFlagNodeNums == 0 {
		t.Fatalf("a copy added after FLUSHALL spells its nodes out")
	}
}

// TestUnknownNodeNumberIsAnError: a value naming a number the table does
// not have is a clear decode error, never a panic or a wrong node.
func TestUnknownNodeNumberIsAnError(t *testing.T) {
	names := &nodeNames{self: []string{"a"}, ids: []string{"a", "b"}}
	j := &Job{ID: fuzzJobID, Queue: "q", State: StateActive, Nodes: []string{"a", "b"}}
	v := encodeJob(nil, j, "a", func(id string) (uint32, bool) { return map[string]uint32{"a": 1, "b": 2}[id], true })
	if got, err := decodeJob(fuzzJobID, v, names); err != nil || !slices.Equal(got.Nodes, j.Nodes) {
		t.Fatalf("decoded %v, %v", got, err)
	}
	short := &nodeNames{self: []string{"a"}, ids: []string{"a"}}
	if _, err := decodeJob(fuzzJobID, v, short); err == nil || !strings.Contains(err.Error(), "node number 2") {
		t.Fatalf("a value naming node number 2 of a table of one: %v", err)
	}
}
