package replication

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
)

// syncGateFS holds every fsync of a file under dir while closed: a node
// whose AOF cannot become durable (appendfsync always) until the test
// says so.
type syncGateFS struct {
	vfs.FS
	mu      sync.Mutex
	dir     string
	gate    chan struct{} // nil: open
	entered chan struct{} // closed at the first fsync held
}

func (g *syncGateFS) close(dir string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.dir, g.gate, g.entered = dir, make(chan struct{}), make(chan struct{})
}

func (g *syncGateFS) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.gate != nil {
		close(g.gate)
	}
	g.gate = nil
}

func (g *syncGateFS) hold(name string) {
	g.mu.Lock()
	gate, entered := g.gate, g.entered
	if gate == nil || !strings.HasPrefix(name, g.dir) {
		g.mu.Unlock()
		return
	}
	select {
	case <-entered:
	default:
		close(entered)
	}
	g.mu.Unlock()
	<-gate
}

func (g *syncGateFS) wrap(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil {
		return nil, err
	}
	return &syncGateFile{File: f, name: name, g: g}, nil
}

func (g *syncGateFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := g.FS.Create(name, c)
	return g.wrap(name, f, err)
}

func (g *syncGateFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := g.FS.OpenReadWrite(name, c, opts...)
	return g.wrap(name, f, err)
}

func (g *syncGateFS) ReuseForWrite(old, name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := g.FS.ReuseForWrite(old, name, c)
	return g.wrap(name, f, err)
}

type syncGateFile struct {
	vfs.File
	name string
	g    *syncGateFS
}

func (f *syncGateFile) Sync() error     { f.g.hold(f.name); return f.File.Sync() }
func (f *syncGateFile) SyncData() error { f.g.hold(f.name); return f.File.SyncData() }
func (f *syncGateFile) SyncTo(n int64) (bool, error) {
	f.g.hold(f.name)
	return f.File.SyncTo(n)
}

// TestAnswerNeedJobsSendsAtLeastOnceJobsBeforeTheGiversFsync: under
// appendfsync always, with the giver's fsyncs held, AnswerNeedJobs hands
// at-least-once jobs to send at once (they stay active here with their
// requeue timer, the asker among their nodes: a crash that forgot the
// dequeue would only deliver them again), and returns only once the fsync
// is done; at-most-once jobs are handed over only once their delivery
// here is fsynced and they are deleted here (a crash must not queue them
// here again).
func TestAnswerNeedJobsSendsAtLeastOnceJobsBeforeTheGiversFsync(t *testing.T) {
	gate := &syncGateFS{FS: vfs.Default}
	c := newTestClusterFS(t, 2, 20*time.Millisecond, nil, gate)
	t.Cleanup(gate.open) // before the nodes close, should the test fail with the gate shut
	for _, nd := range c.nodes {
		if err := nd.broker.Tick(time.Now().UnixMilli()); err != nil {
			t.Fatal(err)
		}
	}
	a, b := c.nodes[0], c.nodes[1]
	for range 10 {
		if r := addJob(t, a, queue.AddRequest{Replicate: 1}); r.Err != nil {
			t.Fatal(r.Err)
		}
	}
	for _, q := range []string{"q", "once"} {
		if q == "once" {
			for range 10 {
				r := a.broker.AddJobs([]queue.AddRequest{{Queue: "once", Body: []byte("b"), TTL: 3600, Retry: 0, Replicate: 1}})[0]
				if r.Err != nil {
					t.Fatal(r.Err)
				}
			}
		}
		gate.close(a.dir)
		sent := make(chan []queue.Replica, 1)
		done := make(chan error, 1)
		go func() {
			done <- a.broker.AnswerNeedJobs(b.id, q, 5, func(jobs []queue.Replica) { sent <- jobs })
		}()
		<-gate.entered // the answer's records wait for their fsync
		var jobs []queue.Replica
		if q == "q" {
			select {
			case jobs = <-sent:
			case <-time.After(10 * time.Second):
				t.Fatal("at-least-once jobs not sent while the giver's fsync is held")
			}
			select {
			case err := <-done:
				t.Fatalf("AnswerNeedJobs returned (%v) before its fsync", err)
			default:
			}
			for _, r := range jobs {
				j, err := a.st.Job(r.Job.ID)
				if err != nil || j.State != storage.StateActive || !strings.Contains(strings.Join(j.Nodes, ","), b.id) {
					t.Fatalf("a job sent is not active here with the asker among its nodes: %+v, %v", j, err)
				}
			}
		} else {
			select {
			case <-sent:
				t.Fatal("at-most-once jobs sent before their delivery here was fsynced")
			case <-time.After(50 * time.Millisecond): // a bound on a wrong early send, not a synchronisation
			}
		}
		gate.open()
		if q == "once" {
			jobs = <-sent
			for _, r := range jobs {
				if _, err := a.st.Job(r.Job.ID); err == nil {
					t.Fatalf("at-most-once job %s sent but still here", r.Job.ID)
				}
			}
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if len(jobs) != 5 {
			t.Fatalf("%s: %d jobs sent, want 5", q, len(jobs))
		}
	}
}
