package storage

import (
	"errors"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/wal"
)

const otherNode = "ffffffffffffffffffffffffffffffffffffffff"

// replicaJob is a copy of a job made by otherNode, as a REPLJOB brings it.
func replicaJob(self string) *Job {
	j := newTestJob(otherNode, "q", 5_000*1_000_000, 60)
	j.State, j.QueueTime, j.Repl = StateActive, 65_000, 3
	j.Nodes = []string{otherNode, self, "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee"}
	return j
}

func commitReplica(t *testing.T, s *Store, j *Job, body []byte) Result {
	t.Helper()
	b := s.NewBatch()
	if err := b.AddReplica(j, body); err != nil {
		t.Fatal(err)
	}
	res := s.Commit(b)
	if res[0].Err != nil {
		t.Fatal(res[0].Err)
	}
	return res[0]
}

// TestAddReplicaTwiceIsOneJob: a REPLJOB received twice stores one job, and
// the second add succeeds (so GOTJOB is answered again) without writing.
func TestAddReplicaTwiceIsOneJob(t *testing.T) {
	s := mustOpen(t, vfs.NewMem())
	defer s.Close()
	j := replicaJob(s.NodeID())
	r1 := commitReplica(t, s, j, []byte("body"))
	if r1.Old != nil || r1.Job.State != StateActive {
		t.Fatalf("first add: old %v, job %+v", r1.Old, r1.Job)
	}
	end := s.Stats().AOFEnd
	again := *j
	again.Nodes = nil
	r2 := commitReplica(t, s, &again, []byte("other body"))
	if r2.Old == nil || r2.Old.BodyLSN != r1.Job.BodyLSN {
		t.Fatalf("second add: want the existing job as Old, got %+v", r2.Old)
	}
	if got := s.Stats().AOFEnd; got != end {
		t.Fatalf("the second add wrote to the AOF: end %d → %d", end, got)
	}
	got, err := s.Job(j.ID)
	if err != nil {
		t.Fatal(err)
	}
	body, err := s.Body(got)
	if err != nil || string(body) != "body" || !slices.Equal(got.Nodes, j.Nodes) {
		t.Fatalf("job after two adds: body %q (%v), nodes %v", body, err, got.Nodes)
	}
	if n := s.Stats().Jobs; n != 1 {
		t.Fatalf("jobs = %d, want 1", n)
	}
	// A plain Add of the id is still refused.
	b := s.NewBatch()
	if err := b.Add(&again, nil); err != nil {
		t.Fatal(err)
	}
	if res := s.Commit(b); !errors.Is(res[0].Err, ErrExists) {
		t.Fatalf("Add of a known id: %v, want ErrExists", res[0].Err)
	}
}

// TestDummyAckBlocksALateReplica: an ack of a job never seen here leaves an
// acked, bodiless placeholder that survives a restart, makes a late REPLJOB
// a no-op and expires at its etime.
func TestDummyAckBlocksALateReplica(t *testing.T) {
	fs := vfs.NewMem()
	s := mustOpen(t, fs)
	j := replicaJob(s.NodeID())
	b := s.NewBatch()
	if err := b.AckUnknown(j.ID, 90_000); err != nil {
		t.Fatal(err)
	}
	if res := s.Commit(b); res[0].Err != nil {
		t.Fatal(res[0].Err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, fs)
	defer s.Close()
	d, err := s.Job(j.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !d.IsDummyAck() || d.Etime != 90_000 || d.BodySize != 0 {
		t.Fatalf("dummy ack after reopen: %+v", d)
	}
	r := commitReplica(t, s, j, []byte("late"))
	if r.Old == nil || r.Old.State != StateAcked {
		t.Fatalf("late REPLJOB: old %+v, want the acked placeholder", r.Old)
	}
	if got, _ := s.Job(j.ID); got.State != StateAcked || got.Queue != "" {
		t.Fatalf("the late REPLJOB resurrected the job: %+v", got)
	}
	// Its only timer is its TTL.
	evs, err := s.DueEvents(100_000, Event{}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 || evs[0].Kind != EventTTL || evs[0].ID != j.ID {
		t.Fatalf("events of a dummy ack: %+v", evs)
	}
	// AckUnknown of a known id changes nothing.
	k := newTestJob(s.NodeID(), "q", 6_000*1_000_000, 60)
	if err := s.Add(k, []byte("x")); err != nil {
		t.Fatal(err)
	}
	b = s.NewBatch()
	_ = b.AckUnknown(k.ID, 1)
	if res := s.Commit(b); res[0].Err != nil || res[0].Old == nil {
		t.Fatalf("AckUnknown of a known job: %+v", res[0])
	}
	if got, _ := s.Job(k.ID); got.State != StateQueued {
		t.Fatalf("AckUnknown changed a known job: %+v", got)
	}
	// A dummy ack is all it can be: no body, no queue.
	if err := s.Add(&Job{ID: NewJobID(otherNode, 60, 1), State: StateAcked, Queue: "q"}, nil); !errors.Is(err, ErrInvalidJob) {
		t.Fatalf("Add of an acked job with a queue: %v", err)
	}
}

// TestSetNodesPersists: the origin's node list, set in any state, is
// replayed after a crash.
func TestSetNodesPersists(t *testing.T) {
	fs := vfs.NewCrashableMem()
	opts := TestingOptions()
	opts.FS, opts.Sync = fs, wal.SyncAlways
	s, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	j := newTestJob(s.NodeID(), "q", 7_000*1_000_000, 60)
	j.State, j.QueueTime = StateWaitRepl, 0
	if err := s.Add(j, []byte("b")); err != nil {
		t.Fatal(err)
	}
	nodes := []string{s.NodeID(), otherNode}
	b := s.NewBatch()
	b.SetNodes(j.ID, nodes)
	b.Queue(j.ID, 70_000)
	b.Ack(j.ID)
	b.SetNodes(j.ID, append(slices.Clone(nodes), "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee"))
	for i, r := range s.Commit(b) {
		if r.Err != nil {
			t.Fatalf("op %d: %v", i, r.Err)
		}
	}
	crashed := fs.CrashClone(vfs.CrashCloneCfg{})
	s.Close()
	opts.FS = crashed
	s, err = Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.Job(j.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != StateAcked || len(got.Nodes) != 3 || got.Nodes[1] != otherNode {
		t.Fatalf("after a crash: %+v", got)
	}
}

// TestReplicaDurableUnderAlways: under appendfsync always a replica's copy
// (a new one, or one received again) is fsynced when its commit returns: a
// crash that keeps only synced data keeps it.
func TestReplicaDurableUnderAlways(t *testing.T) {
	fs := vfs.NewCrashableMem()
	opts := TestingOptions()
	opts.FS, opts.Sync = fs, wal.SyncAlways
	s, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	j := replicaJob(s.NodeID())
	commitReplica(t, s, j, []byte("copy"))
	commitReplica(t, s, j, []byte("copy"))
	crashed := fs.CrashClone(vfs.CrashCloneCfg{})
	s.Close()
	opts.FS = crashed
	s, err = Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := s.Job(j.ID); err != nil {
		t.Fatalf("replica lost in a crash under always: %v", err)
	}
}

// TestSetNodeID: a new node id survives a restart, new job ids carry it, and
// a store holding jobs refuses it.
func TestSetNodeID(t *testing.T) {
	fs := vfs.NewMem()
	s := mustOpen(t, fs)
	if err := s.Add(newTestJob(s.NodeID(), "q", 1_000_000, 1), nil); err != nil {
		t.Fatal(err)
	}
	const id = "0123456789abcdef0123456789abcdef01234567"
	if err := s.SetNodeID(id); !errors.Is(err, ErrNotEmpty) {
		t.Fatalf("SetNodeID with a job: %v", err)
	}
	if err := s.SetNodeID("not-hex"); !errors.Is(err, ErrInvalidJob) {
		t.Fatalf("SetNodeID of a bad id: %v", err)
	}
	if err := s.FlushAll().Wait(); err != nil {
		t.Fatal(err)
	}
	if err := s.SetNodeID(id); err != nil {
		t.Fatal(err)
	}
	b := s.NewBatch()
	j := &Job{Queue: "q", State: StateQueued, Ctime: 2_000_000, Etime: 100_000, Retry: 1, Repl: 1, Nodes: []string{id}}
	if err := b.AddNew(j, []byte("x"), 60); err != nil {
		t.Fatal(err)
	}
	if res := s.Commit(b); res[0].Err != nil || IDNodePrefix(j.ID) != id[:8] {
		t.Fatalf("new job %s: %v", j.ID, res[0].Err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = mustOpen(t, fs)
	defer s.Close()
	if s.NodeID() != id {
		t.Fatalf("node id after reopen: %s", s.NodeID())
	}
	if got, err := s.Job(j.ID); err != nil || len(got.Nodes) != 1 || got.Nodes[0] != id {
		t.Fatalf("job after reopen: %+v, %v", got, err)
	}
}
