// Package spacefs is a filesystem with a size limit, for tests: a vfs.FS
// over another (usually the OS's, in a test's directory) that charges every
// byte its files grow by against a limit, fails the write that would pass
// it with ENOSPC, as a full disk does, and reports the room left as its
// free space. So a test can fill a "disk" of a few MiB without root, a
// tmpfs mount or waiting for a real disk to fill.
//
// It counts file contents only (not directories or metadata blocks), and
// only for files created or opened for writing through it.
package spacefs

import (
	"fmt"
	"io/fs"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// FS is a vfs.FS with a size limit. Its methods are safe for concurrent use.
type FS struct {
	vfs.FS
	limit atomic.Int64
	// refused counts the writes that got ENOSPC.
	refused atomic.Int64

	mu    sync.Mutex
	used  int64
	sizes map[string]int64 // the charged size of every file, by name
}

// New returns fs limited to limit bytes of file contents.
func New(fs vfs.FS, limit int64) *FS {
	f := &FS{FS: fs, sizes: map[string]int64{}}
	f.limit.Store(limit)
	return f
}

// SetLimit changes the limit (files already over it stay).
func (f *FS) SetLimit(n int64) { f.limit.Store(n) }

// Used returns the bytes the files hold.
func (f *FS) Used() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.used
}

// Free returns the bytes left below the limit (never negative).
func (f *FS) Free() int64 { return max(f.limit.Load()-f.Used(), 0) }

// Refused returns how many writes got ENOSPC.
func (f *FS) Refused() int64 { return f.refused.Load() }

// GetDiskUsage reports the limit as the disk's size and what is left below
// it as free.
func (f *FS) GetDiskUsage(string) (vfs.DiskUsage, error) {
	free := uint64(f.Free())
	limit := uint64(max(f.limit.Load(), 0))
	return vfs.DiskUsage{AvailBytes: free, TotalBytes: limit, UsedBytes: limit - free}, nil
}

// grow charges a file growing from its charged size to size; false (and no
// charge) if that passes the limit.
func (f *FS) grow(name string, size int64) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	old := f.sizes[name]
	if size <= old {
		return true
	}
	if f.used+size-old > f.limit.Load() {
		return false
	}
	f.used += size - old
	f.sizes[name] = size
	return true
}

func (f *FS) forget(name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.used -= f.sizes[name]
	delete(f.sizes, name)
}

func (f *FS) open(name string, file vfs.File, truncate bool) (vfs.File, error) {
	f.forget(name)
	if !truncate {
		if st, err := file.Stat(); err == nil {
			f.mu.Lock()
			f.sizes[name] = st.Size()
			f.used += st.Size()
			f.mu.Unlock()
		}
	}
	return &limitedFile{File: file, fs: f, name: name}, nil
}

func (f *FS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	file, err := f.FS.Create(name, c)
	if err != nil {
		return nil, err
	}
	return f.open(name, file, true)
}

func (f *FS) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	file, err := f.FS.OpenReadWrite(name, c, opts...)
	if err != nil {
		return nil, err
	}
	return f.open(name, file, false)
}

func (f *FS) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	file, err := f.FS.ReuseForWrite(oldname, newname, c)
	if err != nil {
		return nil, err
	}
	f.forget(oldname)
	return f.open(newname, file, true)
}

func (f *FS) Remove(name string) error {
	if err := f.FS.Remove(name); err != nil {
		return err
	}
	f.forget(name)
	return nil
}

func (f *FS) RemoveAll(dir string) error {
	if err := f.FS.RemoveAll(dir); err != nil {
		return err
	}
	prefix := strings.TrimSuffix(dir, string(os.PathSeparator)) + string(os.PathSeparator)
	f.mu.Lock()
	defer f.mu.Unlock()
	for name, n := range f.sizes {
		if name == dir || strings.HasPrefix(name, prefix) {
			f.used -= n
			delete(f.sizes, name)
		}
	}
	return nil
}

func (f *FS) Rename(oldname, newname string) error {
	if err := f.FS.Rename(oldname, newname); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.used -= f.sizes[newname]
	if n, ok := f.sizes[oldname]; ok {
		f.sizes[newname] = n
		delete(f.sizes, oldname)
	} else {
		delete(f.sizes, newname)
	}
	return nil
}

// Unwrap returns the filesystem underneath.
func (f *FS) Unwrap() vfs.FS { return f.FS }

// ErrNoSpace is what a write past the limit returns: ENOSPC, as a full disk.
var ErrNoSpace error = syscall.ENOSPC

// limitedFile charges its growth; a write that would pass the limit writes
// nothing and fails with ENOSPC inside a *fs.PathError, as os.File's do.
type limitedFile struct {
	vfs.File
	fs   *FS
	name string
	mu   sync.Mutex
	off  int64 // for Write
}

func (w *limitedFile) refuse(op string) error {
	w.fs.refused.Add(1)
	return &fs.PathError{Op: op, Path: w.name, Err: fmt.Errorf("spacefs: limit %d bytes: %w", w.fs.limit.Load(), ErrNoSpace)}
}

func (w *limitedFile) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.fs.grow(w.name, w.off+int64(len(p))) {
		return 0, w.refuse("write")
	}
	n, err := w.File.Write(p)
	w.off += int64(n)
	return n, err
}

func (w *limitedFile) WriteAt(p []byte, off int64) (int, error) {
	if !w.fs.grow(w.name, off+int64(len(p))) {
		return 0, w.refuse("write")
	}
	return w.File.WriteAt(p, off)
}
