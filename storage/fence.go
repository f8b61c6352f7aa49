package storage

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// fenceFS is the filesystem the index sees. The store fences the index when
// it fails (see Store.failLocked): after an AOF failure the memtable may
// hold batches whose records never reached the log, and persisting them
// would put the index ahead of the log; after an I/O error on the index's
// own files there is nothing worth persisting either. Reopening recovers
// from what the log holds.
//
// Once fenced, the calls that create, rename or link files — every way
// Pebble persists a flush or a compaction — block until release, and then
// fail. Blocking, not failing, is what keeps a failed store idle: Pebble
// retries a failed flush at once and for ever (compaction.go flush: "TODO:
// count consecutive flush errors and backoff"), and compactions likewise, so
// an error returned at once made it spin (25,833 flushes in an idle second).
// A blocked flush or compaction holds no lock that reads need: Pebble
// releases DB.mu around that I/O, and no commit waits for it inside Pebble
// (the store's back-pressure waits outside every store lock and wakes on
// Failed: backpressure.go). Store.Close releases the fence just before
// it closes Pebble, whose Close marks the DB closed (so that nothing is
// rescheduled) and then waits for the flush and compactions that the
// release lets fail.
type fenceFS struct {
	vfs.FS
	cause    atomic.Pointer[error]
	released chan struct{} // closed by release
	once     sync.Once
	// written counts the bytes written to the files it opened for
	// writing (Store.DiskWrites).
	written atomic.Int64
}

func newFenceFS(fs vfs.FS) *fenceFS { return &fenceFS{FS: fs, released: make(chan struct{})} }

// fence makes file creation block from now on; the first cause is kept.
func (f *fenceFS) fence(err error) { f.cause.CompareAndSwap(nil, &err) }

// fenced reports whether fence was called.
func (f *fenceFS) fenced() bool { return f.cause.Load() != nil }

// release lets the blocked calls, and every later one, fail at once.
func (f *fenceFS) release() { f.once.Do(func() { close(f.released) }) }

// check returns nil if the index is not fenced; otherwise it waits for
// release and returns the fence's error.
func (f *fenceFS) check() error {
	p := f.cause.Load()
	if p == nil {
		return nil
	}
	<-f.released
	return fmt.Errorf("storage: index fenced after a failure: %w", *p)
}

func (f *fenceFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	return f.count(f.FS.Create(name, c))
}

func (f *fenceFS) Link(oldname, newname string) error {
	if err := f.check(); err != nil {
		return err
	}
	return f.FS.Link(oldname, newname)
}

func (f *fenceFS) Rename(oldname, newname string) error {
	if err := f.check(); err != nil {
		return err
	}
	return f.FS.Rename(oldname, newname)
}

func (f *fenceFS) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	return f.count(f.FS.ReuseForWrite(oldname, newname, c))
}

func (f *fenceFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	return f.count(f.FS.OpenReadWrite(name, c, opts...))
}

// count wraps a file opened for writing so that its writes are counted.
func (f *fenceFS) count(file vfs.File, err error) (vfs.File, error) {
	if err != nil {
		return nil, err
	}
	return countingFile{File: file, n: &f.written}, nil
}

// Unwrap lets Pebble find the underlying filesystem (for disk usage).
func (f *fenceFS) Unwrap() vfs.FS { return f.FS }
