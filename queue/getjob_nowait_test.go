package queue

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/storage"
)

// syncGateFS holds every fsync of an AOF segment (a .wal file) while
// closed; everything else goes to the real filesystem.
type syncGateFS struct {
	vfs.FS
	mu   sync.Mutex
	gate chan struct{} // nil: open
}

func (g *syncGateFS) hold() {
	g.mu.Lock()
	g.gate = make(chan struct{})
	g.mu.Unlock()
}

func (g *syncGateFS) release() {
	g.mu.Lock()
	if g.gate != nil {
		close(g.gate)
		g.gate = nil
	}
	g.mu.Unlock()
}

func (g *syncGateFS) wait() {
	g.mu.Lock()
	c := g.gate
	g.mu.Unlock()
	if c != nil {
		<-c
	}
}

func (g *syncGateFS) wrap(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil || !strings.HasSuffix(name, ".wal") {
		return f, err
	}
	return syncGatedFile{File: f, g: g}, nil
}

func (g *syncGateFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := g.FS.Create(name, c)
	return g.wrap(name, f, err)
}

func (g *syncGateFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := g.FS.OpenReadWrite(name, c, opts...)
	return g.wrap(name, f, err)
}

type syncGatedFile struct {
	vfs.File
	g *syncGateFS
}

func (f syncGatedFile) Sync() error     { f.g.wait(); return f.File.Sync() }
func (f syncGatedFile) SyncData() error { f.g.wait(); return f.File.SyncData() }

// openGated opens a store (appendfsync always) and a broker on dir, the
// AOF's fsyncs going through g.
func openGated(t *testing.T, g *syncGateFS, dir string) (*storage.Store, *Broker) {
	t.Helper()
	opts := storage.TestingOptions()
	opts.FS = g
	st, err := storage.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(Options{Store: st})
	if err != nil {
		st.Close()
		t.Fatal(err)
	}
	return st, b
}

type getResult struct {
	d   []Delivered
	err error
}

// TestGetJobOfAtLeastOnceJobRepliesBeforeItsRecordIsDurable: under
// appendfsync always, with the AOF's fsync held, a GETJOB of an
// at-least-once job is answered (its delivery applied and its record
// queued, not waited for), while a GETJOB of an at-most-once job and the
// ACKJOB of the first job wait for the fsync. After a restart the AOF
// holds them in order: the acked job is gone, the at-most-once job is
// delivered (active), never queued again.
func TestGetJobOfAtLeastOnceJobRepliesBeforeItsRecordIsDurable(t *testing.T) {
	g := &syncGateFS{FS: vfs.Default}
	dir := t.TempDir()
	st, b := openGated(t, g, dir)
	closed := false
	defer func() {
		g.release()
		if !closed {
			b.Close()
			st.Close()
		}
	}()
	add := func(q string, retry int64) string {
		res := b.AddJobs([]AddRequest{{Queue: q, Body: []byte("body-" + q), TTL: 3600, Retry: retry}})
		if res[0].Err != nil {
			t.Fatal(res[0].Err)
		}
		return res[0].ID
	}
	alo := add("alo", 30)
	amo := add("amo", 0)

	g.hold()
	get := func(q string) <-chan getResult {
		ch := make(chan getResult, 1)
		go func() {
			d, err := b.GetJobs(context.Background(), GetRequest{Queues: []string{q}, Count: 1, NoHang: true})
			ch <- getResult{d, err}
		}()
		return ch
	}
	select {
	case r := <-get("alo"):
		if r.err != nil || len(r.d) != 1 || r.d[0].ID != alo || string(r.d[0].Body) != "body-alo" {
			t.Fatalf("GETJOB alo = %+v, %v", r.d, r.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("GETJOB of an at-least-once job waited for the AOF's fsync")
	}

	amoGot := get("amo")
	waitFor(t, "the at-most-once job's delivery applied", func() bool {
		j, err := st.Job(amo)
		return err == nil && j.State == storage.StateActive
	})
	acked := make(chan error, 1)
	go func() { _, err := b.Ack([]string{alo}); acked <- err }()
	waitFor(t, "the ACKJOB applied", func() bool {
		j, err := st.Job(alo)
		return err == nil && j.State == storage.StateAcked || err != nil
	})
	select {
	case r := <-amoGot:
		t.Fatalf("GETJOB of an at-most-once job answered before its delivery was fsynced: %+v, %v", r.d, r.err)
	case err := <-acked:
		t.Fatalf("ACKJOB answered before its record was fsynced: %v", err)
	default:
	}

	g.release()
	if r := <-amoGot; r.err != nil || len(r.d) != 1 || r.d[0].ID != amo {
		t.Fatalf("GETJOB amo = %+v, %v", r.d, r.err)
	}
	if err := <-acked; err != nil {
		t.Fatal(err)
	}

	b.Close()
	st.Close()
	closed = true
	st, b = openGated(t, g, dir)
	closed = false
	if j, err := st.Job(alo); err == nil && j.State != storage.StateAcked {
		t.Errorf("acked at-least-once job after a restart: %s, want acked or gone", j.State)
	}
	j, err := st.Job(amo)
	if err != nil || j.State != storage.StateActive {
		t.Fatalf("at-most-once job after a restart: %+v, %v, want active", j, err)
	}
	if n := b.QueueLen("amo"); n != 0 {
		t.Fatalf("at-most-once job queued again after a restart: QLEN %d", n)
	}
}
