package replication

import (
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
	"github.com/diskque/diskque/wal"
)

// TestCloseAfterAFailedStart: a Start whose resume fails (the daemon met
// this with a corrupt index: the scan of the jobs failed, and the node
// went to rebuild it) must still leave a Jobs that Close can close. It
// used to return before starting the ack loop, and Close waited for that
// loop for ever, so the node never reopened its store.
func TestCloseAfterAFailedStart(t *testing.T) {
	opts := storage.TestingOptions()
	opts.FS, opts.Sync, opts.Logger = vfs.Default, wal.SyncAlways, quietLog()
	st, err := storage.Open(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	b, err := queue.New(queue.Options{Store: st, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	b.Close()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	j, err := NewJobs(JobsConfig{ID: st.NodeID(), Peers: noPeers{}, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	tr := NewMemNetwork().Join(st.NodeID(), j.Handle)
	defer tr.Close()
	if err := j.Start(b, tr); err == nil {
		t.Fatal("Start over a closed store resumed nothing and said nothing")
	}
	closed := make(chan error, 1)
	go func() { closed <- j.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close after a failed Start did not return")
	}
}

// noPeers is a node alone.
type noPeers struct{}

func (noPeers) Nodes() []NodeInfo     { return nil }
func (noPeers) Reachable() []NodeInfo { return nil }
