package storage

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

func newTestJob(node, queue string, ctime uint64, retry uint32) *Job {
	return &Job{
		ID:    NewJobID(node, 3600, int64(retry)),
		Queue: queue,
		State: StateQueued,
		Ctime: ctime,
		Etime: int64(ctime/1_000_000) + 3_600_000,
		Retry: retry,
		Repl:  1,
	}
}

func mustOpen(t *testing.T, fs vfs.FS) *Store {
	t.Helper()
	opts := TestingOptions()
	opts.FS = fs
	s, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestLifecycleSurvivesReopen(t *testing.T) {
	fs := vfs.NewCrashableMem()
	s := mustOpen(t, fs)
	node := s.NodeID()
	if len(node) != 40 {
		t.Fatalf("node id %q", node)
	}
	var ids []string
	big := bytes.Repeat([]byte("compressible "), 200)
	for i := 0; i < 100; i++ {
		j := newTestJob(node, "q1", uint64(1000+i)*1_000_000, 60)
		j.QueueTime = 2000 + int64(i)
		body := []byte(fmt.Sprintf("body-%d", i))
		if i%10 == 0 {
			body = big
		}
		if err := s.Add(j, body); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, j.ID)
	}
	if _, err := s.Deliver(ids[0], 5000); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Deliver(ids[0], 5000); !errors.Is(err, ErrWrongState) {
		t.Fatalf("second deliver: %v", err)
	}
	if _, err := s.Ack(ids[1]); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ids[2]); err != nil {
		t.Fatal(err)
	}
	if err := s.Pause("q1", PauseOut); err != nil {
		t.Fatal(err)
	}
	if got := s.QueueLen("q1"); got != 97 {
		t.Fatalf("qlen %d", got)
	}
	check := func(s *Store) {
		t.Helper()
		if got := s.QueueLen("q1"); got != 97 {
			t.Fatalf("qlen %d", got)
		}
		if s.PauseState("q1") != PauseOut {
			t.Fatalf("pause %v", s.PauseState("q1"))
		}
		if s.NodeID() != node {
			t.Fatalf("node id changed")
		}
		j, err := s.Job(ids[0])
		if err != nil || j.State != StateActive || j.Deliveries != 1 || j.QueueTime != 5000 {
			t.Fatalf("delivered job: %+v %v", j, err)
		}
		if j, err := s.Job(ids[1]); err != nil || j.State != StateAcked {
			t.Fatalf("acked job: %+v %v", j, err)
		}
		if _, err := s.Job(ids[2]); !errors.Is(err, ErrNotFound) {
			t.Fatalf("deleted job: %v", err)
		}
		j, _ = s.Job(ids[10])
		body, err := s.Body(j)
		if err != nil || !bytes.Equal(body, big) || j.StoredSize >= j.BodySize {
			t.Fatalf("compressed body: %v stored %d size %d", err, j.StoredSize, j.BodySize)
		}
		pos, err := s.QueueRange("q1", QueuePos{}, 5)
		if err != nil || len(pos) != 5 || pos[0].ID != ids[3] || pos[4].ID != ids[7] {
			t.Fatalf("queue range %v %v", pos, err)
		}
		pos, _ = s.QueueRange("q1", pos[4], 1)
		if pos[0].ID != ids[8] {
			t.Fatalf("queue range after: %v", pos)
		}
		pos, _ = s.QueueNewest("q1", 1)
		if pos[0].ID != ids[99] {
			t.Fatalf("newest %v", pos)
		}
	}
	check(s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, fs)
	if ri := s.RecoveryInfo(); ri.Records != 0 {
		t.Fatalf("clean reopen replayed %d records", ri.Records)
	}
	check(s)
	// Crash without a checkpoint: everything replays from the log.
	crashed := fs.CrashClone(vfs.CrashCloneCfg{})
	s2 := mustOpen(t, crashed)
	check(s2)
	s2.Close()
	s.Close()
}

func TestBatchSeesItsOwnEarlierOperations(t *testing.T) {
	fs := vfs.NewCrashableMem()
	s := mustOpen(t, fs)
	defer s.Close()
	node := s.NodeID()
	a := newTestJob(node, "q", 1_000_000_000, 60)
	c := newTestJob(node, "q", 2_000_000_000, 60)
	b := s.NewBatch()
	if err := b.Add(a, []byte("a-body")); err != nil {
		t.Fatal(err)
	}
	b.Deliver(a.ID, 9000)
	b.Deliver(a.ID, 9000) // wrong state: a is active now
	b.Ack("D-short")      // malformed id
	if err := b.Add(c, []byte("c-body")); err != nil {
		t.Fatal(err)
	}
	b.Nack(a.ID, 7000, 0)
	res := s.Commit(b)
	want := []error{nil, nil, ErrWrongState, ErrNotFound, nil, nil}
	for i, r := range res {
		if (want[i] == nil) != (r.Err == nil) || want[i] != nil && !errors.Is(r.Err, want[i]) {
			t.Fatalf("op %d: err %v, want %v", i, r.Err, want[i])
		}
	}
	if j := res[5].Job; j.State != StateQueued || j.Nacks != 1 || j.Deliveries != 1 || j.QueueTime != 7000 {
		t.Fatalf("after nack: %+v", j)
	}
	check := func(s *Store) {
		t.Helper()
		j, err := s.Job(a.ID)
		if err != nil || j.State != StateQueued || j.Nacks != 1 || j.BodyLSN != res[0].Job.BodyLSN {
			t.Fatalf("a: %+v %v", j, err)
		}
		body, err := s.Body(j)
		if err != nil || string(body) != "a-body" {
			t.Fatalf("a body %q %v", body, err)
		}
		pos, _ := s.QueueRange("q", QueuePos{}, 10)
		if len(pos) != 2 || pos[0].ID != a.ID || pos[1].ID != c.ID || s.QueueLen("q") != 2 {
			t.Fatalf("queue %v len %d", pos, s.QueueLen("q"))
		}
		if st := s.Stats(); st.Jobs != 2 {
			t.Fatalf("jobs %d", st.Jobs)
		}
	}
	check(s)
	crashed := mustOpen(t, fs.CrashClone(vfs.CrashCloneCfg{}))
	defer crashed.Close()
	check(crashed)
	if ri := crashed.RecoveryInfo(); ri.Records < 5 {
		t.Fatalf("crash replayed %d records", ri.Records)
	}
}

func TestAddNewSkipsOnlyTheDuplicateCheck(t *testing.T) {
	s := mustOpen(t, vfs.NewCrashableMem())
	defer s.Close()
	j := newTestJob(s.NodeID(), "q", 1_000_000_000, 60)
	j.ID = ""
	b := s.NewBatch()
	if err := b.AddNew(j, []byte("x"), 3600); err != nil {
		t.Fatal(err)
	}
	if !ValidJobID(j.ID) || IDNodePrefix(j.ID) != s.NodeID()[:8] || IDAtMostOnce(j.ID) {
		t.Fatalf("AddNew made the id %q", j.ID)
	}
	if res := s.Commit(b); res[0].Err != nil || res[0].Job.BodyLSN == 0 {
		t.Fatalf("AddNew: %+v", res[0])
	}
	if got, err := s.Job(j.ID); err != nil || got.State != StateQueued || s.QueueLen("q") != 1 {
		t.Fatalf("after AddNew: %+v %v", got, err)
	}
	// The checked Add still refuses the same id.
	again := *j
	if err := s.Add(&again, []byte("y")); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate Add: %v", err)
	}
}

// TestAddNewRefusesAnID: AddNew makes the id itself, so a caller cannot
// pass an existing job's id as new (its keys would be written without a
// lookup, and the old job's would come back when the new one goes).
func TestAddNewRefusesAnID(t *testing.T) {
	s := mustOpen(t, vfs.NewCrashableMem())
	defer s.Close()
	old := newTestJob(s.NodeID(), "q", 1_000_000_000, 60)
	if err := s.Add(old, []byte("old")); err != nil {
		t.Fatal(err)
	}
	dup := newTestJob(s.NodeID(), "q", 2_000_000_000, 60)
	dup.ID = old.ID
	if err := s.NewBatch().AddNew(dup, []byte("dup"), 3600); !errors.Is(err, ErrInvalidJob) {
		t.Fatalf("AddNew with an id: %v, want ErrInvalidJob", err)
	}
}

// TestBlockCacheHoldsBlocks: with the default sizes the index's block cache
// keeps the blocks reads bring in. Pebble charges its memtables to the same
// cache, and a cache of CacheSize alone was all memtable: it held no block,
// and every read went to the file.
func TestBlockCacheHoldsBlocks(t *testing.T) {
	opts := DefaultOptions()
	opts.FS = vfs.NewMem()
	opts.Logger = quietLogger()
	// The defaults' proportions, scaled down: a block cache the size of
	// one memtable.
	opts.MemTableSize, opts.CacheSize = 1<<20, 1<<20
	s, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var ids []string
	for i := range 20000 { // memtables grow to their full size
		j := newTestJob(s.NodeID(), "q", uint64(1000+i)*1_000_000, 60)
		if err := s.Add(j, []byte("body")); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, j.ID)
	}
	if err := s.Checkpoint(); err != nil { // the index is in sstables now
		t.Fatal(err)
	}
	for range 2 {
		for _, id := range ids[:200] {
			if _, err := s.getJob(s.db, id); err != nil {
				t.Fatal(err)
			}
		}
	}
	m := s.db.Metrics().BlockCache
	if m.Count == 0 || m.Hits == 0 {
		t.Fatalf("block cache: %d blocks, %d hits, %d misses; want blocks cached and hit", m.Count, m.Hits, m.Misses)
	}
}

// TestOpsAfterAFlushAllInTheSameBatch: an operation applied after FLUSHALL
// but before the buffer reaches Pebble sees the jobs the range deletions
// cover as deleted. It used to read them from Pebble: an ACK after the
// FLUSHALL wrote the acked job back into the index, where it outlived
// the FLUSHALL.
func TestOpsAfterAFlushAllInTheSameBatch(t *testing.T) {
	fs := vfs.NewCrashableMem()
	s := mustOpen(t, fs)
	j := newTestJob(s.NodeID(), "q", 1_000_000_000, 60)
	if err := s.Add(j, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if err := s.Checkpoint(); err != nil { // the job is in Pebble now
		t.Fatal(err)
	}
	res := make([]Result, 3)
	if err := s.apply([]*op{{typ: recFlush}, {typ: recAck, id: j.ID}, deliverOp(j.ID, 0)}, res).Wait(); err != nil {
		t.Fatal(err)
	}
	for i, r := range res[1:] {
		if !errors.Is(r.Err, ErrNotFound) {
			t.Fatalf("op %d after FLUSHALL: %+v, want ErrNotFound", i+1, r)
		}
	}
	check := func(when string) {
		t.Helper()
		if _, err := s.Job(j.ID); !errors.Is(err, ErrNotFound) {
			t.Fatalf("%s: the job flushed away is back: %v", when, err)
		}
		if jobs, err := s.ScanJobs("", 10); err != nil || len(jobs) != 0 {
			t.Fatalf("%s: JSCAN finds %d jobs (%v)", when, len(jobs), err)
		}
	}
	check("after the batch")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, fs)
	defer s.Close()
	check("after a restart")
}

// TestIDTTLMinutes: the TTL a job id carries is what NewJobID wrote, its
// lowest bit saying at-least-once (1) or at-most-once (0).
func TestIDTTLMinutes(t *testing.T) {
	node := NewNodeID()
	for _, c := range []struct {
		ttl, retry, want int64
	}{{3600, 30, 61}, {3600, 0, 60}, {59, 0, 0}, {59, 5, 1}, {1 << 30, 1, 65535}} {
		id := NewJobID(node, c.ttl, c.retry)
		if got := IDTTLMinutes(id); got != c.want || IDAtMostOnce(id) != (c.retry == 0) {
			t.Errorf("ttl %d retry %d: IDTTLMinutes %d (want %d), IDAtMostOnce %v", c.ttl, c.retry, got, c.want, IDAtMostOnce(id))
		}
	}
}
