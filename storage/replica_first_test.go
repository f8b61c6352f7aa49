package storage

import (
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

func commitFirst(t *testing.T, s *Store, j *Job, body []byte, inc uint64) Result {
	t.Helper()
	b := s.NewBatch()
	if err := b.AddReplicaFirst(j, body, inc); err != nil {
		t.Fatal(err)
	}
	res := s.Commit(b)
	if res[0].Err != nil {
		t.Fatal(res[0].Err)
	}
	return res[0]
}

// checkpointed pushes the write buffer into Pebble, where only the lookup
// AddReplicaFirst may skip can see a job.
func checkpointed(t *testing.T, s *Store) {
	t.Helper()
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
}

func wantFirstAdds(t *testing.T, s *Store, fast, slow int64) {
	t.Helper()
	if f, sl := s.FirstAdds(); f != fast || sl != slow {
		t.Fatalf("first adds: %d fast, %d slow; want %d, %d", f, sl, fast, slow)
	}
}

// TestAddReplicaFirstIsANewCopy: a first REPLJOB stamped with this
// incarnation is stored without the lookup, and is the job AddReplica
// then finds (from Pebble, after a checkpoint) and a restart keeps.
func TestAddReplicaFirstIsANewCopy(t *testing.T) {
	fs := vfs.NewMem()
	s := mustOpen(t, fs)
	inc := s.ReplicaIncarnation()
	if inc == 0 {
		t.Fatal("a new store has no incarnation")
	}
	j := replicaJob(s.NodeID())
	if r := commitFirst(t, s, j, []byte("body"), inc); r.Old != nil || r.Job.State != StateActive {
		t.Fatalf("first add: old %v, job %+v", r.Old, r.Job)
	}
	wantFirstAdds(t, s, 1, 0)
	checkpointed(t, s)
	end := s.Stats().AOFEnd
	if r := commitReplica(t, s, j, []byte("again")); r.Old == nil {
		t.Fatal("a resent REPLJOB did not find the first copy")
	}
	if s.Stats().AOFEnd != end {
		t.Fatal("the resent REPLJOB wrote")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, fs)
	defer s.Close()
	if s.ReplicaIncarnation() == inc {
		t.Fatal("a reopened store kept its incarnation")
	}
	got, err := s.Job(j.ID)
	if err != nil || got.State != StateActive {
		t.Fatalf("after reopen: %+v, %v", got, err)
	}
	if b, err := s.Body(got); err != nil || string(b) != "body" {
		t.Fatalf("body %q, %v", b, err)
	}
}

// TestAddReplicaFirstAfterDummyAck: an ACKJOB or SETACK that reached this
// node before the job's first REPLJOB left a dummy ack; the first REPLJOB
// must find it — in the same incarnation, after a restart (the resume
// set), and with a stale stamp — and not resurrect the job.
func TestAddReplicaFirstAfterDummyAck(t *testing.T) {
	fs := vfs.NewMem()
	s := mustOpen(t, fs)
	dummy := func(j *Job) {
		b := s.NewBatch()
		if err := b.AckUnknown(j.ID, 90_000); err != nil {
			t.Fatal(err)
		}
		if res := s.Commit(b); res[0].Err != nil {
			t.Fatal(res[0].Err)
		}
	}
	blocked := func(j *Job, inc uint64) {
		t.Helper()
		r := commitFirst(t, s, j, []byte("late"), inc)
		if r.Old == nil || !r.Old.IsDummyAck() {
			t.Fatalf("first REPLJOB after a dummy ack: old %+v", r.Old)
		}
		if got, _ := s.Job(j.ID); !got.IsDummyAck() {
			t.Fatalf("the first REPLJOB resurrected the job: %+v", got)
		}
	}
	a, b := replicaJob(s.NodeID()), replicaJob(s.NodeID())
	dummy(a)
	dummy(b)
	checkpointed(t, s)
	inc := s.ReplicaIncarnation()
	blocked(a, inc)
	wantFirstAdds(t, s, 0, 1)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, fs)
	defer s.Close()
	blocked(b, s.ReplicaIncarnation()) // the resume set, loaded at Open
	blocked(a, inc)                    // a stamp of the old incarnation
	wantFirstAdds(t, s, 0, 2)
}

// TestAddReplicaFirstAfterImport: a copy another node requeued and gave
// here (YOURJOBS: AddReplica) before the origin's first REPLJOB arrived is
// the job the REPLJOB finds.
func TestAddReplicaFirstAfterImport(t *testing.T) {
	s := mustOpen(t, vfs.NewMem())
	defer s.Close()
	j := replicaJob(s.NodeID())
	imported := *j
	imported.State = StateQueued
	commitReplica(t, s, &imported, []byte("imported"))
	checkpointed(t, s)
	r := commitFirst(t, s, j, []byte("first"), s.ReplicaIncarnation())
	if r.Old == nil || r.Old.State != StateQueued {
		t.Fatalf("first REPLJOB after an import: old %+v", r.Old)
	}
	wantFirstAdds(t, s, 0, 1)
	if n := s.Stats().Jobs; n != 1 {
		t.Fatalf("jobs = %d, want 1", n)
	}
	// Once the job is deleted, the id is forgotten: a first REPLJOB then
	// adds it, as AddReplica's lookup would.
	if err := s.Delete(j.ID); err != nil {
		t.Fatal(err)
	}
	if r := commitFirst(t, s, j, []byte("first"), s.ReplicaIncarnation()); r.Old != nil {
		t.Fatalf("after the delete: old %+v", r.Old)
	}
	wantFirstAdds(t, s, 1, 1)
}

// TestAddReplicaFirstOffWhenFull: a store that would track more ids than
// maxFirstGuard turns the fast path off (incarnation 0) rather than forget
// one.
func TestAddReplicaFirstOffWhenFull(t *testing.T) {
	defer func(n int) { maxFirstGuard = n }(maxFirstGuard)
	maxFirstGuard = 2
	s := mustOpen(t, vfs.NewMem())
	defer s.Close()
	inc := s.ReplicaIncarnation()
	jobs := []*Job{replicaJob(s.NodeID()), replicaJob(s.NodeID()), replicaJob(s.NodeID())}
	for _, j := range jobs {
		b := s.NewBatch()
		_ = b.AckUnknown(j.ID, 90_000)
		if res := s.Commit(b); res[0].Err != nil {
			t.Fatal(res[0].Err)
		}
	}
	checkpointed(t, s)
	if got := s.ReplicaIncarnation(); got != 0 {
		t.Fatalf("incarnation %d past the bound, want 0", got)
	}
	for _, j := range jobs {
		if r := commitFirst(t, s, j, nil, inc); r.Old == nil {
			t.Fatalf("job %s resurrected past the bound", j.ID)
		}
	}
	wantFirstAdds(t, s, 0, 3)
}

// TestAddReplicaFirstAfterFlushAll: FLUSHALL forgets every id.
func TestAddReplicaFirstAfterFlushAll(t *testing.T) {
	s := mustOpen(t, vfs.NewMem())
	defer s.Close()
	j := replicaJob(s.NodeID())
	commitReplica(t, s, j, nil)
	if err := s.FlushAll().Wait(); err != nil {
		t.Fatal(err)
	}
	checkpointed(t, s)
	if r := commitFirst(t, s, j, []byte("x"), s.ReplicaIncarnation()); r.Old != nil {
		t.Fatalf("after FLUSHALL: old %+v", r.Old)
	}
	wantFirstAdds(t, s, 1, 0)
}
