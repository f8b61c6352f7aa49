package replication

import (
	"strings"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/queue"
)

// gateFS holds every fsync of an AOF segment while closed.
type gateFS struct {
	vfs.FS
	mu   sync.Mutex
	gate chan struct{} // nil: open
}

func (g *gateFS) close() {
	g.mu.Lock()
	g.gate = make(chan struct{})
	g.mu.Unlock()
}

func (g *gateFS) open() {
	g.mu.Lock()
	if g.gate != nil {
		close(g.gate)
		g.gate = nil
	}
	g.mu.Unlock()
}

func (g *gateFS) wait() {
	g.mu.Lock()
	c := g.gate
	g.mu.Unlock()
	if c != nil {
		<-c
	}
}

func (g *gateFS) wrap(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil || !strings.HasSuffix(name, ".wal") {
		return f, err
	}
	return gatedFile{File: f, g: g}, nil
}

func (g *gateFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := g.FS.Create(name, c)
	return g.wrap(name, f, err)
}

func (g *gateFS) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := g.FS.Open(name, opts...)
	return g.wrap(name, f, err)
}

func (g *gateFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := g.FS.OpenReadWrite(name, c, opts...)
	return g.wrap(name, f, err)
}

type gatedFile struct {
	vfs.File
	g *gateFS
}

func (f gatedFile) Sync() error     { f.g.wait(); return f.File.Sync() }
func (f gatedFile) SyncData() error { f.g.wait(); return f.File.SyncData() }

// TestSyncCopiesGoBeforeTheOriginsWrite: a synchronous ADDJOB's REPLJOBs
// do not wait for the origin's own durable write (appendfsync always):
// the replicas hold their copies while the origin's fsync is held, and
// the ADDJOB is answered only once it is released.
func TestSyncCopiesGoBeforeTheOriginsWrite(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	origin := c.nodes[0]
	g := &gateFS{FS: vfs.Default}
	c.close(origin)
	c.fsFor = func(nd *jobsNode) vfs.FS {
		if nd == origin {
			return g
		}
		return vfs.Default
	}
	c.open(origin)
	eventually(t, "the origin's links", func() bool {
		return origin.tr.Connected(c.nodes[1].id) && origin.tr.Connected(c.nodes[2].id)
	})
	g.close()
	defer g.open()
	done := make(chan queue.AddResult, 1)
	go func() { done <- addJob(t, origin, queue.AddRequest{Replicate: 3, Timeout: 20000}) }()
	eventually(t, "both copies while the origin's fsync is held", func() bool {
		return c.nodes[1].st.Stats().Jobs == 1 && c.nodes[2].st.Stats().Jobs == 1
	})
	select {
	case r := <-done:
		t.Fatalf("ADDJOB answered before the origin's write was durable: %+v", r)
	default:
	}
	g.open()
	r := <-done
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	if got := origin.state(t, r.ID); got != "queued" {
		t.Fatalf("origin: %q", got)
	}
}
