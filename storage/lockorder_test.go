package storage

import (
	"bytes"
	"errors"
	"syscall"
	"testing"
	"time"
)

// stackContains reports whether some goroutine's stack holds every one of
// frames.
func stackContains(frames ...string) bool {
	return goroutineMatches(allStacks(), "", frames...)
}

// waitingForRoom reports whether a goroutine whose stack holds every one
// of frames is blocked in indexRoom.wait's select, waiting for index room.
// Its frame alone is not enough: a writer that runs or is preempted in
// wait's fast path (the index has room) shows it too, and a test that took
// that for a stalled writer let the held flush go before any stall began
// (TestBackPressureStallIsCountedAndLogged then waited for a stall to end
// that never started).
func waitingForRoom(frames ...string) bool {
	return goroutineMatches(allStacks(), " [select", append([]string{"storage.(*indexRoom).wait"}, frames...)...)
}

// goroutineMatches reports whether a goroutine of stacks (runtime.Stack's
// dump of all) has state in its header line (any, if empty) and every one
// of frames in its stack.
func goroutineMatches(stacks []byte, state string, frames ...string) bool {
	for g := range bytes.SplitSeq(stacks, []byte("\n\n")) {
		header, _, _ := bytes.Cut(g, []byte("\n"))
		if state != "" && !bytes.Contains(header, []byte(state)) {
			continue
		}
		all := true
		for _, f := range frames {
			if !bytes.Contains(g, []byte(f)) {
				all = false
				break
			}
		}
		if all {
			return true
		}
	}
	return false
}

// TestFencedFlushUnderWriteStall: commits outrun a memtable flush, which
// then fails (ENOSPC) and fences the index, so Pebble's retries block at
// the fence until Close. The commit that waits for that flush must not
// hold Store.mu (LOCKS.md, "Write back-pressure"): the store fails
// (Failed() fires), the waiting commit returns ErrFailed, and Close ends.
// (When commits waited inside Pebble's write stall holding Store.mu, the
// failure's s.fail and Close waited for Store.mu for ever.)
func TestFencedFlushUnderWriteStall(t *testing.T) {
	mine := "storage." + t.Name()     // frames of this test's goroutines
	h := newHeldFlush(syscall.ENOSPC) // the first flush of a table: slow, then ENOSPC
	s, err := Open("db", heldFlushOptions(h))
	if err != nil {
		t.Fatal(err)
	}
	h.armed.Store(true)
	// Enough index writes for several memtables: with the first flush
	// held, the commits must stall (MemTableStopWritesThreshold 2).
	added := make(chan error, 1)
	go func() {
		for i := range 200_000 {
			j := newTestJob(s.NodeID(), "q", uint64(1000+i)*1_000_000, 60)
			if err := s.Add(j, []byte("b")); err != nil {
				added <- err
				return
			}
		}
		added <- nil
	}()
	within(t, "the first flush", h.blocked)
	// The commits wait for the flush: in the store's back-pressure (or,
	// as they once did, in Pebble's write stall under Store.mu).
	waitFor(t, "a commit waiting for the flush", func() bool {
		return waitingForRoom("storage.(*Store).apply", mine) ||
			stackContains("maybeInduceWriteStall", "storage.(*Store).apply", mine)
	})
	h.let() // the flush fails: the store must fail, not hang
	select {
	case <-s.Failed():
	case <-time.After(10 * time.Second):
		t.Error("the store did not fail: s.fail waits for Store.mu, held by the stalled commit")
	}
	if err := within(t, "the stalled commit (Store.mu held for good)", added); !errors.Is(err, ErrFailed) {
		t.Errorf("the stalled Add returned %v, want ErrFailed", err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	within(t, "Close", done)
}
