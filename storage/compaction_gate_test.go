package storage

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// fakeCompactor is a DBForCompaction with a number of waiting compactions.
// The real one, Pebble's DB, runs behind the gate in every store test (and
// gc's tests run manual compactions through it).
type fakeCompactor struct {
	mu        sync.Mutex
	allowed   int
	waiting   int
	scheduled int
	handles   []pebble.CompactionGrantHandle
	changed   chan struct{}
}

func (f *fakeCompactor) GetAllowedWithoutPermission() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.allowed
}

func (f *fakeCompactor) GetWaitingCompaction() (bool, pebble.WaitingCompaction) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.waiting > 0, pebble.WaitingCompaction{}
}

func (f *fakeCompactor) Schedule(h pebble.CompactionGrantHandle) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.waiting == 0 {
		return false
	}
	f.waiting--
	f.scheduled++
	f.handles = append(f.handles, h)
	select {
	case f.changed <- struct{}{}:
	default:
	}
	return true
}

func (f *fakeCompactor) state() (scheduled, waiting int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.scheduled, f.waiting
}

// waitScheduled polls until n compactions were scheduled.
func (f *fakeCompactor) waitScheduled(t *testing.T, n int) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		if s, _ := f.state(); s >= n {
			return
		}
		select {
		case <-f.changed:
		case <-deadline:
			s, w := f.state()
			t.Fatalf("%d compactions scheduled, %d waiting; want %d scheduled", s, w, n)
		}
	}
}

func TestCompactionGate(t *testing.T) {
	db := &fakeCompactor{allowed: 2, waiting: 5, changed: make(chan struct{}, 1)}
	g := newCompactionGate()
	g.Register(2, db)
	// Closed: nothing is granted, however the DB asks.
	if ok, _ := g.TrySchedule(); ok {
		t.Fatal("TrySchedule granted a compaction before Open")
	}
	g.UpdateGetAllowedWithoutPermission()
	g.wake()
	// The granter runs every 100 ms; give it a few rounds by waiting for
	// it to go through the poke channel twice. Nothing may be scheduled.
	for range 2 {
		g.poke <- struct{}{}
	}
	if s, _ := db.state(); s != 0 {
		t.Fatalf("%d compactions scheduled while the gate was closed", s)
	}
	g.Open()
	// Open: the granter fills the DB's allowance, no more.
	db.waitScheduled(t, 2)
	if ok, _ := g.TrySchedule(); ok {
		t.Fatal("TrySchedule granted a third compaction with an allowance of 2")
	}
	// A compaction ending frees a slot for the next one waiting.
	db.handles[0].Done()
	db.waitScheduled(t, 3)
	db.mu.Lock()
	db.allowed = 10
	db.mu.Unlock()
	g.UpdateGetAllowedWithoutPermission()
	db.waitScheduled(t, 5)
	if s, w := db.state(); s != 5 || w != 0 {
		t.Fatalf("scheduled %d, waiting %d", s, w)
	}
	// TrySchedule grants directly when there is room.
	if ok, h := g.TrySchedule(); !ok || h == nil {
		t.Fatal("TrySchedule refused with room left")
	}
	g.Unregister()
	if ok, _ := g.TrySchedule(); ok {
		t.Fatal("TrySchedule granted after Unregister")
	}
}

// TestCompactionGateHold: once the store failed, the gate grants nothing
// more, neither through the granter nor TrySchedule: a move compaction
// (a MANIFEST edit alone) would otherwise fail and be retried in a loop
// after a failed MANIFEST write.
func TestCompactionGateHold(t *testing.T) {
	db := &fakeCompactor{allowed: 2, waiting: 5, changed: make(chan struct{}, 1)}
	g := newCompactionGate()
	g.Register(2, db)
	defer g.Unregister()
	g.Open()
	db.waitScheduled(t, 2)
	g.hold()
	db.handles[0].Done()
	db.handles[1].Done()
	for range 2 { // two rounds of the granter
		g.poke <- struct{}{}
	}
	if ok, _ := g.TrySchedule(); ok {
		t.Fatal("TrySchedule granted a compaction after hold")
	}
	if s, _ := db.state(); s != 2 {
		t.Fatalf("%d compactions scheduled, want the 2 before hold", s)
	}
}

// TestCompactionGateSurvivesACancelledManualCompaction: Pebble v2.1.7
// caches a manual compaction the scheduler refused; if DB.Compact then
// gives up on it (its context ends, or an earlier compaction of the same
// call failed) the manual compaction leaves Pebble's queue but not the
// cache, and the next Schedule panics ("did not find manual compaction with
// id N"). CI met it when an injected write error failed a compaction of
// CompactOrderIndex. The gate must drop the stale pick and go on.
func TestCompactionGateSurvivesACancelledManualCompaction(t *testing.T) {
	gate := newCompactionGate()
	opts := &pebble.Options{}
	opts.Experimental.CompactionScheduler = gate
	// No automatic compaction: one of the two L0 tables below, taken
	// before the slots are, left the manual compaction nothing to wait
	// for (CI: "never waited for the gate").
	opts.DisableAutomaticCompactions = true
	db, err := pebble.Open(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	gate.Open()
	// Two tables in L0 so that a manual compaction has work.
	for i := range 2 {
		if err := db.Set([]byte{'k', byte(i)}, []byte("v"), pebble.Sync); err != nil {
			t.Fatal(err)
		}
		if err := db.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	// Every slot taken: TrySchedule refuses, so Pebble caches its pick.
	gate.mu.Lock()
	gate.running += 1000
	gate.mu.Unlock()

	ctx, cancel := context.WithCancel(context.Background())
	compacted := make(chan error, 1)
	go func() { compacted <- db.Compact(ctx, []byte("k"), []byte("l"), false) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if waiting, _ := db.GetWaitingCompaction(); waiting {
			break
		}
		// A Compact that returned without waiting is its own failure,
		// with its error: not a timeout to guess at.
		select {
		case err := <-compacted:
			t.Fatalf("Compact returned (%v) before it waited for the gate", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the manual compaction never waited for the gate")
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-compacted; !errors.Is(err, context.Canceled) {
		t.Fatalf("Compact = %v, want context.Canceled", err)
	}

	// Slots free again: the granter meets the stale pick.
	gate.mu.Lock()
	gate.running -= 1000
	gate.mu.Unlock()
	gate.wake()
	if err := db.Compact(context.Background(), []byte("k"), []byte("l"), false); err != nil {
		t.Fatalf("a later Compact: %v", err)
	}
	if n := db.Metrics().Levels[0].TablesCount; n != 0 {
		t.Fatalf("L0 holds %d tables after the compaction", n)
	}
}
