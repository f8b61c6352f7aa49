package replication

import (
	"strings"
	"sync"
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// syncGate holds every fsync of an AOF segment of a gatedFS while it is
// shut, as a slow disk holds an fsync. The one gated file system of the
// package's tests (a node's jobsNode.fs).
type syncGate struct {
	mu   sync.Mutex
	shut chan struct{} // nil: open
	held atomic.Int64  // fsyncs that waited at the gate
}

func (g *syncGate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut == nil {
		g.shut = make(chan struct{})
	}
}

func (g *syncGate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.shut != nil {
		close(g.shut)
		g.shut = nil
	}
}

func (g *syncGate) wait() {
	g.mu.Lock()
	ch := g.shut
	g.mu.Unlock()
	if ch != nil {
		g.held.Add(1)
		<-ch
	}
}

// gatedFS is the OS file system with the fsyncs of AOF segments (".wal")
// held by a gate.
type gatedFS struct {
	vfs.FS
	g *syncGate
}

func (fs gatedFS) wrap(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil || !strings.HasSuffix(name, ".wal") {
		return f, err
	}
	return syncGatedFile{f, fs.g}, nil
}

func (fs gatedFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, c)
	return fs.wrap(name, f, err)
}

func (fs gatedFS) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.Open(name, opts...)
	return fs.wrap(name, f, err)
}

func (fs gatedFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.OpenReadWrite(name, c, opts...)
	return fs.wrap(name, f, err)
}

func (fs gatedFS) ReuseForWrite(oldname, newname string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.ReuseForWrite(oldname, newname, c)
	return fs.wrap(newname, f, err)
}

type syncGatedFile struct {
	vfs.File
	g *syncGate
}

func (f syncGatedFile) Sync() error     { f.g.wait(); return f.File.Sync() }
func (f syncGatedFile) SyncData() error { f.g.wait(); return f.File.SyncData() }
