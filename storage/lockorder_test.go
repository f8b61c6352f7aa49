package storage

import (
	"bytes"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// stackContains reports whether some goroutine's stack holds every one of
// frames.
func stackContains(frames ...string) bool {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	for g := range bytes.SplitSeq(buf, []byte("\n\n")) {
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
	mine := "storage." + t.Name() // frames of this test's goroutines
	var block atomic.Bool
	blocked := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	efs := errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
		if block.Load() && op.Kind == errorfs.OpCreate && strings.HasSuffix(op.Path, ".sst") {
			// The first flush of a table: slow, then ENOSPC.
			once.Do(func() { close(blocked) })
			<-release
			return syscall.ENOSPC
		}
		return nil
	}))
	opts := TestingOptions()
	opts.FS = efs
	opts.WriteBufferSize = -1 // every commit reaches the memtable at once
	opts.CheckpointInterval = -1
	opts.CheckpointBytes = 1 << 40
	s, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	block.Store(true)
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
	deadline := time.Now().Add(20 * time.Second)
	<-blocked
	// The commits wait for the flush: in the store's back-pressure (or,
	// as they once did, in Pebble's write stall under Store.mu).
	for !stackContains("storage.(*indexRoom).wait", "storage.(*Store).apply", mine) &&
		!stackContains("maybeInduceWriteStall", "storage.(*Store).apply", mine) {
		if time.Now().After(deadline) {
			t.Fatal("no commit waits for the flush")
		}
		time.Sleep(time.Millisecond) // polling a condition with a deadline
	}
	close(release) // the flush fails: the store must fail, not hang
	select {
	case <-s.Failed():
	case <-time.After(10 * time.Second):
		t.Error("the store did not fail: s.fail waits for Store.mu, held by the stalled commit")
	}
	select {
	case err := <-added:
		if !errors.Is(err, ErrFailed) {
			t.Errorf("the stalled Add returned %v, want ErrFailed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the stalled commit never returned (Store.mu held for good)")
	}
	done := make(chan error, 1)
	go func() { done <- s.Close() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close hangs")
	}
}
