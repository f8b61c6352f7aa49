package storage

import (
	"fmt"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// fenceFS is the filesystem the index sees. Once fenced it refuses to create
// or rename files, so Pebble can no longer flush a memtable or commit a
// compaction. The store fences the index when the AOF fails: the memtable may
// then hold batches whose records never reached the log, and persisting them
// would put the index ahead of the log. Reopening recovers from what the log
// holds.
type fenceFS struct {
	vfs.FS
	cause atomic.Pointer[error]
}

func (f *fenceFS) fence(err error) { f.cause.CompareAndSwap(nil, &err) }

func (f *fenceFS) check() error {
	if p := f.cause.Load(); p != nil {
		return fmt.Errorf("storage: index fenced after an aof failure: %w", *p)
	}
	return nil
}

func (f *fenceFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	return f.FS.Create(name, c)
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
	return f.FS.ReuseForWrite(oldname, newname, c)
}

func (f *fenceFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	return f.FS.OpenReadWrite(name, c, opts...)
}

// Unwrap lets Pebble find the underlying filesystem (for disk usage).
func (f *fenceFS) Unwrap() vfs.FS { return f.FS }
