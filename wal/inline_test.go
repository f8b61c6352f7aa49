package wal

import (
	"bytes"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// stackFS counts the segment writes made on a goroutine whose stack runs
// through Log.Wait (the caller's inline flush) and those made elsewhere
// (the writer goroutine).
type stackFS struct {
	vfs.FS
	inline, writer atomic.Int64
}

func (fs *stackFS) Create(name string, cat vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, cat)
	if err != nil {
		return nil, err
	}
	return &stackFile{File: f, fs: fs}, nil
}

func (fs *stackFS) OpenReadWrite(name string, cat vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.OpenReadWrite(name, cat, opts...)
	if err != nil {
		return nil, err
	}
	return &stackFile{File: f, fs: fs}, nil
}

type stackFile struct {
	vfs.File
	fs *stackFS
}

// WriteAt is how the log appends to a segment (appendFile); Write is how
// a segment's header is made.
func (f *stackFile) WriteAt(p []byte, off int64) (int, error) {
	buf := make([]byte, 64<<10)
	if bytes.Contains(buf[:runtime.Stack(buf, false)], []byte("wal.(*Log).Wait(")) {
		f.fs.inline.Add(1)
	} else {
		f.fs.writer.Add(1)
	}
	return f.File.WriteAt(p, off)
}

// TestWaitFlushesInline: a Wait whose records are pending while no flush
// runs writes them itself rather than waiting for the writer goroutine to
// be scheduled (at pipeline 1 that hand-off and the wake-up back were two
// waits for a CPU per commit). The writer, kicked by Enqueue, may still
// win the race for a flush now and then; it must not win every one of
// them, as it did when only the writer wrote. Under SyncAlways every
// Append is durable when it returns, whoever flushed it.
func TestWaitFlushesInline(t *testing.T) {
	for _, policy := range []SyncPolicy{SyncNever, SyncAlways} {
		opts := TestingOptions()
		opts.Sync = policy
		fs := &stackFS{FS: opts.FS}
		opts.FS = fs
		l, err := Open("db", opts)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 200 {
			_, end, err := l.Append(Record{Type: 1, Payload: []byte{byte(i)}})
			if err != nil {
				t.Fatal(err)
			}
			if policy == SyncAlways && l.Durable() < end {
				t.Fatalf("policy %d: Append %d returned at durable %d < its end %d", policy, i, l.Durable(), end)
			}
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if fs.inline.Load() == 0 {
			t.Fatalf("policy %d: none of 200 appends was written by its own Wait (%d by the writer)", policy, fs.writer.Load())
		}
		t.Logf("policy %d: %d writes inline, %d by the writer", policy, fs.inline.Load(), fs.writer.Load())
	}
}

// TestConcurrentWaitersShareFlushes: many goroutines appending under
// SyncAlways, with flushes now run by whichever waiter finds none running,
// still get every record durable before their Append returns, in one
// contiguous log that reopens with all of them, and share fsyncs.
func TestConcurrentWaitersShareFlushes(t *testing.T) {
	opts := TestingOptions()
	opts.Sync = SyncAlways
	mem := opts.FS.(*vfs.MemFS)
	l, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	const writers, each = 8, 100
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				_, end, err := l.Append(Record{Type: 1, Payload: []byte{byte(w), byte(i)}})
				if err == nil && l.Durable() < end {
					err = errNotDurable
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	fsyncs := l.Fsyncs()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	crashed, err := Open("db", Options{FS: mem.CrashClone(vfs.CrashCloneCfg{}), SegmentSize: opts.SegmentSize})
	if err != nil {
		t.Fatal(err)
	}
	defer crashed.Close()
	n := 0
	if err := crashed.ReplayAll(func(lsn, end LSN, r Record) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	if n != writers*each {
		t.Fatalf("after a crash the log holds %d records, want %d", n, writers*each)
	}
	t.Logf("%d appends, %d fsyncs", writers*each, fsyncs)
}

var errNotDurable = errorString("an Append under SyncAlways returned before its record was durable")

type errorString string

func (e errorString) Error() string { return string(e) }
