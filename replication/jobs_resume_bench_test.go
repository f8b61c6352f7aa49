package replication

import (
	"flag"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
	"github.com/diskque/diskque/wal"
)

var benchResumeJobs = flag.Int("bench.resumejobs", 200_000, "BenchmarkResumeBacklog: replica copies in the node's store")

// fixedPeers is membership that knows a fixed set of nodes, all reachable.
type fixedPeers struct{ self, others []string }

func (p fixedPeers) Nodes() []NodeInfo {
	out := []NodeInfo{{ID: p.self[0], Myself: true}}
	for _, n := range p.others {
		out = append(out, NodeInfo{ID: n})
	}
	return out
}

func (p fixedPeers) Reachable() []NodeInfo { return p.Nodes()[1:] }

// BenchmarkResumeBacklog measures a clustered node's Jobs.Start on a store
// holding a backlog of replica copies (-bench.resumejobs, active) and ten
// acked jobs: the resume that runs before the node serves. It reports the
// Start time and what it found to resume; the store's Open (its replay)
// is outside the timer.
//
//	go test -run '^$' -bench BenchmarkResumeBacklog -benchtime 5x -bench.resumejobs 1000000 ./replication
func BenchmarkResumeBacklog(b *testing.B) {
	dir := b.TempDir()
	opts := storage.DefaultOptions()
	opts.FS, opts.Sync, opts.Logger = vfs.Default, wal.SyncNever, quietLog()
	st, err := storage.Open(dir, opts)
	if err != nil {
		b.Fatal(err)
	}
	self := st.NodeID()
	other := []string{"ffffffffffffffffffffffffffffffffffffffff", "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee"}
	nodes := []string{other[0], self, other[1]}
	body := make([]byte, 100)
	now := time.Now().UnixMilli()
	var clock storage.CtimeClock
	batch := st.NewBatch()
	for i := range *benchResumeJobs {
		j := &storage.Job{ID: storage.NewJobID(other[0], 86400, 60), Queue: "bench", State: storage.StateActive,
			Ctime: clock.Next(now), Etime: now + 86_400_000, Retry: 60, Repl: 3, QueueTime: now + 3_600_000,
			Nodes: nodes}
		if err := batch.AddReplica(j, body); err != nil {
			b.Fatal(err)
		}
		if i%(*benchResumeJobs/10) == 0 {
			batch.Ack(j.ID)
		}
		if batch.Len() >= 1000 || i == *benchResumeJobs-1 {
			for _, r := range st.Commit(batch) {
				if r.Err != nil {
					b.Fatal(r.Err)
				}
			}
			batch.Reset()
		}
	}
	if err := st.Close(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	var took time.Duration
	for range b.N {
		b.StopTimer()
		st, err := storage.Open(dir, opts)
		if err != nil {
			b.Fatal(err)
		}
		jobs, err := NewJobs(JobsConfig{ID: self, Peers: fixedPeers{[]string{self}, other}, Logger: quietLog(), AckRetryTick: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		broker, err := queue.New(queue.Options{Store: st, Cluster: jobs, Logger: quietLog()})
		if err != nil {
			b.Fatal(err)
		}
		go broker.Run()
		tr := NewMemNetwork().Join(self, jobs.Handle)
		b.StartTimer()
		start := time.Now()
		if err := jobs.Start(broker, tr); err != nil {
			b.Fatal(err)
		}
		took += time.Since(start)
		b.StopTimer()
		if n := jobs.pendingAcks(); n != 10 {
			b.Fatalf("resume found %d acked jobs, want 10", n)
		}
		jobs.Close()
		tr.Close()
		broker.Close()
		if err := st.Close(); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(took.Milliseconds())/float64(b.N), "start-ms")
	b.ReportMetric(0, "ns/op")
}

// pendingAcks is the number of acked jobs whose collection is running.
func (j *Jobs) pendingAcks() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.acks.len()
}
