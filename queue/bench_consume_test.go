package queue

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/diskque/diskque/internal/cputime"
	"github.com/diskque/diskque/wal"
)

// BenchmarkConsume100: the vs-disque consume workload below RESP: b.N jobs
// queued, then 4 consumers GETJOB COUNT 100 + ACKJOB until empty.
func BenchmarkConsume100(b *testing.B) {
	br := benchBroker(b, wal.SyncNever)
	go br.Run()
	fillBench(br, b.N)
	b.ResetTimer()
	drainBench(b, br, 4, 100)
}

// BenchmarkGetAck1: the vs-disque getack1 workload below RESP: b.N jobs
// queued, then 50 consumers GETJOB COUNT 1 + ACKJOB one job at a time.
func BenchmarkGetAck1(b *testing.B) {
	br := benchBroker(b, wal.SyncNever)
	go br.Run()
	fillBench(br, b.N)
	gets0 := br.st.Stats().IndexGets
	b.ResetTimer()
	drainBench(b, br, 50, 1)
	b.ReportMetric(float64(br.st.Stats().IndexGets-gets0)/float64(b.N), "pebble-gets/job")
}

// fillBench queues at least n jobs of 100 bytes in queue "bench", 256 per
// AddJobs.
func fillBench(br *Broker, n int) {
	body := make([]byte, 100)
	reqs := make([]AddRequest, 256)
	for i := range reqs {
		reqs[i] = AddRequest{Queue: "bench", Body: body, TTL: 86400, Retry: 300, Replicate: 1}
	}
	for added := 0; added < n; added += len(reqs) {
		br.AddJobs(reqs)
	}
}

// drainBench runs conns consumers, each taking count jobs of queue "bench"
// with one GetJobs (NOHANG) and acking them with one Ack, until b.N jobs
// were asked for, and reports jobs/s and the process's cpu-µs/job.
func drainBench(b *testing.B, br *Broker, conns, count int) {
	var next atomic.Int64
	var wg sync.WaitGroup
	start, cpu0 := time.Now(), cputime.Used()
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids := make([]string, 0, count)
			for next.Add(int64(count)) <= int64(b.N+count-1) {
				jobs, err := br.GetJobs(context.Background(), GetRequest{Queues: []string{"bench"}, Count: count, NoHang: true})
				if err != nil || len(jobs) == 0 {
					b.Error(len(jobs), err)
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
	b.ReportMetric(float64((cputime.Used()-cpu0).Microseconds())/float64(b.N), "cpu-µs/job")
	// The write buffer's flushes per 1,000 jobs: the fewer, the more jobs
	// live and die within one buffer, costing Pebble nothing.
	b.ReportMetric(float64(br.st.Stats().WriteBufferFlushes)*1000/float64(b.N), "buf-flushes/kjob")
}

// BenchmarkMixed100: the vs-disque mixed workload below RESP: 8 producers
// adding 16 at a time and 4 consumers GETJOB COUNT 100 (blocking) + ACKJOB
// at once, b.N jobs through.
func BenchmarkMixed100(b *testing.B) {
	br := benchBroker(b, wal.SyncNever)
	go br.Run()
	body := make([]byte, 100)
	var added, got atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start, cpu0 := time.Now(), cputime.Used()
	for p := 0; p < 8; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reqs := make([]AddRequest, 16)
			for i := range reqs {
				reqs[i] = AddRequest{Queue: "bench", Body: body, TTL: 86400, Retry: 300, Replicate: 1}
			}
			for added.Add(16) <= int64(b.N)+15 {
				br.AddJobs(reqs)
			}
		}()
	}
	for c := 0; c < 4; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids := make([]string, 0, 100)
			for got.Load() < int64(b.N) {
				jobs, _ := br.GetJobs(context.Background(), GetRequest{Queues: []string{"bench"}, Count: 100, Timeout: 50 * time.Millisecond})
				ids = ids[:0]
				for _, j := range jobs {
					ids = append(ids, j.ID)
				}
				if len(ids) > 0 {
					br.Ack(ids)
					got.Add(int64(len(ids)))
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "jobs/s")
	b.ReportMetric(float64((cputime.Used()-cpu0).Microseconds())/float64(b.N), "cpu-µs/job")
	// The write buffer's flushes per 1,000 jobs: the fewer, the more jobs
	// live and die within one buffer, costing Pebble nothing.
	b.ReportMetric(float64(br.st.Stats().WriteBufferFlushes)*1000/float64(b.N), "buf-flushes/kjob")
}
