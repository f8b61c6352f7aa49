package storage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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

// heldFlush is a filesystem whose index table creations (a memtable
// flush) block once armed, until let, and then return err (nil: they
// succeed).
type heldFlush struct {
	fs      vfs.FS
	armed   atomic.Bool
	blocked chan struct{} // closed when the first flush blocks
	release chan struct{}
	once    sync.Once
	letOnce sync.Once
}

func newHeldFlush(err error) *heldFlush {
	h := &heldFlush{blocked: make(chan struct{}), release: make(chan struct{})}
	h.fs = errorfs.Wrap(vfs.NewMem(), errorfs.InjectorFunc(func(op errorfs.Op) error {
		if h.armed.Load() && op.Kind == errorfs.OpCreate && strings.HasSuffix(op.Path, ".sst") {
			h.once.Do(func() { close(h.blocked) })
			<-h.release
			return err
		}
		return nil
	}))
	return h
}

// let lets the blocked flush go on; a second let does nothing (a test
// defers one so that a failure does not leave Close waiting for the flush).
func (h *heldFlush) let() { h.letOnce.Do(func() { close(h.release) }) }

func heldFlushOptions(h *heldFlush) Options {
	opts := TestingOptions()
	opts.FS = h.fs
	opts.WriteBufferSize = -1 // every commit reaches the memtable at once
	opts.CheckpointInterval = -1
	opts.CheckpointBytes = 1 << 40
	return opts
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	waitForOrDump(t, what, cond, nil)
}

// waitForOrDump is waitFor that, at the deadline, logs every goroutine's
// stack and state() (if not nil) before it fails: a wait that times out
// in CI must say what was stuck where.
func waitForOrDump(t *testing.T, what string, cond func() bool, state func() string) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			if state != nil {
				t.Logf("state: %s", state())
			}
			t.Logf("goroutines:\n%s", allStacks())
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond) // polling a condition with a deadline
	}
}

// allStacks returns every goroutine's stack.
func allStacks() []byte {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return buf[:n]
		}
		buf = make([]byte, 2*len(buf))
	}
}

// state describes the room, for a test that timed out.
func (r *indexRoom) state() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return fmt.Sprintf("full=%v flushing=%v handed=%d memLimit=%d l0=%d l0Limit=%d stalls=%d stallStart=%v stallCount=%d stallTime=%v",
		r.full.Load(), r.flushing, r.handed, r.memLimit, r.l0, r.l0Limit, r.stalls, r.stallStart, r.stallCount, r.stallTime)
}

// within fails the test unless ch delivers within 10 s.
func within[T any](t *testing.T, what string, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: still blocked after 10 s", what)
		panic("unreachable")
	}
}

// TestBackPressureHoldsNoLock: commits outrun a slow memtable flush. They
// wait for it before Store.mu, so reads go on meanwhile, Pebble's memtables
// stay within about two of them (Pebble's own stop-writes threshold) and no
// commit waits inside Pebble; once the flush is done the commits go on.
// (When Pebble's write stall did the back-pressure, the commit waited in
// it holding Store.mu, and every read of the store waited too.)
func TestBackPressureHoldsNoLock(t *testing.T) {
	mine := "storage." + t.Name() // frames of this test's goroutines
	h := newHeldFlush(nil)
	opts := heldFlushOptions(h)
	s, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	first := newTestJob(s.NodeID(), "q", 999*1_000_000, 60)
	if err := s.Add(first, []byte("b")); err != nil {
		t.Fatal(err)
	}
	h.armed.Store(true)
	var stop atomic.Bool
	var added atomic.Int64
	done := make(chan error, 1)
	go func() {
		for i := 0; !stop.Load(); i++ {
			j := newTestJob(s.NodeID(), "q", uint64(1000+i)*1_000_000, 60)
			if err := s.Add(j, []byte("b")); err != nil {
				done <- err
				return
			}
			added.Add(1)
		}
		done <- nil
	}()
	within(t, "the first flush", h.blocked)
	waitFor(t, "a commit waiting for the flush", func() bool {
		return waitingForRoom("storage.(*Store).apply", mine) ||
			stackContains("maybeInduceWriteStall", "storage.(*Store).apply", mine)
	})
	if stackContains("maybeInduceWriteStall", mine) {
		t.Error("a commit waits in Pebble's write stall")
	}
	// A read takes Store.mu: free while the commit waits.
	read := make(chan error, 1)
	go func() {
		j, err := s.Job(first.ID)
		if err == nil && j == nil {
			err = errors.New("job not found")
		}
		read <- err
	}()
	if err := within(t, "a read while a commit waits for the flush", read); err != nil {
		t.Fatal(err)
	}
	if m := s.db.Metrics().MemTable; m.Size > 3*opts.MemTableSize {
		t.Errorf("memtables: %d of %d bytes, want at most 3 × MemTableSize while the flush is held", m.Count, m.Size)
	}
	before := added.Load()
	h.let() // the flush succeeds
	waitFor(t, "commits after the flush", func() bool { return added.Load() > before+100 })
	stop.Store(true)
	if err := within(t, "the writer", done); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestCheckpointFlushFails: a checkpoint's index flush waits behind a
// flush that then fails. The checkpoint returns ErrFailed and Close ends.
// (Pebble's AsyncFlush stalled, with two memtables queued, for a flush that
// never came, holding the checkpoint's locks and the pin Close waits for.)
func TestCheckpointFlushFails(t *testing.T) {
	mine := "storage." + t.Name() // frames of this test's goroutines
	h := newHeldFlush(syscall.EIO)
	opts := heldFlushOptions(h)
	s, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	h.armed.Store(true)
	// Commits until two memtables' worth is queued (Pebble's stall), or
	// until they wait in the store's back-pressure.
	done := make(chan error, 1)
	var stopped atomic.Bool
	go func() {
		defer stopped.Store(true)
		for i := 0; ; i++ {
			j := newTestJob(s.NodeID(), "q", uint64(1000+i)*1_000_000, 60)
			if err := s.Add(j, []byte("b")); err != nil {
				done <- err
				return
			}
			if i%20 == 0 && s.db.Metrics().MemTable.Size >= 2*opts.MemTableSize {
				done <- nil
				return
			}
		}
	}()
	within(t, "the first flush", h.blocked)
	waitFor(t, "the writer to stop or wait", func() bool {
		return stopped.Load() || waitingForRoom("storage.(*Store).apply", mine)
	})
	ckpt := make(chan error, 1)
	go func() { ckpt <- s.Checkpoint() }()
	waitFor(t, "the checkpoint to wait for the flush", func() bool {
		return waitingForRoom("storage.(*Store).Checkpoint", mine) ||
			stackContains("storage.(*Store).flushIndex", "storage.(*Store).Checkpoint", mine) ||
			stackContains("maybeInduceWriteStall", "storage.(*Store).Checkpoint", mine)
	})
	h.let()
	within(t, "Failed()", s.Failed())
	if err := within(t, "the checkpoint", ckpt); !errors.Is(err, ErrFailed) {
		t.Errorf("Checkpoint: %v, want ErrFailed", err)
	}
	if err := within(t, "the writer", done); err != nil && !errors.Is(err, ErrFailed) {
		t.Errorf("the writer: %v, want nil or ErrFailed", err)
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	within(t, "Close", closed)
}

// TestBackPressureL0: with L0 at the store's stop-writes limit (lowered
// here from 36) and compactions held, a commit waits before Store.mu;
// reads go on; once a compaction runs, the commit goes on.
func TestBackPressureL0(t *testing.T) {
	mine := "storage." + t.Name() // frames of this test's goroutines
	opts := TestingOptions()
	opts.FS = vfs.NewMem()
	s, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const limit = 13 // past the 12 sublevels at which Pebble compacts L0 (L0CompactionThreshold 24)
	s.room.mu.Lock()
	s.room.l0Limit = limit
	s.room.mu.Unlock()
	g := s.gate
	g.mu.Lock()
	g.open = false // no compaction starts
	g.mu.Unlock()
	var last *Job
	for i := range limit {
		last = newTestJob(s.NodeID(), "q", uint64(1000+i)*1_000_000, 60)
		if err := s.Add(last, []byte("b")); err != nil {
			t.Fatal(err)
		}
		if err := s.Checkpoint(); err != nil { // one L0 table: one sublevel
			t.Fatal(err)
		}
	}
	waitFor(t, "the back-pressure to see L0 full", s.room.full.Load)
	added := make(chan error, 1)
	go func() {
		added <- s.Add(newTestJob(s.NodeID(), "q", 5000*1_000_000, 60), []byte("b"))
	}()
	waitFor(t, "the commit to wait for a compaction", func() bool {
		return waitingForRoom("storage.(*Store).apply", mine)
	})
	if j, err := s.Job(last.ID); err != nil || j == nil {
		t.Fatalf("a read while a commit waits: %v, %v", j, err)
	}
	select {
	case err := <-added:
		t.Fatalf("the commit went on with L0 full: %v", err)
	default:
	}
	g.Open()
	if err := within(t, "the commit after a compaction", added); err != nil {
		t.Fatal(err)
	}
	if n := s.db.Metrics().Levels[0].Sublevels; n >= limit {
		t.Errorf("L0 has %d sublevels after the compaction", n)
	}
}

// TestBackPressureWakesOnClose: a commit waiting for a flush that does not
// come (held) gets ErrClosed once Close begins, and Close ends, whether the
// flush then succeeds or fails. Writers let through once Close began
// filled memtables up to Pebble's own stall, under mu, during Close's
// checkpoint: with the flush failing, the store could not be marked failed
// and Close hung (found by review).
func TestBackPressureWakesOnClose(t *testing.T) {
	for _, flushErr := range []error{nil, syscall.EIO} {
		t.Run(fmt.Sprint(flushErr), func(t *testing.T) { backPressureWakesOnClose(t, flushErr) })
	}
}

func backPressureWakesOnClose(t *testing.T, flushErr error) {
	mine := "storage.backPressureWakesOnClose" // frames of this test's goroutines
	h := newHeldFlush(flushErr)
	opts := heldFlushOptions(h)
	s, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	h.armed.Store(true)
	done := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			j := newTestJob(s.NodeID(), "q", uint64(1000+i)*1_000_000, 60)
			if err := s.Add(j, []byte("b")); err != nil {
				done <- err
				return
			}
		}
	}()
	within(t, "the first flush", h.blocked)
	waitFor(t, "a commit waiting for the flush", func() bool {
		return waitingForRoom("storage.(*Store).apply", mine)
	})
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	// Close's checkpoint waits for the held flush (for room, or in
	// flushIndex): let it end.
	waitFor(t, "Close to wait for the index flush", func() bool {
		return stackContains("storage.(*Store).flushIndex", "storage.(*Store).close", mine) ||
			waitingForRoom("storage.(*Store).close", mine)
	})
	if err := within(t, "the writer", done); !errors.Is(err, ErrClosed) {
		t.Errorf("the writer: %v, want ErrClosed", err)
	}
	h.let()
	err = within(t, "Close", closed)
	if flushErr == nil && err != nil {
		t.Fatal(err)
	}
	t.Logf("Close: %v", err)
}

// TestCompactOrderIndexFlushFails: CompactOrderIndex waits for the flush of
// the memtable it overlaps, and that flush fails. It returns ErrFailed and
// Close ends. (It waited for a flush that never came, holding the pin Close
// waits for.)
func TestCompactOrderIndexFlushFails(t *testing.T) {
	mine := "storage." + t.Name() // frames of this test's goroutines
	h := newHeldFlush(syscall.EIO)
	opts := heldFlushOptions(h)
	s, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		if err := s.Add(newTestJob(s.NodeID(), "q", uint64(1000+i)*1_000_000, 60), []byte("b")); err != nil {
			t.Fatal(err)
		}
	}
	h.armed.Store(true)
	compacted := make(chan error, 1)
	go func() { compacted <- s.CompactOrderIndex(t.Context()) }()
	within(t, "the first flush", h.blocked)
	waitFor(t, "the compaction to wait for its flush", func() bool {
		return stackContains("storage.(*Store).CompactOrderIndex", mine)
	})
	h.let()
	within(t, "Failed()", s.Failed())
	if err := within(t, "CompactOrderIndex", compacted); !errors.Is(err, ErrFailed) {
		t.Errorf("CompactOrderIndex: %v, want ErrFailed", err)
	}
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	within(t, "Close", closed)
}

// stallLog keeps the messages of the WARN records logged.
type stallLog struct {
	mu   sync.Mutex
	msgs []string
}

func (h *stallLog) Enabled(context.Context, slog.Level) bool { return true }
func (h *stallLog) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h *stallLog) WithGroup(string) slog.Handler            { return h }
func (h *stallLog) Handle(_ context.Context, r slog.Record) error {
	if r.Level < slog.LevelWarn {
		return nil
	}
	msg := r.Message
	r.Attrs(func(a slog.Attr) bool { msg += " " + a.String(); return true })
	h.mu.Lock()
	h.msgs = append(h.msgs, msg)
	h.mu.Unlock()
	return nil
}

func (h *stallLog) find(substr string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, m := range h.msgs {
		if strings.Contains(m, substr) {
			return m
		}
	}
	return ""
}

// TestBackPressureStallIsCountedAndLogged: writers that wait for a held
// memtable flush make one stall, counted in Stats with its length and
// logged at WARN with its cause once it ends (a fill once waited 37.8 s
// behind the index with nothing in the log).
func TestBackPressureStallIsCountedAndLogged(t *testing.T) {
	h := newHeldFlush(nil)
	opts := heldFlushOptions(h)
	logs := &stallLog{}
	opts.Logger = slog.New(logs)
	s, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	defer h.let()
	s.room.mu.Lock()
	s.room.logAfter = 0 // every stall is logged
	s.room.mu.Unlock()
	if st := s.Stats(); st.IndexStalls != 0 || st.IndexStallTime != 0 {
		t.Fatalf("a new store reports %d stalls (%v)", st.IndexStalls, st.IndexStallTime)
	}
	h.armed.Store(true)
	var stop atomic.Bool
	done := make(chan error, 1)
	go func() {
		for i := 0; !stop.Load(); i++ {
			if err := s.Add(newTestJob(s.NodeID(), "q", uint64(1000+i)*1_000_000, 60), []byte("b")); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	within(t, "the first flush", h.blocked)
	waitFor(t, "a commit waiting for the flush", func() bool {
		return waitingForRoom("storage." + t.Name())
	})
	if st := s.Stats(); st.IndexStalls != 0 {
		t.Fatalf("%d stalls counted while the first is still going on", st.IndexStalls)
	}
	h.let()
	waitForOrDump(t, "the stall to end", func() bool { return s.Stats().IndexStalls > 0 }, func() string {
		m := s.db.Metrics()
		return fmt.Sprintf("%s; pebble: memtables %d (%d bytes), flushes %d, L0 sublevels %d",
			s.room.state(), m.MemTable.Count, m.MemTable.Size, m.Flush.Count, m.Levels[0].Sublevels)
	})
	stop.Store(true)
	if err := within(t, "the writer", done); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.IndexStallTime <= 0 {
		t.Errorf("%d stalls of %v in all", st.IndexStalls, st.IndexStallTime)
	}
	waitFor(t, "the stall's log line", func() bool { return logs.find("index write stall ended") != "" })
	if m := logs.find("index write stall ended"); !strings.Contains(m, "memtable flush") {
		t.Errorf("the stall's log line names no cause: %q", m)
	}
}
