package queue

import (
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/diskque/diskque/storage"
	"github.com/diskque/diskque/wal"
)

// aofSyncGate holds the AOF's fsyncs, once armed, until release is closed.
type aofSyncGate struct {
	armed   atomic.Bool
	release chan struct{}
}

func (g *aofSyncGate) MaybeError(op errorfs.Op) error {
	if g.armed.Load() && (aofSyncs{}).Evaluate(op) {
		<-g.release
	}
	return nil
}

func (g *aofSyncGate) String() string { return "aof-sync-gate" }

// TestRemoteCollectOfAnAckNotYetDurableWaitsForIt: a SETACK of a job whose
// ack (a local ACKJOB's, another SETACK's) is applied but not yet durable
// writes nothing — the job is acked already — and its GOTACK must still
// wait for that ack's durability: answered at once, a crash before the
// fsync un-acks the copy here while the collector, told it is acked,
// deletes the others, and the copy is requeued.
func TestRemoteCollectOfAnAckNotYetDurableWaitsForIt(t *testing.T) {
	gate := &aofSyncGate{release: make(chan struct{})}
	opts := storage.TestingOptions()
	opts.FS = errorfs.Wrap(vfs.Default, gate)
	opts.Sync = wal.SyncAlways
	opts.Logger = slog.New(slog.DiscardHandler)
	st, err := storage.Open(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	b, err := New(Options{Store: st, Logger: opts.Logger})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	res := b.AddJobs([]AddRequest{{Queue: "q", Body: []byte("x"), TTL: 3600, Retry: 60, Replicate: 1}})
	if res[0].Err != nil {
		t.Fatal(res[0].Err)
	}
	id := res[0].ID
	released := false
	defer func() {
		if !released {
			close(gate.release)
		}
	}()
	gate.armed.Store(true)
	_, first, err := b.RemoteCollect([]CollectOp{{ID: id}})
	if err != nil {
		t.Fatal(err)
	}
	firstDone := make(chan error, 1)
	go func() { firstDone <- first() }()
	got, second, err := b.RemoteCollect([]CollectOp{{ID: id}})
	if err != nil {
		t.Fatal(err)
	}
	if !got[0].Known || got[0].Job == nil {
		t.Fatalf("the second SETACK's outcome: %+v, want known with the job", got[0])
	}
	secondDone := make(chan error, 1)
	go func() { secondDone <- second() }()
	select {
	case err := <-secondDone:
		t.Fatalf("the second SETACK's durable returned (%v) while the ack it reports is not durable", err)
	case <-time.After(300 * time.Millisecond):
	}
	select {
	case <-firstDone:
		t.Fatal("the gate did not hold the first ack's fsync")
	default:
	}
	gate.armed.Store(false)
	close(gate.release)
	released = true
	for _, ch := range []chan error{firstDone, secondDone} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
}
