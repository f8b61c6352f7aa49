package replication

import (
	"errors"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
)

// jobsOverMemStore opens a store in memory and a broker over it whose
// cluster is a Jobs (not started) seeing peers(the store's node id).
func jobsOverMemStore(t *testing.T, peers func(self string) Peers) (*storage.Store, *Jobs, *queue.Broker) {
	t.Helper()
	opts := storage.TestingOptions()
	opts.FS, opts.Logger = vfs.NewMem(), quietLog()
	st, err := storage.Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	j, err := NewJobs(JobsConfig{ID: st.NodeID(), Peers: peers(st.NodeID()), Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	b, err := queue.New(queue.Options{Store: st, Cluster: j, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	return st, j, b
}

// closeUnder closes the broker and the store under a Jobs not yet started,
// so that any read of the store by its Start fails.
func closeUnder(t *testing.T, st *storage.Store, b *queue.Broker) {
	t.Helper()
	b.Close()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
}

// onePeer says another node is reachable.
type onePeer struct{ self, other string }

func (p onePeer) Nodes() []NodeInfo {
	return []NodeInfo{{ID: p.self, Myself: true}, {ID: p.other}}
}
func (p onePeer) Reachable() []NodeInfo { return []NodeInfo{{ID: p.other}} }

// TestAddBeforeStart: the daemon serves clients a moment before the bus is
// up and the broker's Jobs started. A replicated ADDJOB then must get
// -NOREPL (no link to any node yet), not a nil transport's panic, and an
// ASYNC one is added or refused with -NOREPL, never a panic.
func TestAddBeforeStart(t *testing.T) {
	other := storage.NewNodeID()
	st, j, b := jobsOverMemStore(t, func(self string) Peers { return onePeer{self, other} })
	defer st.Close()
	defer j.Close()
	defer b.Close()
	res := b.AddJobs([]queue.AddRequest{
		{Queue: "q", Body: []byte("sync"), Replicate: 2, TTL: 60, Retry: 10, Timeout: 100},
		{Queue: "q", Body: []byte("async"), Replicate: 2, TTL: 60, Retry: 10, Async: true},
	})
	if !errors.Is(res[0].Err, queue.ErrNoRepl) {
		t.Fatalf("REPLICATE 2 before Start: %+v, want ErrNoRepl", res[0])
	}
	if res[1].Err != nil && !errors.Is(res[1].Err, queue.ErrNoRepl) {
		t.Fatalf("ASYNC REPLICATE 2 before Start: %v", res[1].Err)
	}
}

// TestLoneNodeSkipsTheResume: a node that knows no other node has nothing
// to resume (on a lone node ACKJOB deletes at once and no job waits for
// copies), and must not read every job before it serves: its Start does
// not touch the store. Here the store is closed, so a resume would fail.
func TestLoneNodeSkipsTheResume(t *testing.T) {
	st, j, b := jobsOverMemStore(t, func(string) Peers { return noPeers{} })
	closeUnder(t, st, b)
	tr := NewMemNetwork().Join(st.NodeID(), j.Handle)
	defer tr.Close()
	if err := j.Start(b, tr); err != nil {
		t.Fatalf("a lone node's Start read the store: %v", err)
	}
	j.Close()
}

// noPeers is a node alone.
type noPeers struct{}

func (noPeers) Nodes() []NodeInfo     { return nil }
func (noPeers) Reachable() []NodeInfo { return nil }
