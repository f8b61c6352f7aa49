package storage

import (
	"fmt"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// resumableIDs returns the ids ScanResumable finds, paging limit at a time.
func resumableIDs(t *testing.T, s *Store, limit int) []string {
	t.Helper()
	var ids []string
	after := ""
	for {
		page, err := s.ScanResumable(after, limit)
		if err != nil {
			t.Fatal(err)
		}
		for _, j := range page {
			if !needsResume(j) {
				t.Fatalf("ScanResumable returned %s, which is %s", j.ID, j.State)
			}
			ids = append(ids, j.ID)
		}
		if len(page) < limit {
			return ids
		}
		after = page[len(page)-1].ID
	}
}

// resumableFixture fills s with replica copies (active), some acked, some
// dummy acks and some jobs in wait-repl, and returns the ids of those in
// the resume set, sorted.
func resumableFixture(t *testing.T, s *Store, copies int) []string {
	t.Helper()
	self := s.NodeID()
	var want []string
	b := s.NewBatch()
	for i := range copies {
		j := replicaJob(self)
		j.Ctime += uint64(i)
		if err := b.AddReplica(j, []byte(fmt.Sprintf("copy-%d", i))); err != nil {
			t.Fatal(err)
		}
		if i%10 == 3 {
			b.Ack(j.ID)
			want = append(want, j.ID)
		}
	}
	for i := range 3 {
		j := newTestJob(self, "q", uint64(9_000+i)*1_000_000, 60)
		j.State, j.Repl = StateWaitRepl, 3
		j.Nodes = []string{self}
		if err := b.Add(j, []byte("waiting")); err != nil {
			t.Fatal(err)
		}
		want = append(want, j.ID)
	}
	for range 2 {
		id := NewJobID(otherNode, 3600, 60)
		if err := b.AckUnknown(id, 3_600_000); err != nil {
			t.Fatal(err)
		}
		want = append(want, id)
	}
	for _, r := range s.Commit(b) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	slices.Sort(want)
	return want
}

// TestResumeSetFollowsStates: the resume set is exactly the acked and
// wait-repl jobs, as the states change, across a restart, a crash, a
// rebuild from the log and a FLUSHALL, and Check agrees.
func TestResumeSetFollowsStates(t *testing.T) {
	fs := vfs.NewCrashableMem()
	s := mustOpen(t, fs)
	want := resumableFixture(t, s, 60)
	if got := resumableIDs(t, s, 3); !slices.Equal(got, want) {
		t.Fatalf("resume set %v, want %v", got, want)
	}
	// A wait-repl job whose replication is achieved leaves the set; an
	// acked job deleted (its collection done) leaves it.
	waiting, acked := "", ""
	for _, id := range want {
		j, err := s.Job(id)
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case j.State == StateWaitRepl && waiting == "":
			waiting = id
		case j.State == StateAcked && !j.IsDummyAck() && acked == "":
			acked = id
		}
	}
	b := s.NewBatch()
	b.SetNodes(waiting, []string{s.NodeID(), otherNode})
	b.Delete(acked)
	for _, r := range s.Commit(b) {
		if r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	want = slices.DeleteFunc(want, func(id string) bool { return id == waiting || id == acked })
	if got := resumableIDs(t, s, 1024); !slices.Equal(got, want) {
		t.Fatalf("after SetNodes and Delete: resume set %v, want %v", got, want)
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	// A crash loses the write buffer; the replay writes the set again.
	crashed := fs.CrashClone(vfs.CrashCloneCfg{})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for name, fs := range map[string]vfs.FS{"crash": crashed, "restart": fs} {
		s := mustOpen(t, fs)
		if got := resumableIDs(t, s, 5); !slices.Equal(got, want) {
			t.Fatalf("%s: resume set %v, want %v", name, got, want)
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
	opts := TestingOptions()
	opts.FS, opts.Rebuild = fs, RebuildAlways
	s, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	if got := resumableIDs(t, s, 1024); !slices.Equal(got, want) {
		t.Fatalf("rebuilt: resume set %v, want %v", got, want)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	checkOK(t, fs)
	s = mustOpen(t, fs)
	if err := s.FlushAll().Wait(); err != nil {
		t.Fatal(err)
	}
	if got := resumableIDs(t, s, 1024); len(got) != 0 {
		t.Fatalf("after FLUSHALL: resume set %v", got)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	checkOK(t, fs)
}

func checkOK(t *testing.T, fs vfs.FS) {
	t.Helper()
	opts := TestingOptions()
	opts.FS = fs
	rep, err := Check("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Fatalf("check: %v", rep.Problems)
	}
}

// TestResumeSetReadsNoOtherJob: ScanResumable reads the resume set, not
// the backlog. Every other job's value is made unreadable in the index: a
// scan of every job (what a clustered node's restart did) fails on them,
// ScanResumable does not meet them.
func TestResumeSetReadsNoOtherJob(t *testing.T) {
	fs := vfs.NewMem()
	s := mustOpen(t, fs)
	want := resumableFixture(t, s, 200)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	rewriteIndex(t, fs, "db", func(db *pebble.DB) {
		it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixJob}, UpperBound: []byte{prefixJob + 1}})
		if err != nil {
			t.Fatal(err)
		}
		b := db.NewBatch()
		for ok := it.First(); ok; ok = it.Next() {
			if _, found := slices.BinarySearch(want, string(it.Key()[1:])); !found {
				if err := b.Set(it.Key(), []byte{0xff}, nil); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := it.Close(); err != nil {
			t.Fatal(err)
		}
		if err := b.Commit(pebble.NoSync); err != nil {
			t.Fatal(err)
		}
	})
	s = mustOpen(t, fs)
	defer s.Close()
	if got := resumableIDs(t, s, 4); !slices.Equal(got, want) {
		t.Fatalf("resume set %v, want %v", got, want)
	}
	if _, err := s.ScanJobs("", 1024); err == nil {
		t.Fatal("a scan of every job read the broken values without an error: the test proves nothing")
	}
}

// TestFormat5IndexGetsItsResumeSet: an index of format 5 (node ids spelled
// out, no resume set, no node table) opens, reads every job as it was,
// gets its resume set written once and is marked format 6; jobs written
// after intern their nodes.
func TestFormat5IndexGetsItsResumeSet(t *testing.T) {
	fs := vfs.NewMem()
	s := mustOpen(t, fs)
	want := resumableFixture(t, s, 40)
	before, err := s.ScanJobs("", 1024)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	downgradeToFormat5(t, fs, "db")
	s = mustOpen(t, fs)
	after, err := s.ScanJobs("", 1024)
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Fatalf("%d jobs after the upgrade, %d before", len(after), len(before))
	}
	for i := range before {
		if !sameJob(before[i], after[i]) || !slices.Equal(before[i].Nodes, after[i].Nodes) {
			t.Fatalf("job %s: %+v after the upgrade, %+v before", before[i].ID, after[i], before[i])
		}
	}
	if got := resumableIDs(t, s, 7); !slices.Equal(got, want) {
		t.Fatalf("resume set %v, want %v", got, want)
	}
	// A new copy interns its nodes again (the table was dropped with the
	// format-6 values).
	j := replicaJob(s.NodeID())
	commitReplica(t, s, j, []byte("late"))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	checkOK(t, fs)
	rewriteIndex(t, fs, "db", func(db *pebble.DB) {
		v, closer, err := db.Get(keyFormat)
		if err != nil {
			t.Fatal(err)
		}
		defer closer.Close()
		if v[0] != formatVersion {
			t.Fatalf("format %d after the upgrade", v[0])
		}
		jv, closer2, err := db.Get(jobKey(j.ID))
		if err != nil {
			t.Fatal(err)
		}
		defer closer2.Close()
		if jv[1]&indexFlagNodeNums == 0 {
			t.Fatalf("a copy written after the upgrade spells its nodes out (flags %#x)", jv[1])
		}
	})
}

// downgradeToFormat5 rewrites the closed store's index as a format-5
// build left it: every value with its node ids spelled out, no node table,
// no resume set.
func downgradeToFormat5(t *testing.T, fs vfs.FS, dir string) {
	t.Helper()
	rewriteIndex(t, fs, dir, func(db *pebble.DB) {
		names := &nodeNames{}
		if v, closer, err := db.Get(keyNodeID); err == nil {
			names.self = []string{string(v)}
			closer.Close()
		}
		it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixNodeName}, UpperBound: []byte{prefixNodeName + 1}})
		if err != nil {
			t.Fatal(err)
		}
		for ok := it.First(); ok; ok = it.Next() {
			names.ids = append(names.ids, string(it.Value()))
		}
		if err := it.Close(); err != nil {
			t.Fatal(err)
		}
		b := db.NewBatch()
		for _, p := range []byte{prefixJob, prefixQueue} {
			it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte{p}, UpperBound: []byte{p + 1}})
			if err != nil {
				t.Fatal(err)
			}
			for ok := it.First(); ok; ok = it.Next() {
				id := string(it.Key()[len(it.Key())-JobIDLen:])
				j, err := decodeJob(id, it.Value(), names)
				if err != nil {
					t.Fatal(err)
				}
				if err := b.Set(it.Key(), encodeJob(nil, j, names.self[0], nil), nil); err != nil {
					t.Fatal(err)
				}
			}
			if err := it.Close(); err != nil {
				t.Fatal(err)
			}
		}
		for _, p := range []byte{prefixNodeName, prefixResume} {
			if err := b.DeleteRange([]byte{p}, []byte{p + 1}, nil); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.Set(keyFormat, []byte{5}, nil); err != nil {
			t.Fatal(err)
		}
		if err := b.Commit(pebble.NoSync); err != nil {
			t.Fatal(err)
		}
	})
}
