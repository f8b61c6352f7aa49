package queue

import (
	"context"
	"flag"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/storage"
	"github.com/diskque/diskque/wal"
)

var benchMemtable = flag.Uint64("bench.memtable", 0, "storage MemTableSize for the benchmarks (0: default)")

func benchBroker(b *testing.B, policy wal.SyncPolicy) *Broker {
	opts := storage.DefaultOptions()
	opts.MemTableSize = *benchMemtable
	opts.FS = vfs.Default
	opts.Sync = policy
	st, err := storage.Open(b.TempDir(), opts)
	if err != nil {
		b.Fatal(err)
	}
	br, err := New(Options{Store: st})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { br.Close(); st.Close() })
	return br
}

// BenchmarkAddJobs is the ADDJOB path below RESP: 50 clients, each adding
// batches of `pipeline` jobs of 100 bytes (a pipelined connection's batch).
func BenchmarkAddJobs(b *testing.B) {
	for _, policy := range []wal.SyncPolicy{wal.SyncNever, wal.SyncAlways} {
		for _, pipeline := range []int{1, 16} {
			b.Run(fmt.Sprintf("policy=%s/pipeline=%d", policy, pipeline), func(b *testing.B) {
				br := benchBroker(b, policy)
				go br.Run()
				body := make([]byte, 100)
				var next atomic.Int64
				var wg sync.WaitGroup
				b.ResetTimer()
				start := time.Now()
				for c := 0; c < 50; c++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						reqs := make([]AddRequest, pipeline)
						for i := range reqs {
							reqs[i] = AddRequest{Queue: "bench", Body: body, TTL: 86400, Retry: 300, Replicate: 1}
						}
						for next.Add(int64(pipeline)) <= int64(b.N) {
							for _, r := range br.AddJobs(reqs) {
								if r.Err != nil {
									b.Error(r.Err)
									return
								}
							}
						}
					}()
				}
				wg.Wait()
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "jobs/s")
				if testing.Verbose() {
					b.Logf("index after the run:\n%s", br.Store().IndexMetrics())
				}
			})
		}
	}
}

// BenchmarkGetAck is the consume path below RESP: 50 clients, each taking
// `pipeline` jobs with one GetJobs and acking them with one Ack, from a
// queue filled before the timer starts.
func BenchmarkGetAck(b *testing.B) {
	for _, policy := range []wal.SyncPolicy{wal.SyncNever, wal.SyncAlways} {
		for _, pipeline := range []int{1, 16} {
			b.Run(fmt.Sprintf("policy=%s/pipeline=%d", policy, pipeline), func(b *testing.B) {
				br := benchBroker(b, policy)
				go br.Run()
				body := make([]byte, 100)
				reqs := make([]AddRequest, 256)
				for i := range reqs {
					reqs[i] = AddRequest{Queue: "bench", Body: body, TTL: 86400, Retry: 300, Replicate: 1}
				}
				for n := 0; n < b.N; n += len(reqs) {
					br.AddJobs(reqs)
				}
				var next atomic.Int64
				var wg sync.WaitGroup
				b.ResetTimer()
				start := time.Now()
				for c := 0; c < 50; c++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						ids := make([]string, 0, pipeline)
						for next.Add(int64(pipeline)) <= int64(b.N) {
							jobs, err := br.GetJobs(context.Background(), GetRequest{Queues: []string{"bench"}, Count: pipeline, NoHang: true})
							if err != nil {
								b.Error(err)
								return
							}
							ids = ids[:0]
							for _, j := range jobs {
								ids = append(ids, j.ID)
							}
							if _, err := br.Ack(ids); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "jobs/s")
				if testing.Verbose() {
					b.Logf("index after the run:\n%s", br.Store().IndexMetrics())
				}
			})
		}
	}
}
