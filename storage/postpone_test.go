package storage

import (
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestPostponeBumpsCountersDurably: another node's QUEUED postpones a
// copy's requeue and adds the counters that node bumped, in the index and
// through a replay of the AOF; a plain Working adds nothing.
func TestPostponeBumpsCountersDurably(t *testing.T) {
	fs := vfs.NewCrashableMem()
	s := mustOpen(t, fs)
	j := replicaJob(s.NodeID())
	commitReplica(t, s, j, []byte("body"))
	b := s.NewBatch()
	b.Postpone(j.ID, 70_000, 1, 0)
	b.Postpone(j.ID, 71_000, 0, 2) // two in one batch: the second sees the first
	b.Working(j.ID, 72_000)
	for i, r := range s.Commit(b) {
		if r.Err != nil {
			t.Fatalf("op %d: %v", i, r.Err)
		}
	}
	check := func(when string) {
		t.Helper()
		got, err := s.Job(j.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.Nacks != 1 || got.AdditionalDeliveries != 2 || got.QueueTime != 72_000 || got.State != StateActive {
			t.Fatalf("%s: nacks %d, additional %d, qtime %d, state %s; want 1, 2, 72000, active",
				when, got.Nacks, got.AdditionalDeliveries, got.QueueTime, got.State)
		}
	}
	check("applied")
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	// A crash: the reopen replays the records from the AOF.
	live := s
	s = mustOpen(t, fs.CrashClone(vfs.CrashCloneCfg{}))
	if ri := s.RecoveryInfo(); ri.Records == 0 {
		t.Fatal("the crashed store replayed nothing")
	}
	check("replayed")
	live.Close()
	defer s.Close()

	// An at-most-once job is never postponed (as Working).
	k := newTestJob(s.NodeID(), "q", 6_000*1_000_000, 0)
	if err := s.Add(k, []byte("x")); err != nil {
		t.Fatal(err)
	}
	b = s.NewBatch()
	b.Postpone(k.ID, 1, 1, 1)
	if r := s.Commit(b); r[0].Err == nil {
		t.Fatalf("Postpone of an at-most-once job succeeded: %+v", r[0].Job)
	}
}
