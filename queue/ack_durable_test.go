package queue

import (
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/diskque/diskque/storage"
	"github.com/diskque/diskque/wal"
)

// ackCluster is a node of a three-node cluster as ACKJOB and FASTACK see
// it: the jobs they hand over are recorded, nothing is sent.
type ackCluster struct {
	loneNode
	mu    sync.Mutex
	acked []string
	fast  []string
}

func (c *ackCluster) KnownNodes() int { return 3 }

func (c *ackCluster) Acked(jobs []*storage.Job) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, j := range jobs {
		c.acked = append(c.acked, j.ID)
	}
}

func (c *ackCluster) FastAcked(jobs []*storage.Job, unknown []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, j := range jobs {
		c.fast = append(c.fast, j.ID)
	}
	c.fast = append(c.fast, unknown...)
}

// gatedBroker is a broker on a real directory under appendfsync always
// whose AOF fsyncs the returned gate holds once armed.
func gatedBroker(t *testing.T, cluster Cluster) (*Broker, *storage.Store, *aofSyncGate) {
	t.Helper()
	gate := &aofSyncGate{release: make(chan struct{})}
	opts := storage.TestingOptions()
	opts.FS = errorfs.Wrap(vfs.Default, gate)
	opts.Sync = wal.SyncAlways
	opts.Logger = slog.New(slog.DiscardHandler)
	st, err := storage.Open(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(Options{Store: st, Logger: opts.Logger, Cluster: cluster})
	if err != nil {
		st.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if gate.armed.Load() {
			gate.armed.Store(false)
			close(gate.release)
		}
		b.Close()
		st.Close()
	})
	return b, st, gate
}

// TestRepliesWaitForTheChangeTheyReport: an ACKJOB, FASTACK or DELJOB that
// finds its job acked or deleted already by a command whose write is not
// durable yet (its fsync held) writes nothing itself, and must still not
// answer before that write is durable (appendfsync always): answered at
// once, a crash before the fsync brings the job back while the client was
// told it is acked or gone. The first command is held at the gate, the
// second must be too, and both answer once the gate opens.
func TestRepliesWaitForTheChangeTheyReport(t *testing.T) {
	type cmd func(b *Broker, id string) (int, error)
	ack := func(b *Broker, id string) (int, error) { return b.Ack([]string{id}) }
	fast := func(b *Broker, id string) (int, error) { return b.FastAck([]string{id}) }
	del := func(b *Broker, id string) (int, error) { return b.DelJob([]string{id}) }
	for _, tc := range []struct {
		name          string
		clustered     bool
		first, second cmd
		// done: the first command's change is applied (visible).
		done func(j *storage.Job, err error) bool
	}{
		{"ACKJOB twice in a cluster", true, ack, ack, isAcked},
		{"FASTACK twice in a cluster", true, fast, fast, isAcked},
		{"ACKJOB then FASTACK in a cluster", true, ack, fast, isAcked},
		{"ACKJOB then DELJOB in a cluster", true, ack, del, isAcked},
		{"ACKJOB twice on a lone node", false, ack, ack, isGone},
		{"DELJOB twice", false, del, del, isGone},
		{"DELJOB then ACKJOB in a cluster (dummy ack of an at-most-once id)", true, del, ack, isGone},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cl Cluster
			if tc.clustered {
				cl = &ackCluster{}
			}
			b, st, gate := gatedBroker(t, cl)
			id := heldByOthers(t, b, tc.clustered, strings.Contains(tc.name, "at-most-once"))
			gate.armed.Store(true)
			firstDone := make(chan error, 1)
			go func() {
				_, err := tc.first(b, id)
				firstDone <- err
			}()
			deadline := time.Now().Add(10 * time.Second)
			for !tc.done(st.Job(id)) {
				if time.Now().After(deadline) {
					t.Fatal("the first command's change was never applied")
				}
				time.Sleep(time.Millisecond)
			}
			secondDone := make(chan error, 1)
			go func() {
				_, err := tc.second(b, id)
				secondDone <- err
			}()
			select {
			case err := <-secondDone:
				t.Fatalf("the second command answered (%v) before the change it found was durable", err)
			case <-firstDone:
				t.Fatal("the gate did not hold the first command's fsync")
			case <-time.After(300 * time.Millisecond):
			}
			gate.armed.Store(false)
			close(gate.release)
			for _, ch := range []chan error{firstDone, secondDone} {
				if err := <-ch; err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

func isAcked(j *storage.Job, err error) bool { return err == nil && j.State == storage.StateAcked }
func isGone(_ *storage.Job, err error) bool  { return err != nil }

// heldByOthers adds a queued job: in a cluster a copy whose origin is
// another node (so an ack marks it acked, not deleted), on a lone node
// one of its own.
func heldByOthers(t *testing.T, b *Broker, clustered, atMostOnce bool) string {
	t.Helper()
	if !clustered {
		res := b.AddJobs([]AddRequest{{Queue: "q", Body: []byte("x"), TTL: 3600, Retry: 60, Replicate: 1}})
		if res[0].Err != nil {
			t.Fatal(res[0].Err)
		}
		return res[0].ID
	}
	origin := strings.Repeat("b", 40)
	retry := int64(60)
	if atMostOnce {
		retry = 0
	}
	id := storage.NewJobID(origin, 3600, retry)
	now := time.Now().UnixMilli()
	errs := b.ReplicaAdd([]Replica{{Job: &storage.Job{ID: id, Queue: "q", Ctime: uint64(now) * 1_000_000,
		Etime: now + 3_600_000, Retry: uint32(retry), Repl: 2, Nodes: []string{origin, b.NodeID()}}, Body: []byte("c")}})
	if errs[0] != nil {
		t.Fatal(errs[0])
	}
	return id
}
