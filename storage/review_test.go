package storage

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// The review's checks of format 5 (branch creview): the cluster's records
// and dummy acks through checkpoints that remove segments, a rebuild from
// the AOF and the offline Check.

// TestClusterRecordsSurviveARebuild: a replica, a dummy ack, and an
// origin's wait-repl job given its nodes (NODES) then queued and acked,
// each followed by churn that lets checkpoints remove the segments their
// records are in: the index rebuilt from the AOF holds them exactly as the
// live one did, a late replica of the dummy ack is still refused, and
// Check finds nothing wrong.
func TestClusterRecordsSurviveARebuild(t *testing.T) {
	fs := vfs.NewCrashableMem()
	s, err := Open(eqDir, rvOpts(fs))
	if err != nil {
		t.Fatal(err)
	}
	body := make([]byte, 4000)
	rng := rand.New(rand.NewPCG(1, 2))
	for k := range body {
		body[k] = byte(rng.Uint32())
	}
	churn := func() {
		for i := range 20 {
			j := newTestJob(s.NodeID(), "churn", uint64(9_000+i)*1_000_000, 60)
			body[0] = byte(i)
			if err := s.Add(j, body); err != nil {
				t.Fatal(err)
			}
			if err := s.Delete(j.ID); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Checkpoint(); err != nil {
			t.Fatal(err)
		}
	}
	commit := func(b *Batch) {
		for i, r := range s.Commit(b) {
			if r.Err != nil {
				t.Fatalf("op %d: %v", i, r.Err)
			}
		}
	}
	rep := replicaJob(s.NodeID())
	b := s.NewBatch()
	if err := b.AddReplica(rep, []byte("copy")); err != nil {
		t.Fatal(err)
	}
	commit(b)
	churn()
	dummy := NewJobID(otherNode, 3600, 60)
	b = s.NewBatch()
	if err := b.AckUnknown(dummy, 3_600_000); err != nil {
		t.Fatal(err)
	}
	commit(b)
	churn()
	own := newTestJob(s.NodeID(), "q", 8_000*1_000_000, 60)
	own.State, own.QueueTime = StateWaitRepl, 0
	if err := s.Add(own, []byte("own")); err != nil {
		t.Fatal(err)
	}
	churn()
	nodes := []string{s.NodeID(), otherNode}
	b = s.NewBatch()
	b.SetNodes(own.ID, nodes)
	b.Queue(own.ID, 80_000)
	commit(b)
	churn()
	b = s.NewBatch()
	b.SetNodes(rep.ID, append(slices.Clone(rep.Nodes), "dddddddddddddddddddddddddddddddddddddddd"))
	commit(b)
	churn()
	if _, err := s.Ack(own.ID); err != nil {
		t.Fatal(err)
	}
	churn()
	if s.Stats().Collect.SegmentsRemoved == 0 {
		t.Fatal("no segment removed: the test does not exercise the forward records")
	}
	ids := []string{rep.ID, dummy, own.ID}
	show := func(s *Store) string {
		out := ""
		for _, id := range ids {
			j, err := s.Job(id)
			if err != nil {
				out += fmt.Sprintf("%s: %v\n", id[:12], err)
				continue
			}
			out += fmt.Sprintf("%s: %s queue=%q nodes=%v etime=%d qtime=%d body=%d\n", id[:12], j.State, j.Queue, j.Nodes, j.Etime, j.QueueTime, j.BodySize)
		}
		return out
	}
	live := show(s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	clone := fs.CrashClone(keepEverything())
	if err := clone.RemoveAll(eqDir + "/" + indexDir); err != nil {
		t.Fatal(err)
	}
	r, err := Open(eqDir, rvOpts(clone))
	if err != nil {
		t.Fatalf("rebuild: %v", err)
	}
	if !r.RecoveryInfo().Rebuilt {
		t.Fatal("not rebuilt")
	}
	if got := show(r); got != live {
		t.Errorf("rebuilt from the AOF:\n%s\nlive:\n%s", got, live)
	}
	// The dummy ack still blocks a late REPLJOB.
	late := replicaJob(r.NodeID())
	late.ID = dummy
	b = r.NewBatch()
	if err := b.AddReplica(late, []byte("late")); err != nil {
		t.Fatal(err)
	}
	r.Commit(b)
	if j, err := r.Job(dummy); err != nil || !j.IsDummyAck() {
		t.Errorf("late replica of a dummy ack after a rebuild: %+v, %v", j, err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	rep2, err := Check(eqDir, rvOpts(clone))
	if err != nil {
		t.Fatal(err)
	}
	if !rep2.OK() {
		t.Errorf("Check of a format-5 store: %+v", rep2)
	}
}
