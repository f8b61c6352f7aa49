package storage

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// countingHandler counts the log records at WARN or above, and those of
// Pebble at any level (one per failed flush, before the fence blocked).
type countingHandler struct{ warns, pebble atomic.Int64 }

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		h.warns.Add(1)
	}
	if strings.HasPrefix(r.Message, "pebble") {
		h.pebble.Add(1)
	}
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }

// idleWindow is how long the fence tests watch a failed store for a busy
// loop: a measurement window, not a wait for anything. A loop makes
// thousands of attempts in it; an idle store makes one or two.
const idleWindow = 300 * time.Millisecond

// fencedStore is a store whose every commit reaches Pebble's memtable at
// once, on a filesystem that fails AOF writes while failAOF is set and
// index file creations while failIndex is; indexCreates counts the index
// files Pebble created or tried to.
type fencedStore struct {
	*Store
	failAOF, failIndex atomic.Bool
	indexCreates       atomic.Int64
	log                *countingHandler
}

func openFencedStore(t *testing.T) *fencedStore {
	t.Helper()
	f := &fencedStore{log: &countingHandler{}}
	efs := errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
		switch {
		case strings.HasSuffix(op.Path, ".wal") && op.Kind.ReadOrWrite() == errorfs.OpIsWrite && f.failAOF.Load():
			return errorfs.ErrInjected
		case strings.Contains(op.Path, "/"+indexDir+"/") && op.Kind == errorfs.OpCreate:
			f.indexCreates.Add(1)
			if f.failIndex.Load() {
				return syscall.ENOENT // as when the data directory was removed
			}
		}
		return nil
	}))
	opts := TestingOptions()
	opts.FS = efs
	opts.WriteBufferSize = -1
	opts.Logger = slog.New(f.log)
	s, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	f.Store = s
	for i := range 50 {
		j := newTestJob(s.NodeID(), "q", uint64(1000+i)*1_000_000, 60)
		if err := s.Add(j, []byte("body")); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// attempts is how many times Pebble's creation of an index file reached
// the disk (a call held at the fence does not).
func (f *fencedStore) attempts() int64 { return f.indexCreates.Load() }

// closeWithin closes the store, failing the test if that takes 10 s.
func (f *fencedStore) closeWithin(t *testing.T) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- f.Close() }()
	select {
	case err := <-done:
		t.Logf("close: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("Close of the failed store hangs")
	}
}

// TestFencedIndexIdles: after an AOF failure fences the index, a flush
// pending in Pebble (which retries a failed flush at once, for ever) waits
// at the fence instead of spinning, the log stays quiet, and Close returns.
func TestFencedIndexIdles(t *testing.T) {
	f := openFencedStore(t)
	f.failAOF.Store(true)
	j := newTestJob(f.NodeID(), "q", 5000*1_000_000, 60)
	if err := f.Add(j, []byte("lost")); !errors.Is(err, ErrFailed) {
		t.Fatalf("Add with a failing AOF: %v, want ErrFailed", err)
	}
	// The memtable holds the failed Add: Pebble must not persist it.
	if _, err := f.db.AsyncFlush(); err != nil {
		t.Fatal(err)
	}
	before, warns, pebbleLines := f.attempts(), f.log.warns.Load(), f.log.pebble.Load()
	time.Sleep(idleWindow) // measurement window, see idleWindow
	tries, lines := f.attempts()-before, f.log.warns.Load()-warns
	pebbleLines = f.log.pebble.Load() - pebbleLines
	t.Logf("in %v: %d index file creations tried, %d log lines at WARN+, %d from Pebble", idleWindow, tries, lines, pebbleLines)
	if tries >= 10 || pebbleLines >= 10 {
		t.Errorf("a fenced index with a pending flush tried to create %d files and logged %d lines in %v: a busy loop",
			tries, pebbleLines, idleWindow)
	}
	if lines > 3 {
		t.Errorf("%d log lines in %v from an idle failed store", lines, idleWindow)
	}
	f.closeWithin(t)
}

// TestIndexIOErrorFailsStore: an I/O error on the index's own files (here
// the creation of every table fails, as when the data directory is removed
// under a running server) fails the store with ErrIndexFailed — writes are
// refused, reads go on — instead of Pebble retrying the flush in a loop and
// logging an error each time; and Close returns.
func TestIndexIOErrorFailsStore(t *testing.T) {
	f := openFencedStore(t)
	f.failIndex.Store(true)
	if _, err := f.db.AsyncFlush(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-f.Failed():
	case <-time.After(10 * time.Second):
		t.Fatalf("the store did not fail after the index could not create its files (%d attempts)", f.attempts())
	}
	if err := f.Err(); !errors.Is(err, ErrIndexFailed) {
		t.Fatalf("Err: %v, want ErrIndexFailed", err)
	}
	j := newTestJob(f.NodeID(), "q", 5000*1_000_000, 60)
	if err := f.Add(j, []byte("x")); !errors.Is(err, ErrFailed) {
		t.Fatalf("Add on a store whose index failed: %v, want ErrFailed", err)
	}
	if n := f.QueueLen("q"); n != 50 {
		t.Fatalf("QueueLen %d, want 50", n)
	}
	if _, err := f.QueueRange("q", QueuePos{}, 10); err != nil {
		t.Fatalf("QueueRange on the failed store: %v", err)
	}
	before, warns := f.attempts(), f.log.warns.Load()
	time.Sleep(idleWindow) // measurement window, see idleWindow
	tries, lines := f.attempts()-before, f.log.warns.Load()-warns
	t.Logf("in %v: %d index file creations tried, %d log lines at WARN+", idleWindow, tries, lines)
	if tries >= 10 || lines > 3 {
		t.Errorf("a failed index tried %d file creations and logged %d lines in %v", tries, lines, idleWindow)
	}
	f.closeWithin(t)
}
