package storage

import (
	"errors"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestDeliverMovedIsOneRecord: a delivery that also sets the job's nodes
// (Batch.DeliverMoved, a job federation moves to another node) is one
// DELIVER record carrying the list — the AOF grows by that record alone —
// and a replay of the AOF tail and a rebuild of the index from the whole
// AOF both come back to the delivered job with the new list. A delivery
// whose nodes function returns nil writes the plain layout, which older
// AOFs hold.
func TestDeliverMovedIsOneRecord(t *testing.T) {
	fs := vfs.NewCrashableMem()
	s := mustOpen(t, fs)
	defer s.Close()
	self := s.NodeID()
	moved := newTestJob(self, "q", 1_000_000_000, 60)
	kept := newTestJob(self, "q", 2_000_000_000, 60)
	for _, j := range []*Job{moved, kept} {
		j.Nodes = []string{self}
		if err := s.Add(j, []byte("body")); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Checkpoint(); err != nil { // the adds in the index, the deliveries in the tail
		t.Fatal(err)
	}
	want := []string{self, otherNode}
	var saw []*Job
	deliver := func(j *Job, nodes []string) Result {
		t.Helper()
		b := s.NewBatch()
		b.DeliverMoved("q", QueuePos{Ctime: j.Ctime, ID: j.ID}, func(*Job) int64 { return 9000 }, func(cur *Job) []string {
			saw = append(saw, cur)
			return nodes
		})
		res := s.Commit(b)
		if res[0].Err != nil {
			t.Fatal(res[0].Err)
		}
		return res[0]
	}
	// A record's framing in the AOF, from a plain DELIVER's.
	ref := newTestJob(self, "z", 3_000_000_000, 60)
	if err := s.Add(ref, []byte("body")); err != nil {
		t.Fatal(err)
	}
	end := s.Stats().AOFEnd
	if _, err := s.Deliver(ref.ID, 9000); err != nil {
		t.Fatal(err)
	}
	framing := int(s.Stats().AOFEnd-end) - len(encodeOp(nil, deliverOp(ref.ID, 9000)))
	end = s.Stats().AOFEnd
	r := deliver(moved, want)
	if len(saw) != 1 || saw[0].State != StateQueued || !slices.Equal(saw[0].Nodes, []string{self}) {
		t.Fatalf("the nodes function saw %+v, want the queued job", saw)
	}
	one := encodeOp(nil, &op{typ: recDeliver, id: moved.ID, qtime: 9000, nodes: want})
	if got, wantGrowth := int64(s.Stats().AOFEnd-end), int64(framing+len(one)); got != wantGrowth {
		t.Fatalf("the delivery wrote %d bytes of AOF, want one record of %d", got, wantGrowth)
	}
	if r.Job.State != StateActive || r.Job.Deliveries != 1 || r.Job.QueueTime != 9000 || !slices.Equal(r.Job.Nodes, want) {
		t.Fatalf("delivered: %+v", r.Job)
	}
	end = s.Stats().AOFEnd
	if r := deliver(kept, nil); !slices.Equal(r.Job.Nodes, []string{self}) || r.Job.State != StateActive {
		t.Fatalf("delivered without nodes: %+v", r.Job)
	}
	plain := encodeOp(nil, deliverOp(kept.ID, 9000))
	if got := int64(s.Stats().AOFEnd - end); got != int64(framing+len(plain)) {
		t.Fatalf("a delivery setting no nodes wrote %d bytes, want the plain DELIVER's %d", got, framing+len(plain))
	}
	// A delivery refused (the job is no longer queued) writes nothing.
	end = s.Stats().AOFEnd
	b := s.NewBatch()
	b.DeliverMoved("q", QueuePos{Ctime: moved.Ctime, ID: moved.ID}, func(*Job) int64 { return 9000 }, func(*Job) []string { return want })
	if res := s.Commit(b); !errors.Is(res[0].Err, ErrWrongState) || s.Stats().AOFEnd != end {
		t.Fatalf("second delivery: %v, %d bytes", res[0].Err, s.Stats().AOFEnd-end)
	}
	check := func(s *Store, how string) {
		t.Helper()
		j, err := s.Job(moved.ID)
		if err != nil || j.State != StateActive || j.Deliveries != 1 || j.QueueTime != 9000 || !slices.Equal(j.Nodes, want) {
			t.Fatalf("%s: moved job %+v, %v", how, j, err)
		}
		if j, err := s.Job(kept.ID); err != nil || j.State != StateActive || !slices.Equal(j.Nodes, []string{self}) {
			t.Fatalf("%s: other job %+v, %v", how, j, err)
		}
		if n := s.QueueLen("q"); n != 0 {
			t.Fatalf("%s: %d queued", how, n)
		}
	}
	crashed := fs.CrashClone(vfs.CrashCloneCfg{})
	replayed := mustOpen(t, crashed)
	if ri := replayed.RecoveryInfo(); ri.Records == 0 || ri.Rebuilt {
		t.Fatalf("the crash left no tail to replay: %+v", ri)
	}
	check(replayed, "tail replayed")
	if err := replayed.Close(); err != nil {
		t.Fatal(err)
	}
	rebuilt := fs.CrashClone(vfs.CrashCloneCfg{})
	if err := rebuilt.RemoveAll("db/" + indexDir); err != nil {
		t.Fatal(err)
	}
	r2 := mustOpen(t, rebuilt)
	defer r2.Close()
	if !r2.RecoveryInfo().Rebuilt {
		t.Fatal("the index was not rebuilt")
	}
	check(r2, "index rebuilt")
}

// TestDeliverRecordLayouts: a DELIVER decodes in both layouts — the id
// and qtime alone (every AOF before the node list) and with the node
// list — and one with an empty list is malformed.
func TestDeliverRecordLayouts(t *testing.T) {
	id := NewJobID(otherNode, 3600, 60)
	for _, nodes := range [][]string{nil, {otherNode}, {otherNode, "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee"}} {
		p := encodeOp(nil, &op{typ: recDeliver, id: id, qtime: -5, nodes: nodes})
		o, err := decodeOp(recDeliver, p)
		if err != nil || o.id != id || o.qtime != -5 || !slices.Equal(o.nodes, nodes) || (nodes == nil) != (o.nodes == nil) {
			t.Fatalf("nodes %v: decoded %+v, %v", nodes, o, err)
		}
	}
	bad := append(encodeOp(nil, deliverOp(id, 7)), 0) // a count of 0
	if _, err := decodeOp(recDeliver, bad); !errors.Is(err, ErrBadRecord) {
		t.Fatalf("an empty node list decoded: %v", err)
	}
}
